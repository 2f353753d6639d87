"""The one step timer: wall time of real steps, with configurations interleaved.

On a shared machine a neighbour's burst slows whatever runs at that moment. Timing every
configuration in turn, round after round, spreads the burst over all of them, so their medians
and ratios stay comparable even when absolute times do not:

    start:   each contender's cold first step (timed on its own), then its warm-up steps
    rounds:  for round in 1..R: for each contender: time its share of the N steps
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field

import torch


class StepTimer:
    """Wall time of one step: CUDA events around it on a GPU (read after a sync), perf_counter on CPU."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def time_steps(self, step: Callable[[], object], n: int) -> list[float]:
        """Seconds for each of `n` calls of `step`, each bracketed by its own synchronisation."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            pairs = []
            for _ in range(n):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                step()
                end.record()
                pairs.append((start, end))
            torch.cuda.synchronize(self.device)
            return [s.elapsed_time(e) / 1000 for s, e in pairs]
        seconds = []
        for _ in range(n):
            start = time.perf_counter()
            step()
            seconds.append(time.perf_counter() - start)
        return seconds


@dataclass
class Contender:
    """One configuration to time: its step, and the settings it runs under (threads, backends…)."""

    name: str
    step: Callable[[], object]
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    settings: Callable[[], AbstractContextManager] = nullcontext
    cold_s: float = 0.0
    times: list[float] = field(default_factory=list)

    @property
    def median_s(self) -> float:
        return statistics.median(self.times)

    def start(self, warmup: int) -> None:
        timer = StepTimer(self.device)
        with self.settings():
            self.cold_s = timer.time_steps(self.step, 1)[0]
            timer.time_steps(self.step, warmup)

    def time(self, n: int) -> None:
        with self.settings():
            self.times += StepTimer(self.device).time_steps(self.step, n)


def round_sizes(steps: int, rounds: int) -> list[int]:
    """`steps` split into `rounds` near-equal shares (the first ones take the remainder)."""
    return [steps // rounds + (i < steps % rounds) for i in range(rounds)]


def time_interleaved(
    contenders: Sequence[Contender],
    steps: int,
    rounds: int,
    warmup: int = 1,
    on_start: Callable[[Contender], None] | None = None,
    on_round: Callable[[int], None] | None = None,
) -> None:
    """Start every contender, then time `steps` steps of each in `rounds` interleaved rounds.

    Fills each contender's `cold_s` and `times`; `on_start(contender)` and `on_round(i)` are
    called before each unit of work (progress).
    """
    for contender in contenders:
        if on_start is not None:
            on_start(contender)
        contender.start(warmup)
    for i, n in enumerate(round_sizes(steps, min(rounds, steps))):
        if on_round is not None:
            on_round(i)
        for contender in contenders:
            contender.time(n)
