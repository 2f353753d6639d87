"""Whether the machine was shared while the steps ran: the intervals the supervising process read
(supervise/cpushare.py, MACHINE_FILE) in, facts out. Stateless; no torch.

Over the intervals that overlap the steps (each weighted by its overlap), on the C cores the job
may run on:
    others      the cores' busy time less the job's and dlscope's own: what the machine's other
                processes (and a hypervisor's other guests: steal) took, in cores
    free        C − others: the cores left to the job
    waited      the share of its threads' runnable time they spent waiting for a core
The machine was shared when others took MATERIAL_PCT of the cores or more, or when the job's
intra-op threads outnumbered the cores others left it (an OpenMP thread that waits for a core
stalls every thread of its parallel region: the region ends when its last thread does) and its
threads did wait for one, WAITED_PCT of their runnable time or more, while others took
MIN_OTHERS_CORES or more (below that, the waits are the job's own: its threads beside its other
processes', a daemon's wake-up). Why a quarter: two busy loops beside a job of 2 threads on 2
cores take half of them or more (each runnable thread gets its share of a core), while a quiet
machine's others are its daemons — the load average of 1.5–2 a CI box shows while a test runs is
that test's own job and pytest, which is dlscope's own process when the test runs it in-process.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dlscope.contract.records import MACHINE_COLUMNS, MACHINE_FILE

MATERIAL_PCT = 25.0  # of the job's cores' time taken by other processes: a shared machine
WAITED_PCT = 10.0  # of its threads' runnable time spent waiting for a core: threads that outnumber the cores
MIN_OTHERS_CORES = 0.25  # others took less (in cores): the job's waits are its own


def read_machine(directory: Path) -> dict[str, Any] | None:
    """MACHINE_FILE as written (None: absent, as in a run by an older dlscope)."""
    try:
        data = json.loads((directory / MACHINE_FILE).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("columns") == list(MACHINE_COLUMNS) else None


def machine_share(data: dict[str, Any] | None, span: tuple[float, float] | None, threads: int | None) -> dict | None:
    """The facts over the steps' `span` (start, end; CLOCK_REALTIME s); `threads`: the intra-op
    threads of the job's processes that trained at once. None: nothing read over the span."""
    if data is None or span is None or not data["cores"]:
        return None
    begin, end = span
    totals = dict.fromkeys(MACHINE_COLUMNS[1:-1], 0.0)
    threads_ran = weight = 0.0
    for row in data["rows"]:
        values = dict(zip(MACHINE_COLUMNS, row, strict=True))
        start = values["end"] - values["seconds"]
        overlap = min(values["end"], end) - max(start, begin)
        if overlap <= 0 or values["seconds"] <= 0:
            continue
        share = overlap / values["seconds"]
        for key in totals:
            totals[key] += share * values[key]
        threads_ran += overlap * values["threads_ran"]
        weight += overlap
    seconds, cores = totals["seconds"], len(data["cores"])
    if seconds <= 0:
        return None
    others = max(totals["busy_s"] - totals["job_s"] - totals["dlscope_s"], 0.0) / seconds
    runnable = totals["ran_s"] + totals["waited_s"]
    facts: dict[str, Any] = {
        "cores": cores,
        "seconds": round(seconds, 2),
        "job_cores": round(totals["job_s"] / seconds, 2),
        "dlscope_cores": round(totals["dlscope_s"] / seconds, 3),
        "others_cores": round(others, 2),
        "others_pct": round(100 * others / cores, 1),
        "free_cores": round(cores - others, 2),
        "threads": threads,
        "threads_ran": round(threads_ran / weight, 1) if weight else None,
        "waited_pct": round(100 * totals["waited_s"] / runnable, 1) if runnable > 0 else None,
        "thresholds": {"material_pct": MATERIAL_PCT, "waited_pct": WAITED_PCT, "min_others_cores": MIN_OTHERS_CORES},
    }
    waited = facts["waited_pct"] is not None and facts["waited_pct"] >= WAITED_PCT
    outnumber = threads is not None and threads > cores - others
    crowded = outnumber and waited and others >= MIN_OTHERS_CORES
    facts["threads_outnumber"] = crowded
    facts["shared"] = facts["others_pct"] >= MATERIAL_PCT or crowded
    return facts


def qualifier(facts: dict[str, Any] | None) -> dict[str, Any] | None:
    """What a verdict that rests on timing carries when the machine was shared (None: it was not)."""
    if not facts or not facts["shared"]:
        return None
    return {k: facts[k] for k in ("others_pct", "others_cores", "cores", "waited_pct")}
