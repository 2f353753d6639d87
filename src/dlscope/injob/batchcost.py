"""The batch x-ray's own cost, measured in the training process as it exits (after its last
batch, and only where a DataLoader was iterated): the x-ray's path for one batch with
num_workers=0 — the timed fetcher, then the built and "taken" records written as the loader hook
hands the batch on — run on a stub batch of the run's batch size (a list's items, an identity
collate) against the same batch fetched bare by torch's fetch (its code), in interleaved bursts, in
this thread's CPU time (as calibrate.py measures the hooks' cost per step). Twice: samples timed
one by one and not, so the cost splits into a part per batch and a part per timed sample. The
records go to a scratch file that is never written. Stdlib only.

With workers, a worker pays the built side of the same path (its samples timed one by one by
its own rule: WORKER_SAMPLE_TIMING_MIN_S in batches.py) and the training process the taken side (~1.3
µs a batch on a quiet AVX-512 2-vCPU host, 2–4 µs on a slower or busy one: benchmarks/batch_xray.py);
with num_workers=0 one process pays both: this figure. It is a lower bound: inside the loop the
dataset's work evicts the x-ray's code and data from the caches between two batches (3–5 µs there
against < 0.1 µs here for 64 tensors sliced from memory: BENCHMARKS.md).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

BURST = 16  # batches per burst: short, so that a burst seldom spans a wait for a core
ROUNDS = 15  # bursts of each kind, interleaved: ~10 ms in all for a batch of 64


def measure(recorder_class: type, samples: int) -> dict:
    """{"batch_us", "sample_ns", "samples"}: the x-ray's CPU cost per batch of `samples` samples
    (none timed one by one) and per sample timed one by one; `recorder_class` is
    batches.BatchRecorder (passed in: batches imports this module)."""
    samples = max(int(samples), 1)
    items, index = list(range(samples)), list(range(samples))
    fetcher = SimpleNamespace(dataset=items, auto_collation=True, collate_fn=_same, drop_last=False)
    # a scratch file: records dropped instead of written (a write(2) comes once per FLUSH_BYTES)
    scratch = recorder_class(None)
    fetch = scratch.map_fetcher(_torch_fetch)
    iterator = SimpleNamespace()

    def bare() -> None:
        _torch_fetch(fetcher, index)

    def recorded(timed: bool) -> Callable[[], None]:
        def one() -> None:
            scratch.time_samples = timed
            fetch(fetcher, index)
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


def _torch_fetch(fetcher: Any, possibly_batched_index: Any) -> Any:
    """torch's `_MapDatasetFetcher.fetch` (torch.utils.data._utils.fetch), as it runs bare."""
    if fetcher.auto_collation:
        if hasattr(fetcher.dataset, "__getitems__") and fetcher.dataset.__getitems__:
            data = fetcher.dataset.__getitems__(possibly_batched_index)
        else:
            data = [fetcher.dataset[idx] for idx in possibly_batched_index]
    else:
        data = fetcher.dataset[possibly_batched_index]
    return fetcher.collate_fn(data)


def _paired(a: list[float], b: list[float]) -> float:
    """The median of the rounds' differences (each pair ran back to back, under the same load)."""
    return max(statistics.median(x - y for x, y in zip(a, b, strict=True)), 0.0)


def _burst(call: Callable[[], None]) -> float:
    """µs per call over BURST calls, in this thread's CPU time."""
    start = time.thread_time()
    for _ in range(BURST):
        call()
    return (time.thread_time() - start) / BURST * 1e6
