"""The batch x-ray's own cost, measured in the training process as it exits (after its last
batch, and only where a DataLoader was iterated): the x-ray's path for one batch — the timed
fetcher, the built record, the single-process iterator's wrapper, the "taken" record — run on a
stub batch of the run's batch size (a list's items, an identity collate) against the same
batch fetched bare, in interleaved bursts, in this thread's CPU time (as calibrate.py measures
the hooks' cost per step). Twice: samples timed one by one and not, so the cost splits into a
part per batch and a part per timed sample. The records go to a scratch file that is never
written. Stdlib only.

A worker pays the built side of the same path and the training process the taken side: the
figure for num_workers=0, where one process pays both, is the sum a batch costs in all.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

BURST = 16  # batches per burst: short, so that a burst seldom spans a wait for a core
ROUNDS = 15  # bursts of each kind, interleaved: ~10 ms in all for a batch of 64


def measure(recorder_class: type, file_class: type, as_method: Callable, wrap: Callable, samples: int) -> dict:
    """{"batch_us", "sample_ns", "samples"}: the x-ray's CPU cost per batch of `samples` samples
    (none timed one by one) and per sample timed one by one."""
    samples = max(int(samples), 1)
    items, index = list(range(samples)), list(range(samples))
    fetcher = SimpleNamespace(dataset=items, auto_collation=True, collate_fn=_same, drop_last=False)
    scratch = recorder_class("")
    scratch.file = file_class("")
    # the buffer emptied instead of written: the write's own cost is the lock and the append, its
    # write(2) comes once per 64 KiB
    scratch.file._flush = lambda: setattr(scratch.file, "buffer", bytearray())
    fetch = as_method(_same, scratch.fetch_map)  # (the original it stands for: any function)
    recorded_next = wrap(lambda iterator: fetch(fetcher, index), scratch.single_next)
    iterator = SimpleNamespace()

    def bare() -> None:
        fetcher.collate_fn([items[i] for i in index])

    def recorded(timed: bool) -> Callable[[], None]:
        def one() -> None:
            scratch.time_samples = timed
            recorded_next(iterator)
            scratch.delivered(iterator, 0.0, 0.0)

        return one

    kinds = {"bare": bare, "untimed": recorded(False), "timed": recorded(True)}
    spent: dict[str, list[float]] = {kind: [] for kind in kinds}
    for _ in range(ROUNDS):
        for kind, call in kinds.items():
            spent[kind].append(_burst(call))
    untimed = _paired(spent["untimed"], spent["bare"])
    timed = _paired(spent["timed"], spent["untimed"])
    return {"batch_us": round(untimed, 2), "sample_ns": round(1e3 * timed / samples, 1), "samples": samples}


def _same(batch: Any) -> Any:
    return batch


def _paired(a: list[float], b: list[float]) -> float:
    """The median of the rounds' differences (each pair ran back to back, under the same load)."""
    return max(statistics.median(x - y for x, y in zip(a, b, strict=True)), 0.0)


def _burst(call: Callable[[], None]) -> float:
    """µs per call over BURST calls, in this thread's CPU time."""
    start = time.thread_time()
    for _ in range(BURST):
        call()
    return (time.thread_time() - start) / BURST * 1e6
