"""dlscope's own cost per step, measured in the observed process at attach, on the code path a real
step takes: a tiny real training step (a Linear module's forward, `backward()`, an optimizer's
`step`), run bare and through the hooks, in interleaved bursts. The hooked bursts go through a
scratch observer (the same class, with the same hooks registered the same way — the module's
timed call found on a first step, the timed `torch.autograd.backward`, the optimizer class's timed
`step` — its records and live status file in a temporary directory), so the figure holds everything torch
does to reach the hooks, the step machine, the step's row and the live file's update.

Recorded as {"k": "calibration", "per_step_us", "loader_us", "steps"}: `per_step_us` is the
hooked step's time minus the bare step's (the median over ROUNDS pairs of bursts run back to
back, in the thread's CPU time); `loader_us` the cost of the timed DataLoader `__next__` per batch (a batch drawn from a
DataLoader pays it on top), measured alike on a trivial `__next__`. The report takes
`per_step_us` out of every share and shows it. Submodules cost nothing (one Python frame each
when they share the class of a module called at top level): only those are timed, so a one-module
step measures what a large model pays (the global hooks' calls on a first step, and on the step
after a new optimizer or a `train()`/`eval()` that changes a mode, aside).
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

from dlscope.contract.records import SCRATCH_PREFIX

STEPS = 32  # per burst: short, so that a burst seldom spans a wait for a core
ROUNDS = 15  # pairs of bare and hooked bursts, interleaved: ~0.15 s in all on an idle 2-vCPU machine


def per_step_us(observer_class: type, torch: Any) -> tuple[float, float]:
    """(the hooks' cost per training step, the timed loader's cost per batch), in µs."""
    from dlscope.contract.live import LiveStatus
    from dlscope.injob.recorder import RecordFile

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the step's kernels as short and steady as they go: the hooks are Python
    try:
        with torch.random.fork_rng(devices=[]):  # the script's random numbers as if not calibrated
            model = torch.nn.Linear(4, 2)
            optimizer = _Optimizer()
            x = torch.zeros(2, 4)

            def step() -> None:
                model.zero_grad()
                model(x).sum().backward()
                optimizer.step()

            def plain_next(_: Any) -> None:
                return None

            with tempfile.TemporaryDirectory(prefix=SCRATCH_PREFIX) as scratch:
                observer = observer_class(RecordFile(scratch), (1, 0, 0, 0))  # profiler off
                observer.torch, observer.is_compiling = torch, torch.compiler.is_compiling
                observer.machine.marker = None  # no phase markers: the I/O tracers must not see these steps
                live = LiveStatus(scratch, None)
                observer.machine.on_step = live.step_ended  # a live file of its own, updated alike
                timed_next = observer.timed_loader_next(plain_next)
                bare, hooked, loader_bare, loader_hooked = [], [], [], []
                try:
                    step()  # first-call work (lazy init) out of the bursts
                    for _ in range(ROUNDS):
                        bare.append(_burst(step))
                        remove = observer.step_hooks(torch)
                        observer.time_optimizer(type(optimizer))  # as its first instance does in a job
                        try:
                            step()  # the module called at top level found (a job's first step), untimed
                            hooked.append(_burst(step))
                        finally:
                            remove()
                        loader_bare.append(_burst(lambda: plain_next(None)))
                        loader_hooked.append(_burst(lambda: timed_next(None)))
                finally:
                    observer.records.close_steps()
                    live.map.close()  # type: ignore[union-attr]
                    for fd in (observer.records.fd, *observer.memory_files):
                        if fd is not None:
                            os.close(fd)
    finally:
        torch.set_num_threads(threads)
    return _paired_cost(hooked, bare), _paired_cost(loader_hooked, loader_bare)


class _Optimizer:
    """The calibration's optimizer: its class's `step` is timed as a torch optimizer's is, and
    does nothing. Not a torch one: torch imports torch._dynamo (1–2 s) at a torch optimizer's
    creation, which a script without one (a hand-written update, Keras) would pay for this alone.
    The step's own work is the same in the bare and the hooked bursts, so what it is does not
    change the difference."""

    def step(self, closure: Callable[[], Any] | None = None) -> None:
        return None


def _paired_cost(hooked: list[float], bare: list[float]) -> float:
    """The median of the pairs' differences: each pair ran back to back, under the same load."""
    return max(statistics.median(h - b for h, b in zip(hooked, bare, strict=True)), 0.0)


def _burst(call: Callable[[], Any]) -> float:
    """µs per call over STEPS calls, in this thread's CPU time: on a busy machine the wall time
    holds the waits for a core, which no cost of dlscope's is (on an idle one the two agree)."""
    start = time.thread_time()
    for _ in range(STEPS):
        call()
    return (time.thread_time() - start) / STEPS * 1e6


def record(observer: Any, torch: Any) -> None:
    """Calibrate and write the figures to the observer's own records; a calibration that fails
    is recorded as an error (the report then says the shares include dlscope's cost) and the
    hooks attach all the same."""
    try:
        step_us, loader_us = per_step_us(type(observer), torch)
    except Exception as e:  # a torch this tiny step cannot run on: observe it uncalibrated
        observer.records.write({"k": "error", "where": "calibration", "error": f"{type(e).__name__}: {e}"})
        return
    observer.records.write(
        {"k": "calibration", "per_step_us": round(step_us, 2), "loader_us": round(loader_us, 2), "steps": STEPS}
    )
