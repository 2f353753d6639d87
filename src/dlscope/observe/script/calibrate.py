"""dlscope's own cost per step, measured in the observed process at attach: a scratch observer
(the same class, its records in a temporary directory) is driven through the hook path of
CALIBRATION_STEPS synthetic steps — a batch from a loader, one module's forward, a backward, an
optimizer step, the step's end with its memory peak and its row written — and the median of
`ROUNDS` bursts is recorded as {"k": "calibration", "per_step_us": ...}. The report takes that cost
out of every share and shows it. A model with many modules pays a little more per extra module
call (the global forward hooks return at once below the outermost one); not counted here."""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from typing import Any

CALIBRATION_STEPS = 200
ROUNDS = 5
SCRATCH_PREFIX = "dlscope-calibrate-"  # its records go to a scratch directory: dlscope's own files, not the job's


class _Module:
    training = True


def _identity(*args: Any, **kwargs: Any) -> None:
    return None


def per_step_us(observer_class: type, torch: Any) -> float:
    """The hook path's wall time per synthetic step (µs), median of ROUNDS bursts."""
    from dlscope.observe.script.records import RecordFile

    module = _Module()
    with tempfile.TemporaryDirectory(prefix=SCRATCH_PREFIX) as scratch:
        observer = observer_class(RecordFile(scratch), (1, 0, 0, 0))  # profiler off
        observer.torch = torch
        observer.machine.on_step = None  # the synthetic steps stay out of the live status file
        bursts = []
        for _ in range(ROUNDS):
            start = time.perf_counter()
            for _ in range(CALIBRATION_STEPS):
                observer.loader_next(_identity, None)
                observer.forward_pre(module, ())
                observer.forward_post(module, (), None)
                observer.backward(_identity)
                observer.optimizer_pre(None, (), {})
                observer.optimizer_post(None, (), {})
            bursts.append((time.perf_counter() - start) / CALIBRATION_STEPS)
        for fd in (observer.records.fd, observer.records.steps_fd, *observer.memory_files):
            if fd is not None:
                os.close(fd)
    return statistics.median(bursts) * 1e6


def record(observer: Any, torch: Any) -> None:
    """Calibrate and write the figure to the observer's own records."""
    cost = per_step_us(type(observer), torch)
    observer.records.write({"k": "calibration", "per_step_us": round(cost, 2), "steps": CALIBRATION_STEPS})
