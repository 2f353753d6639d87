"""The one step timer: cold step apart, warm-up untimed, rounds interleaved, settings per contender."""

from __future__ import annotations

import contextlib
import statistics

import pytest
import torch

from dlscope.measure.stats import percentile
from dlscope.measure.timing import Contender, StepTimer, round_sizes, time_interleaved


def test_rounds_interleave_contenders_and_time_every_step():
    calls: list[str] = []
    contenders = [Contender(name, lambda name=name: calls.append(name)) for name in ("a", "b")]
    time_interleaved(contenders, steps=5, rounds=2, warmup=2)
    # each: 1 cold step, then each 2 warm-up steps; then rounds of 3 and 2 steps
    assert calls == ["a", "b"] + ["a"] * 2 + ["b"] * 2 + ["a"] * 3 + ["b"] * 3 + ["a"] * 2 + ["b"] * 2
    for contender in contenders:
        assert len(contender.times) == 5 and contender.cold_s > 0


def test_round_sizes_cover_the_steps():
    for steps, rounds in [(5, 2), (20, 3), (3, 3), (7, 1)]:
        sizes = round_sizes(steps, rounds)
        assert sum(sizes) == steps and len(sizes) == rounds and max(sizes) - min(sizes) <= 1


def test_each_contender_runs_under_its_own_settings():
    seen: dict[str, set[int]] = {"t1": set(), "t2": set()}
    before = torch.get_num_threads()

    def threads(n: int):
        @contextlib.contextmanager
        def settings():
            torch.set_num_threads(n)
            try:
                yield
            finally:
                torch.set_num_threads(before)

        return settings

    contenders = [
        Contender(name, lambda name=name: seen[name].add(torch.get_num_threads()), settings=threads(n))
        for name, n in (("t1", 1), ("t2", 2))
    ]
    time_interleaved(contenders, steps=4, rounds=2)
    assert seen == {"t1": {1}, "t2": {2}}
    assert torch.get_num_threads() == before


class FixedTimer(StepTimer):
    """Runs each step and reports the duration its contender is said to take."""

    def __init__(self, seconds: float) -> None:
        super().__init__(torch.device("cpu"))
        self.seconds = seconds

    def time_steps(self, step, n):
        for _ in range(n):
            step()
        return [self.seconds] * n


def test_clearly_slower_contenders_stop_early():
    calls = {"fast": 0, "close": 0, "slow": 0}
    seconds = {"fast": 0.010, "close": 0.014, "slow": 0.030}
    contenders = [
        Contender(name, lambda name=name: calls.__setitem__(name, calls[name] + 1), timer=FixedTimer(seconds[name]))
        for name in calls
    ]
    time_interleaved(contenders, steps=6, rounds=3, warmup=1, drop_above=1.5)
    fast, close, slow = contenders
    # 3× the fastest after the warm-up (over 1.5²): no timed step; within 1.5× of it: every round
    assert slow.dropped_after == 0 and slow.times == [] and calls["slow"] == 2 == slow.steps
    assert slow.median_s == 0.030  # its warm-up step stands for it
    assert fast.dropped_after is None is close.dropped_after
    assert calls["fast"] == calls["close"] == 8 and len(close.times) == 6


def test_after_a_round_the_median_decides():
    seconds = {"fast": 0.010, "slower": 0.020}  # 2×: within 1.5² after the warm-up, over 1.5 after round 1
    contenders = [Contender(name, lambda: None, timer=FixedTimer(s)) for name, s in seconds.items()]
    time_interleaved(contenders, steps=6, rounds=3, warmup=1, drop_above=1.5)
    fast, slower = contenders
    assert slower.dropped_after == 1 and len(slower.times) == 2 and fast.dropped_after is None


def test_percentile_interpolates_between_order_statistics():
    sample = [7.0, 1.0, 3.0, 10.0, 4.0]
    assert percentile(sample, 0) == 1.0 and percentile(sample, 100) == 10.0 and percentile(sample, 50) == 4.0
    # statistics' "inclusive" method is the same linear interpolation (numpy's default)
    deciles = statistics.quantiles(sample, n=10, method="inclusive")
    assert [percentile(sample, p) for p in range(10, 100, 10)] == pytest.approx(deciles)
    assert percentile([2.5], 90) == 2.5
