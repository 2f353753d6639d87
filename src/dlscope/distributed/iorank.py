"""`--trace-io` of a torchrun job: the traced file I/O attributed to ranks, phase by phase.

The workers write their pids (one line per torchrun attempt) to their rank folder's pid file;
every event of those processes is that rank's, its phase markers included (a rank's start-up, before its first
marker, is its imports)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dlscope.analysis.syscalls import Analysis
from dlscope.rundir import rank_files

PID_FILE = "pid"


def rank_pids(run: Path) -> dict[int, int]:
    """pid → rank, for every worker process of the run's job (restarts included)."""
    pids = {}
    for rank, pid_file in rank_files(run, PID_FILE).items():
        pids.update({int(line): rank for line in pid_file.read_text().split()})
    return pids


def io_per_rank(events: Path, pids: dict[int, int]) -> list[dict[str, Any]]:
    """Each rank's reads and writes per phase, and by kind of file (dataset, checkpoint, …)."""
    analyses = {rank: Analysis() for rank in sorted(set(pids.values()))}
    with events.open() as lines:
        for line in lines:
            event = json.loads(line)
            rank = pids.get(event["pid"])
            if rank is not None:
                analyses[rank].add(event)
    rows = []
    for rank, analysis in analyses.items():
        analysis.finish()
        summary = analysis.summary()
        rows.append(
            {
                "rank": rank,
                "pids": sorted(pid for pid, r in pids.items() if r == rank),
                "phases": [
                    {k: p[k] for k in ("phase", "calls", "bytes_read", "bytes_written")}
                    for p in summary["phases"]
                    if p["calls"]
                ],
                "categories": summary["categories"],
            }
        )
    return rows
