"""`dlscope watch`: what a job running under `dlscope run` does now, read from outside — the job
pays nothing for it. Each view reads the live status files (contract/live.py), the newest rows of
the main process's step file (a bounded tail: `recent` rows, whatever the run's length), the tail
of its records (the last checkpoint) and the watchdog's hang captures. Facts only; the words
are in report/sections/watch.py.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from dlscope.analysis import steptable
from dlscope.analysis.stepfile import StepFile
from dlscope.contract.live import LiveView, read_all
from dlscope.contract.records import records_path, steps_path
from dlscope.measure.stats import percentile
from dlscope.supervise.attach import run_status
from dlscope.supervise.capture import alive

RECORDS_TAIL_BYTES = 64 << 10  # of a process's records: where its last checkpoint phase is
SLOWEST = 3  # of the recent steps, named with their step numbers
STALLED_FACTOR = 5.0  # no step for this many median steps (and a second) reads as stalled


def snapshot(directory: Path, recent: int) -> dict[str, Any]:
    """The job in `directory` (a run's processes/) now."""
    now = time.time()
    views = read_all(directory)
    running = [v for v in views if alive(v.pid) and not v.exited]
    status = run_status(directory.parent)
    processes = [_process(v, now, v in running) for v in views]
    main = max((v for v in views if not v.loader_worker), key=lambda v: (v.steps, -v.started), default=None)
    tail = _recent_steps(Path(steps_path(directory, main.pid)), recent) if main is not None and main.steps else None
    newest = max((v.last_step_end for v in views if v.last_step_end), default=None)
    return {
        "run_dir": str(directory.parent),
        "time": now,
        "started": min((v.started for v in views), default=now),
        "ended": not running or status is not None,
        "status": status or ("running" if running else "ended"),
        "main_pid": main.pid if main is not None else None,
        "steps": main.steps if main is not None else 0,
        "recent": tail,
        "checkpoint": _last_checkpoint(directory, [v.pid for v in views if not v.loader_worker]),
        "hang": _hang(directory.parent, newest, now, tail),
        "processes": processes,
    }


def _process(v: LiveView, now: float, running: bool) -> dict[str, Any]:
    return {
        "pid": v.pid,
        "rank": v.rank,
        "worker": v.loader_worker,
        "running": running,
        "steps": v.steps,
        "last_step_ago_s": round(now - v.last_step_end, 3) if v.last_step_end else None,
        "phase": v.phase,
        "phase_for_s": round(now - v.phase_since, 3) if v.phase else None,
        "collectives_waiting": v.collectives_entered - v.collectives_finished,
        "last_collective": v.last_collective,
    }


def _recent_steps(path: Path, recent: int) -> dict[str, Any] | None:
    """The newest `recent` steps of the main stream: rate, percentiles, mean anatomy (ms a step)."""
    try:
        steps = StepFile(path)
    except (OSError, ValueError):
        return None
    take = min(steps.count, 2 * recent)  # both streams are recorded until an optimizer steps
    if not take:
        return None
    table = np.fromfile(
        steps.path, steps.dtype, take, offset=steps.offset + (steps.count - take) * steps.dtype.itemsize
    )
    optimizer = table["src"] == steps.codes["src"].index("optimizer")
    table = (table[optimizer] if optimizer.any() else table)[-recent:]
    seconds = table["seconds"].astype(np.float64)
    span = float(table["start"][-1]) + float(seconds[-1]) - float(table["start"][0])
    loader = steps.codes["data_source"].index("loader")
    parts = steptable.part_seconds(table, loader)
    p50, p90, p99 = (percentile(seconds.tolist(), q) for q in (50, 90, 99))
    slowest = np.argsort(seconds)[::-1][:SLOWEST]
    return {
        "count": len(table),
        "first": int(table["i"][0]),
        "last": int(table["i"][-1]),
        "per_second": round(len(table) / span, 3) if span > 0 else None,
        "p50_ms": round(float(p50) * 1e3, 3),
        "p90_ms": round(float(p90) * 1e3, 3),
        "p99_ms": round(float(p99) * 1e3, 3),
        "max_ms": round(float(seconds[slowest[0]]) * 1e3, 3),
        "slowest": [{"step": int(table["i"][k]), "ms": round(float(seconds[k]) * 1e3, 3)} for k in slowest],
        "mean_ms": {p: round(float(v.mean()) * 1e3, 4) for p, v in parts.items()},
        "data_source": "loader" if bool((table["data_source"] == loader).any()) else "none",
        "profiling": steps.codes["profiled"][int(table["profiled"][-1])],
    }


def _last_checkpoint(directory: Path, pids: list[int]) -> dict[str, Any] | None:
    """The newest checkpoint phase that ended in any process (its files, seconds, when)."""
    found = None
    for pid in pids:
        begun: dict[str, Any] | None = None
        for record in _tail_records(Path(records_path(directory, pid))):
            name = record.get("name", "")
            if not name.startswith("checkpoint_"):
                continue
            if record.get("k") == "B":
                begun = record
            elif record.get("k") == "E" and begun is not None and (found is None or record["ts"] > found["end"]):
                files = record.get("files") or ([begun["file"]] if begun.get("file") else [])
                found = {"kind": name, "files": files, "seconds": record["ts"] - begun["ts"], "end": record["ts"]}
    return found


def _tail_records(path: Path) -> list[dict[str, Any]]:
    try:
        with open(path, "rb") as f:
            size = f.seek(0, 2)
            f.seek(max(size - RECORDS_TAIL_BYTES, 0))
            data = f.read()
    except OSError:
        return []
    lines = data.split(b"\n")
    if len(data) == RECORDS_TAIL_BYTES:
        lines = lines[1:]  # the first line is cut
    records = []
    for line in lines:
        try:
            records.append(json.loads(line))
        except ValueError:
            continue
    return records


def _hang(run_dir: Path, newest: float | None, now: float, tail: dict[str, Any] | None) -> dict[str, Any]:
    """How long since any step ended, against the recent median step; the watchdog's captures."""
    captures = sorted(run_dir.glob("hang-*.json"), key=lambda p: p.stat().st_mtime)
    idle = round(now - newest, 3) if newest is not None else None
    median_s = tail["p50_ms"] / 1e3 if tail else None
    state = "no_steps" if idle is None else "flowing"
    if idle is not None and median_s is not None and idle > STALLED_FACTOR * median_s + 1.0:
        state = "stalled"
    if captures and newest is not None and captures[-1].stat().st_mtime > newest:
        state = "captured"
    return {"state": state, "idle_s": idle, "captures": [p.name for p in captures]}
