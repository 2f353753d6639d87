"""The GPU clock (injob/gpuclock.py) on recorded event sequences: a stand-in for torch.cuda
whose events complete at times the test sets, so the replay's arithmetic and its rules are checked
without a GPU (tests/test_gpu_run.py runs the real thing where one is present)."""

from __future__ import annotations

import os
import warnings
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import test_fastpath
from dlscope.injob import gpuclock
from dlscope.injob.stepmachine import STEP_ARGS, StepMachine


class GpuTime:
    """The stand-in GPU's clock (seconds) and how many of the recorded events have completed."""

    def __init__(self) -> None:
        self.now = 0.0
        self.done_until = float("inf")  # events recorded at GPU times up to here have completed
        self.synchronized = 0


class Event:
    def __init__(self, gpu: GpuTime, enable_timing: bool = True) -> None:
        self.gpu, self.t = gpu, None

    def record(self, stream: Any = None) -> None:
        self.t = self.gpu.now

    def query(self) -> bool:
        return self.t <= self.gpu.done_until

    def synchronize(self) -> None:
        self.gpu.synchronized += 1

    def elapsed_time(self, other: Event) -> float:
        return (other.t - self.t) * 1e3


def fake_torch(gpu: GpuTime) -> Any:
    cuda = SimpleNamespace(
        Event=lambda enable_timing=True: Event(gpu, enable_timing),
        is_initialized=lambda: True,
        current_stream=lambda: None,
        memory_reserved=lambda: 3 << 20,
        max_memory_reserved=lambda: 5 << 20,
        set_sync_debug_mode=lambda mode: None,
        get_device_name=lambda: "stand-in",
        current_device=lambda: 0,
    )
    return SimpleNamespace(cuda=cuda)


class Records:
    def __init__(self) -> None:
        self.written: list[dict[str, Any]] = []
        self.steps: list[tuple] = []

    def write(self, record: dict[str, Any]) -> None:
        self.written.append(record)

    def write_step(self, *values: Any) -> None:
        self.steps.append(values)

    def rows(self) -> list[list[int]]:
        return [row for r in self.written if r["k"] == "gpu_steps" for row in r["rows"]]


@pytest.fixture
def clock(monkeypatch):
    monkeypatch.setattr(gpuclock, "FLOPS_AT_STEP", -1)  # no FLOP counting here (tests/test_flops.py)
    gpu, records = GpuTime(), Records()
    machine = StepMachine(records, clock=lambda: 0.0, thread_id=lambda: 1, fast=False)
    tapped = gpuclock.GpuClock(fake_torch(gpu), machine, records)
    yield SimpleNamespace(gpu=gpu, records=records, machine=machine, tapped=tapped)
    tapped.on = False
    warnings.showwarning = tapped.showwarning or warnings.showwarning


def at(gpu: GpuTime, t: float, call: Any, *args: Any) -> None:
    gpu.now = t
    call(*args)


def host_bound_step(c: Any, t: float, gpu_ms: dict[str, float], g: float = 0.0) -> float:
    """One step whose host times are 1 ms a part, while its GPU times are `gpu_ms` a part from `g`
    on; returns when it ends on the GPU's clock."""
    m, gpu = c.machine, c.gpu
    gpu.now = g
    m.loader_next(t, t + 0.001, "dataset")  # (the start mark, when a DataLoader call started, is hooks.py's)
    g += gpu_ms["data"] / 1e3
    at(gpu, g, m.forward_begin, t + 0.002, True)
    g += gpu_ms["forward"] / 1e3
    at(gpu, g, m.forward_end, t + 0.003)
    at(gpu, g, m.backward_begin, t + 0.003)
    g += gpu_ms["backward"] / 1e3
    at(gpu, g, m.backward_end, t + 0.004)
    at(gpu, g, m.optimizer_begin, t + 0.004)
    g += gpu_ms["optimizer"] / 1e3
    at(gpu, g, m.optimizer_end, t + 0.005)
    return g


def test_the_replay_times_each_part_on_the_gpus_clock_not_the_hosts(clock):
    m = clock.machine
    m.optimizer_created()
    gpu_ms = {"data": 0.0, "forward": 5.0, "backward": 9.0, "optimizer": 2.0}
    g = 0.0
    for step in range(6):  # CUDA is seen at the first step's end: the GPU clock from the second on
        g = host_bound_step(clock, step * 0.01, gpu_ms, g) + 0.0005
    clock.tapped.finish()
    rows = clock.records.rows()
    assert [r[0] for r in rows] == [1, 2, 3, 4, 5]  # the host's step indices
    for row in rows[1:]:
        step_us, fw, bw, opt, reserved = row[1], *row[4:7], row[8]
        assert (fw, bw, opt) == (5000, 9000, 2000)
        assert step_us == pytest.approx(16_500, abs=1) and reserved == 3
    host = clock.records.steps
    assert all(s[6] == pytest.approx(0.001) for s in host)  # the host machine's forward: unchanged


def test_a_dispatch_mode_the_script_keeps_over_the_counted_step_is_waited_out(clock, monkeypatch):
    """The script enters a dispatch mode of its own while the step's FLOPs are counted and keeps it
    past that step's end: the counting mode, under it, cannot be taken off then; it is at the
    first step end after the script's mode exits."""
    from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode, _pop_mode

    class Passthrough(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    monkeypatch.setattr(gpuclock, "FLOPS_AT_STEP", 2)
    clock.machine.optimizer_created()
    gpu_ms = {"data": 0.0, "forward": 1.0, "backward": 1.0, "optimizer": 1.0}
    g, tapped = 0.0, clock.tapped
    try:
        step = 0
        while not tapped.counting:
            g = host_bound_step(clock, step * 0.01, gpu_ms, g) + 0.0005
            step += 1
        with Passthrough():
            for _ in range(2):  # the counted step ends, then one more, under the script's mode
                g = host_bound_step(clock, step * 0.01, gpu_ms, g) + 0.0005
                step += 1
                assert tapped.flop_counter.stuck and not tapped.counting
        assert "another torch dispatch mode" in tapped.flops["error"]
        host_bound_step(clock, step * 0.01, gpu_ms, g)
        assert not tapped.flop_counter.stuck and _get_current_dispatch_mode() is None
    finally:  # on any failure above: ours taken off, or every later test counts
        while _get_current_dispatch_mode() is not None:
            _pop_mode()


def test_steps_are_read_only_once_their_events_completed_and_bounded(clock):
    m, gpu = clock.machine, clock.gpu
    m.optimizer_created()
    gpu.done_until = -1.0  # nothing completes: the GPU is far behind
    for step in range(gpuclock.MAX_PENDING + 10):
        host_bound_step(clock, step * 0.01, {"data": 0, "forward": 1, "backward": 1, "optimizer": 1}, step * 0.01)
    assert clock.records.rows() == []  # nothing read yet: no row before its events completed
    assert len(clock.tapped.pending) == gpuclock.MAX_PENDING  # and no more pending than the bound
    assert clock.tapped.waited > 0 and gpu.synchronized == clock.tapped.waited
    gpu.done_until = float("inf")
    clock.tapped.finish()
    assert len(clock.records.rows()) == gpuclock.MAX_PENDING + 9


def test_a_nested_call_of_the_machine_is_no_second_event(clock):
    """The machine's own calls to its tapped methods (an evaluation's end replays a batch drawn)
    are not events of their own: the replay makes the same calls itself."""
    m = clock.machine
    m.optimizer_created()
    host_bound_step(clock, 0.0, {"data": 0, "forward": 1, "backward": 1, "optimizer": 1})
    clock.tapped.log.clear()
    m.train_mode(0.1, False)
    m.loader_next(0.11, 0.12, "validation")
    m.forward_begin(0.12, False)
    m.forward_end(0.13)
    m.loader_next(0.13, 0.14, "train")  # drawn by the next epoch, then train(): the eval replays it
    m.train_mode(0.14, True)
    assert [name for name, *_ in clock.tapped.log] == [
        "train_mode",
        "loader_next",
        "forward_begin",
        "forward_end",
        "loader_next",
        "train_mode",
    ]


def test_syncs_are_counted_per_step_with_the_scripts_line(clock):
    m = clock.machine
    m.optimizer_created()
    host_bound_step(clock, 0.0, {"data": 0, "forward": 1, "backward": 1, "optimizer": 1})  # CUDA seen
    for step in range(1, 4):
        for _ in range(step):  # inside step `step`: a .item() on the script's line
            warnings.warn(gpuclock.SYNC_MESSAGE + " (Triggered internally)", UserWarning, stacklevel=1)
        host_bound_step(clock, step * 0.01, {"data": 0, "forward": 1, "backward": 1, "optimizer": 1}, step * 0.01)
    with pytest.warns(UserWarning, match="something else"):  # any other warning is shown as before
        warnings.warn("something else", UserWarning, stacklevel=1)
    clock.tapped.finish()
    rows = clock.records.rows()
    assert [(r[0], r[7]) for r in rows] == [(1, 1), (2, 2), (3, 3)]
    summary = next(r for r in clock.records.written if r["k"] == "gpu")
    (line,) = summary["sync_lines"]
    assert line["count"] == 6 and os.path.basename(line["script_file"]) == "test_gpuclock.py"


def test_memory_sites_charge_each_allocation_to_the_scripts_line():
    here = __file__
    torch_file = os.path.join(os.sep, "site-packages", "torch", "nn", "modules", "linear.py")

    def alloc(size: int, *frames: tuple[str, int, str]) -> dict[str, Any]:
        cpp = [{"filename": "CUDACachingAllocator.cpp", "line": 0, "name": "malloc"}]
        return {
            "action": "alloc",
            "size": size,
            "frames": cpp + [{"filename": f, "line": n, "name": fn} for f, n, fn in frames],
        }

    snapshot = {
        "device_traces": [
            [
                alloc(4 << 20, (torch_file, 125, "forward"), (here, 10, "train")),
                alloc(4 << 20, (torch_file, 125, "forward"), (here, 10, "train")),
                {"action": "free_completed", "size": 4 << 20, "frames": []},
                alloc(1 << 20, (here, 20, "load")),
            ]
        ]
    }
    top, second = gpuclock.memory_sites(snapshot)
    assert (top["line"], top["count"], top["bytes"], top["largest"]) == (10, 2, 8 << 20, 4 << 20)
    assert (second["line"], second["function"]) == (20, "load")


def test_an_error_of_the_gpu_clock_turns_it_off_and_never_reaches_the_script(clock, monkeypatch):
    m = clock.machine
    m.optimizer_created()
    shown = warnings.showwarning
    for step in range(3):
        host_bound_step(clock, step * 0.01, {"data": 0, "forward": 1, "backward": 1, "optimizer": 1}, step * 0.01)

    def broken(self: Event, stream: Any = None) -> None:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(Event, "record", broken)
    for step in range(3, 8):  # the host's steps go on, counted as before
        host_bound_step(clock, step * 0.01, {"data": 0, "forward": 1, "backward": 1, "optimizer": 1}, step * 0.01)
    assert [s[0] for s in clock.records.steps if s[1] == "optimizer"] == list(range(8)) and not clock.tapped.on
    (error,) = [r for r in clock.records.written if r["k"] == "gpu_error"]
    assert "illegal memory access" in error["error"]
    assert warnings.showwarning is not clock.tapped._warning and warnings.showwarning is shown


EVENT_ORDER = st.lists(test_fastpath.EVENTS, max_size=60)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(warmup=st.integers(1, 10), events=EVENT_ORDER, dt=st.sampled_from([1e-5, 3e-3]))
def test_on_a_gpu_whose_clock_is_the_hosts_the_replay_gives_the_hosts_steps(warmup, events, dt):
    """Any event sequence (test_fastpath's): the taps leave the host's records as they were, and
    with every CUDA event completing at the host's time of its call, the replay's steps are the
    host's, part by part (from the second step the GPU clock saw: it starts at a step end)."""
    sequence = [("optimizer_created",), *[("step",)] * warmup, *events, *[("step",)] * 5]
    plain = test_fastpath.Run(fast=False)
    test_fastpath.play(plain, sequence, dt)
    tapped_run = test_fastpath.Run(fast=False)
    gpu, records = GpuTime(), Records()
    tapped = gpuclock.GpuClock(fake_torch(gpu), tapped_run.machine, records)
    for name, stamps in gpuclock.TAPPED.items():  # each call's events recorded at its host time
        setattr(tapped_run.machine, name, on_host_time(getattr(tapped_run.machine, name), stamps, gpu, tapped))
    flops_at = gpuclock.FLOPS_AT_STEP
    gpuclock.FLOPS_AT_STEP = -1
    try:
        test_fastpath.play(tapped_run, sequence, dt)
        tapped.finish()
    finally:
        gpuclock.FLOPS_AT_STEP = flops_at
        warnings.showwarning = tapped.showwarning or warnings.showwarning
    assert tapped_run.records.steps == plain.records.steps
    assert tapped_run.records.other == plain.records.other
    steps = [dict(zip(STEP_ARGS, values, strict=True)) for values in plain.records.steps]
    host = {s["i"]: s for s in steps if s["src"] == "optimizer"}
    rows = records.rows()
    assert [row[0] for row in rows] == sorted(i for i in host if i >= 1)  # each step from the GPU clock's start
    for row in rows[1:]:
        step = host[row[0]]
        assert row[1] == round((step["end"] - step["start"]) * 1e6)
        assert row[2] == round(step["data"] * 1e6) and row[3] == int(step["data_source"] == "loader")
        assert row[4:7] == [round(step[p] * 1e6) for p in ("forward", "backward", "optimizer")]


def on_host_time(call: Any, stamps: tuple[int, ...], gpu: GpuTime, tapped: gpuclock.GpuClock) -> Any:
    """`call` with the stand-in GPU's clock at the host time of its event (and, for a DataLoader
    call, the start mark hooks.py records before it, at its start)."""

    def timed(*args: Any, **kwargs: Any) -> Any:
        if stamps:
            if len(stamps) == 2:
                gpu.now = args[0]
                tapped.mark_start()
            gpu.now = args[stamps[-1]]
        return call(*args, **kwargs)

    return timed
