"""The one step timer: wall time of real steps, with configurations interleaved.

On a shared machine a neighbour's burst slows whatever runs at that moment. Timing every
configuration in turn, round after round, spreads the burst over all of them, so their medians
and ratios stay comparable even when absolute times do not:

    start:   each contender's cold first step (timed on its own)
    warm-up: each contender's warm-up steps, one contender after the other (timed, not counted)
    rounds:  for round in 1..R: for each contender still running: time its share of the N steps

Sequential elimination (`drop_above`): after each round, a contender whose median so far is more
than `drop_above` times the fastest one's stops being timed; after the warm-up, whose one step is
weaker evidence than a median (a neighbour's burst can double it), more than `drop_above`². A candidate
twice as slow needs no more steps to be told apart; every step it skips is time saved when the
steps are costly (the autotuner's are real training steps at the slower candidate's pace).
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

    def now(self) -> float:
        """The clock the steps are timed on, in seconds (after the device's queued work is done)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

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
    timer: StepTimer | None = None  # None: a StepTimer on `device`
    cold_s: float = 0.0
    warm_times: list[float] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    dropped_after: int | None = None  # the round (0: the warm-up) after which elimination stopped it

    @property
    def median_s(self) -> float:
        """Of the timed steps; of the warm-up steps for a contender dropped before any round."""
        return statistics.median(self.times or self.warm_times)

    @property
    def steps(self) -> int:
        """Every step it ran: the cold one, the warm-up and the timed ones."""
        return 1 + len(self.warm_times) + len(self.times)

    def _timer(self) -> StepTimer:
        return self.timer or StepTimer(self.device)

    def start(self) -> None:
        with self.settings():
            self.cold_s = self._timer().time_steps(self.step, 1)[0]

    def warm(self, n: int) -> None:
        with self.settings():
            self.warm_times += self._timer().time_steps(self.step, n)

    def time(self, n: int) -> None:
        with self.settings():
            self.times += self._timer().time_steps(self.step, n)


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
    drop_above: float | None = None,
) -> None:
    """Start every contender, warm each up, then time `steps` steps of each in `rounds` interleaved rounds.

    Fills each contender's `cold_s`, `warm_times` and `times`; `on_start(contender)` and
    `on_round(i)` are called before each unit of work (progress). With `drop_above`, clearly
    slower contenders stop early (see the module's docstring) and say when in `dropped_after`.
    """
    for contender in contenders:
        if on_start is not None:
            on_start(contender)
        contender.start()
    for contender in contenders:  # after every cold step, so that elimination compares like with like
        contender.warm(warmup)
    running = list(contenders)
    for i, n in enumerate(round_sizes(steps, min(rounds, steps))):
        if drop_above is not None and (warmup or i):
            running = eliminate(running, drop_above ** (1 if i else 2), i)
        if on_round is not None:
            on_round(i)
        for contender in running:
            contender.time(n)


def eliminate(running: list[Contender], drop_above: float, after_round: int) -> list[Contender]:
    """The contenders whose median is within `drop_above` times the fastest; the others are marked dropped."""
    fastest = min(c.median_s for c in running)
    for contender in running:
        if contender.median_s > drop_above * fastest:
            contender.dropped_after = after_round
    return [c for c in running if c.dropped_after is None]
