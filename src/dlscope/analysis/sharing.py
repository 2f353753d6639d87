"""Processes that train at once on one machine (hogwild, A3C, an mp.spawn job without torchrun's
OMP_NUM_THREADS=1): how many, with how many intra-op threads each against the cores they may run
on, and the training process's step time beside the others' and alone. Steps in, facts out.

A process trains from its first counted step's start to its last one's end (its span); a step of
the training process is "shared" where its middle falls inside another process's span, else
"alone". The thread counts are each process's torch.get_num_threads() after its last
torch.set_num_threads (or at torch's import); a forked child that set none has its parent's."""

from __future__ import annotations

from typing import Any

import numpy as np

MIN_STEPS = 10  # a process with fewer counted steps is not training beside the others (a probe, an eval)
MIN_COMPARED = 5  # steps on each side before their medians are compared


def sharing(
    steps: dict[int, np.ndarray], main: int, threads: dict[int, dict[str, int]], parents: dict[int, int | None]
) -> dict[str, Any] | None:
    """`steps`: each process's counted steps (a table with `start` and `seconds`); `threads`: the
    torch_threads record of each process that wrote one; `parents`: each process's parent pid.
    None where no other process trained while `main` did."""
    spans = {
        pid: (float(table["start"][0]), float(table["start"][-1] + table["seconds"][-1]))
        for pid, table in steps.items()
        if len(table) >= MIN_STEPS
    }
    if main not in spans:
        return None
    begin, end = spans[main]
    beside = sorted(pid for pid, (b, e) in spans.items() if pid != main and b < end and e > begin)
    if not beside:
        return None
    table = steps[main]
    middle = table["start"] + table["seconds"] / 2.0
    shared = np.zeros(len(table), dtype=bool)
    for pid in beside:
        b, e = spans[pid]
        shared |= (middle >= b) & (middle <= e)
    seconds = np.asarray(table["seconds"], dtype=np.float64)

    def median_ms(chosen: np.ndarray) -> float | None:
        return round(float(np.median(seconds[chosen])) * 1e3, 3) if np.count_nonzero(chosen) >= MIN_COMPARED else None

    pids = [main, *beside]
    counts = {pid: threads_of(pid, threads, parents) for pid in pids}
    known = [c for c in counts.values() if c is not None]
    return {
        "pids": pids,
        "threads": {str(pid): (c["threads"] if c else None) for pid, c in counts.items()},
        "threads_total": sum(c["threads"] for c in known) if len(known) == len(pids) else None,
        "cores": counts[main]["cores"] if counts[main] else None,
        "shared_steps": int(np.count_nonzero(shared)),
        "alone_steps": int(np.count_nonzero(~shared)),
        "shared_ms": median_ms(shared),
        "alone_ms": median_ms(~shared),
    }


def threads_of(pid: int, threads: dict[int, dict[str, int]], parents: dict[int, int | None]) -> dict[str, int] | None:
    """The process's torch_threads record, else its nearest ancestor's (a forked child that set none)."""
    seen: set[int] = set()
    at: int | None = pid
    while at is not None and at not in seen:
        if at in threads:
            return threads[at]
        seen.add(at)
        at = parents.get(at)
    return None
