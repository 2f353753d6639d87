"""The step machine's common step in C (injob/_fastpath.c) against the Python machine:
the same event sequences through both give the same records, the same rows and the same state."""

from __future__ import annotations

import os
from types import MemberDescriptorType
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dlscope.analysis.stepfile import StepFile
from dlscope.contract.live import LiveStatus, live_path, read_live
from dlscope.injob import stepmachine
from dlscope.injob.recorder import RecordFile
from dlscope.injob.stepmachine import STEP_ARGS, STEP_PARTS_FIELDS, StepMachine, StepParts

pytestmark = pytest.mark.skipif(stepmachine._fastpath is None, reason="the C fast path is not built here")


class Records:
    def __init__(self) -> None:
        self.steps: list[tuple] = []
        self.other: list[dict[str, Any]] = []

    def write(self, record: dict[str, Any]) -> None:
        self.other.append(record)

    def write_step(self, *values: Any) -> None:
        assert len(values) == len(STEP_ARGS)
        self.steps.append(values)


class Profiler:
    """A window of two steps every 40 steps: the machine asks it only when due."""

    def __init__(self) -> None:
        self.idle_until = float("-inf")
        self.asked = 0

    def after_step(self, index: int, start: float, now: float) -> tuple[str | None, int | None]:
        self.asked += 1
        if index % 40 in (1, 2):
            self.idle_until = float("-inf")
            return "active", index
        self.idle_until = now + 0.01
        return None, None

    def stop(self) -> None:
        pass


# the fast path's own figures, the callables and the bound events (not state)
LEFT_OUT = (
    "fast", "fast_logged", "fast_taken", "sink", "profiler", "memory", "clock", "thread_id", "on_step", "marker",
    *stepmachine.FAST_EVENTS,
)  # fmt: skip


def state(m: StepMachine) -> dict[str, Any]:
    """What the machine holds, the C base's fields and the steps' spelled out (the bound events left out)."""
    out = {}
    members = [name for name in dir(type(m)) if isinstance(getattr(type(m), name), MemberDescriptorType)]
    fields = {name: getattr(m, name) for name in members}
    for name, value in {**vars(m), **fields}.items():
        if name in LEFT_OUT:
            continue
        if isinstance(value, StepParts):
            value = {slot: getattr(value, slot) for slot in STEP_PARTS_FIELDS}
        elif name == "steps":
            value = {k: None if v is None else {s: getattr(v, s) for s in STEP_PARTS_FIELDS} for k, v in value.items()}
        elif name == "live":
            value = [{s: getattr(v, s) for s in STEP_PARTS_FIELDS} for v in value]
        out[name] = value
    return out


class Run:
    """A machine, its records, its fake thread, its live-file calls."""

    def __init__(self, fast: bool, sink: Any = None) -> None:
        self.records = Records() if sink is None else sink
        self.thread = [1]
        self.steps_seen: list[tuple[int, float]] = []
        self.backwards_now: list[int] = []  # after each event: what the torch layer reads (updates.py)
        self.profiler = Profiler()
        self.machine = StepMachine(
            self.records,
            self.profiler,
            memory=lambda: (1 << 20, None),
            clock=lambda: self.now,
            thread_id=lambda: self.thread[0],
            on_step=lambda n, now: self.steps_seen.append((n, now)),
            fast=fast,
        )
        self.now = 0.0
        self.machine.begin("startup", 0.0)
        assert self.machine.fast == fast


EVENTS = st.one_of(
    st.just(("step",)),  # the common step, whole: forward, backward, optimizer
    st.just(("step",)),
    st.just(("step",)),
    st.just(("no_forward_step",)),  # a loss computed without a module: backward and optimizer only
    st.tuples(st.just("loader_next"), st.sampled_from(["a", "b", None])),
    st.tuples(st.just("loader_waited"), st.sampled_from(["a", "b", None])),
    st.tuples(st.just("forward_begin"), st.booleans(), st.booleans()),  # training, by keyword
    st.just(("forward_end",)),
    st.just(("backward_begin",)),
    st.tuples(st.just("backward_end"), st.booleans()),
    st.just(("optimizer_begin",)),
    st.just(("optimizer_end",)),
    st.just(("closure_begin",)),
    st.just(("closure_end",)),
    st.tuples(st.just("train_mode"), st.booleans()),
    st.just(("checkpoint",)),
    st.just(("optimizer_created",)),
    st.just(("thread",)),  # the next events from the other thread
    st.just(("pause",)),  # 0.2 s: memory and the profiler are due at the next step end
)
SOURCES = {"a": object(), "b": object(), None: None}


def play(run: Run, events: list[tuple], dt: float) -> None:
    m = run.machine

    def tick() -> float:
        run.now += dt
        return run.now

    for event in events:
        kind = event[0]
        if kind in ("step", "no_forward_step"):
            if kind == "step":
                m.forward_begin(tick(), True)
                m.forward_end(tick())
            m.backward_begin(tick())
            m.backward_end(tick())
            run.backwards_now.append(m.backwards_now())  # the C path holds the backward here
            m.optimizer_begin(tick())
            run.backwards_now.append(m.backwards_now())
            m.optimizer_end(tick())
        elif kind == "loader_next":
            start = tick()
            m.loader_next(start, tick(), SOURCES[event[1]])
        elif kind == "loader_waited":
            start = tick()
            m.loader_waited(start, tick(), SOURCES[event[1]])
        elif kind == "forward_begin":
            if event[2]:
                m.forward_begin(tick(), training=event[1])
            else:
                m.forward_begin(tick(), event[1])
        elif kind == "backward_end":
            m.backward_end(tick(), event[1])
        elif kind == "train_mode":
            m.train_mode(tick(), event[1])
        elif kind == "checkpoint":
            if m.checkpoint_begin(tick(), "checkpoint_save", "/tmp/x.pt"):
                m.checkpoint_end(tick(), "checkpoint_save")
        elif kind == "optimizer_created":
            m.optimizer_created()
        elif kind == "thread":
            run.thread[0] = 3 - run.thread[0]
        elif kind == "pause":
            run.now += 0.2
        else:
            getattr(m, kind)(tick())
        run.backwards_now.append(m.backwards_now())
    m.finish(tick(), torch_attached=True)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    warmup=st.integers(0, 30),
    events=st.lists(EVENTS, max_size=60),
    dt=st.sampled_from([1e-5, 1e-4, 3e-3]),
)
def test_any_event_sequence_gives_what_the_python_machine_gives(warmup: int, events: list[tuple], dt: float):
    """Steady steps first (the C path takes them), then anything: each event as the Python
    machine takes it, replayed in order, whatever came before."""
    sequence = [("optimizer_created",), *[("step",)] * warmup, *events, *[("step",)] * 5]
    fast, python = Run(fast=True), Run(fast=False)
    play(fast, sequence, dt)
    play(python, sequence, dt)
    assert fast.records.steps == python.records.steps
    assert fast.records.other == python.records.other
    assert fast.steps_seen == python.steps_seen
    assert state(fast.machine) == state(python.machine)
    assert fast.profiler.asked == python.profiler.asked
    assert fast.backwards_now == python.backwards_now  # read between events, the C path unsettled


def test_the_common_step_is_taken_in_c_and_a_step_with_more_is_not():
    run = Run(fast=True)
    play(run, [("optimizer_created",), *[("step",)] * 200], 1e-5)
    taken = run.machine.fast_taken
    assert 190 <= taken < 200  # the first steps, and those with memory or the profiler due, are Python's
    play(run, [("loader_next", "a"), ("step",)] * 20, 1e-5)  # a batch drawn: its data is the loader's
    assert run.machine.fast_taken == taken
    play(run, [("no_forward_step",)] * 50, 1e-5)
    assert run.machine.fast_taken >= taken + 45


def test_a_nested_optimizer_step_reads_the_depth_the_python_machine_would_have(tmp_path):
    """A GradScaler's step calls the optimizer's: the torch layer reads optimizer_depth between."""
    run = Run(fast=True)
    play(run, [("optimizer_created",), *[("step",)] * 10], 1e-5)
    m = run.machine
    m.forward_begin(1.0, True)
    m.forward_end(1.00001)
    m.backward_begin(1.00002)
    m.backward_end(1.00003)
    m.optimizer_begin(1.00004)
    assert m.optimizer_depth == 1 and m.unsettled
    m.optimizer_begin(1.00005)  # the inner step: the logged events replayed first
    assert not m.unsettled and m.optimizer_depth == 2 and m.inner_steps == 1
    m.optimizer_end(1.00006)
    m.optimizer_end(1.00007)
    assert run.records.steps[-1][STEP_ARGS.index("optimizer")] == pytest.approx(3e-5)


def test_rows_packed_in_c_are_the_rows_python_packs(tmp_path):
    """The C path packs the row into the record file's window itself: byte for byte what
    RecordFile.write_step packs, across window moves."""
    files = {}
    for fast in (True, False):
        directory = tmp_path / ("fast" if fast else "python")
        directory.mkdir()
        sink = RecordFile(str(directory))
        run = Run(fast=fast, sink=sink)
        play(run, [("optimizer_created",), *[("step",)] * 3000, ("pause",), *[("step",)] * 50], 1e-5)
        if fast:
            assert run.machine.fast_taken > 2900
        sink.close_steps()
        os.close(sink.fd)
        path = directory / f"{os.getpid()}.steps"
        assert StepFile(path).count == 3051
        files[fast] = path.read_bytes()
    assert files[True] == files[False]


def test_the_live_file_counts_the_steps_taken_in_c(tmp_path):
    """The live file's step counter (what `dlscope watch` and the hang watchdog read), packed by
    the C path itself, reads as LiveStatus.step_ended writes it."""
    seen = {}
    for fast in (True, False):
        directory = tmp_path / str(fast)
        directory.mkdir()
        live = LiveStatus(str(directory), None)
        run = Run(fast=fast)
        run.machine.on_step = live.step_ended
        play(run, [("optimizer_created",), *[("step",)] * 100], 1e-5)
        assert run.machine.fast_taken > 90 if fast else run.machine.fast_taken == 0
        view = read_live(live_path(directory, os.getpid()))
        assert view is not None
        seen[fast] = (view.steps, view.last_step_end)
    assert seen[True] == seen[False] and seen[True][0] == 100


def timed_pair(kind: int, fallback: Any = None, hooks: Any = None, machine: Any = None) -> tuple[Any, list]:
    marks: list[tuple[str, float]] = []

    def inner(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("fail"):
            raise ValueError("inner failed")
        return args, kwargs

    def begin(now: float) -> None:
        marks.append(("begin", now))

    def end(now: float) -> None:
        marks.append(("end", now))

    extra = () if kind == stepmachine._fastpath.TIMED_CALL else (hooks, machine, fallback)
    return stepmachine._fastpath.Timed(inner, begin, end, kind, *extra), marks


def test_a_timed_call_passes_its_arguments_on_and_ends_its_part_when_it_raises():
    timed, marks = timed_pair(stepmachine._fastpath.TIMED_CALL)
    assert timed(1, 2, key=3) == ((1, 2), {"key": 3})
    with pytest.raises(ValueError, match="inner failed"):
        timed(fail=True)
    assert [kind for kind, _ in marks] == ["begin", "end", "begin", "end"]
    assert all(0 < marks[i][1] <= marks[i + 1][1] for i in range(3))

    def end_fails(now: float) -> None:
        raise RuntimeError("end failed")

    def inner_fails() -> None:
        raise ValueError("inner failed")

    failing = stepmachine._fastpath.Timed(inner_fails, marks.append, end_fails, stepmachine._fastpath.TIMED_CALL)
    with pytest.raises(RuntimeError, match="end failed") as raised:
        failing()
    assert isinstance(raised.value.__context__, ValueError)  # as a `finally` that raises chains it


def test_a_timed_optimizer_step_binds_as_a_method_and_tells_a_switch_of_optimizer():
    """An optimizer's step: set on a class, it binds; a step of another instance than the one
    stepping calls optimizer_switched, not a nested one; a closure goes to the Python step."""

    class Hooks:
        def __init__(self) -> None:
            self.stepping: Any = None
            self.switched: list = []

        def optimizer_switched(self, optimizer: Any) -> None:
            self.switched.append(optimizer)
            self.stepping = optimizer

    hooks, machine = Hooks(), Run(fast=True).machine
    closures: list = []
    timed, marks = timed_pair(stepmachine._fastpath.TIMED_STEP, lambda *a, **k: closures.append(a), hooks, machine)

    class Optimizer:
        step = timed

    first, second = Optimizer(), Optimizer()
    assert first.step() == ((first,), {})
    first.step()
    second.step()
    assert hooks.switched == [first, second]
    machine.optimizer_depth = 1  # a step inside another: no switch
    first.step()
    assert hooks.switched == [first, second] and len(marks) == 8
    second.step(lambda: None)
    assert closures == [(second, closures[0][1])] and len(marks) == 8
