"""What a training step is and what its parts are, from a stream of events — no torch here, so
every rule below is tested on recorded event sequences (tests/test_stepmachine.py).

The torch layer (injob/hooks.py) turns torch's extension points into these events, each
stamped with CLOCK_REALTIME seconds by the caller:

    loader_next(start, end, source)  a batch drawn from a DataLoader (training only; in the thread
                                     that ends the steps: one a prefetching thread draws is no wait
                                     of the loop's); `source` its dataset (any object, compared by
                                     identity; None: not known)
    loader_waited(start, end, source)  a DataLoader call that drew no batch: its `__next__` at an
                                     epoch's end, its `__iter__` (which starts the workers of a new
                                     pass); `source` its dataset, as loader_next's
    forward_begin(now, training)     the outermost module call starts; `training` is False for
    forward_end(now)                 a forward with no grad, or of a module in eval mode: see
                                     IMPLICIT_EVAL_FORWARDS for when those are an evaluation
    backward_begin(now) / backward_end(now, ends_step)   a `backward()`, or an `autograd.grad` call;
                                     ends_step False for a gradient kept differentiable (create_graph)
    optimizer_begin(now) / optimizer_end(now)   a torch optimizer's `step` (nested calls: the outer,
                                     and `inner_steps` counts the nested ones), or a GradScaler's
                                     `step`: a step whether or not it calls the optimizer's; or
                                     the parameter update a script with no torch optimizer writes
                                     itself after backward(), under no_grad or through `.data`
                                     (updates.py)
    optimizer_created()              a torch optimizer exists in this process
    train_mode(now, mode)            Module.train(mode) on an outermost call
    checkpoint_begin(now, name, file) / checkpoint_end(now)
    data_worker()                    this process is a DataLoader worker (see below)

Steps. A step ends when an optimizer steps: one step however many closures `optimizer.step(closure)`
calls (LBFGS) and however many micro-batches it accumulates; the update a loop with no torch
optimizer writes itself (Keras 3 on torch, a hand-written SGD) is such a step too, once the torch
layer has found it (updates.py). Until then, and in a loop with no update found at all, a step ends
at each `backward()` or `autograd.grad` outside an optimizer call — never at a gradient kept
differentiable (`create_graph=True`: a gradient penalty's, a meta-learning inner loop's), which is
backward time inside a step and no step of its own.
Both streams are recorded until an optimizer has stepped; only the primary one (the optimizer's
when a torch optimizer exists) drives the profiler and samples memory.

Evaluations. An outermost `Module.train(False)` (`model.eval()`) starts an evaluation, and the
next training work ends it; batches drawn in it are no step's data, and once a batch is drawn
or a forward with no grad runs in it, it is an eval phase (from then) whose time belongs to no
step, and from then a forward of a module in train mode with grad (a loss module, when the
evaluation runs without `no_grad()`) is its work too: a backward(), an optimizer step or
`train()` ends it (an evaluation found from forwards with no grad, below, ends at a forward
with grad). One that does neither (a BatchNorm frozen by `bn.eval()` at each step) is no
evaluation, and the step's training forward ends it. One still open when the process ends
ended with its last work (a forward's end, a batch drawn, its loader's wait), not at the exit.

A forward with no grad outside one is an evaluation from IMPLICIT_EVAL_FORWARDS in a row (a
validation loop under `torch.no_grad()` alone; the batches drawn for them since the step end are
its own). Fewer, run between two steps (after a step end, before the next step's work), are one
too when something other than that work ends them — the next step's batch drawn or its loader's
wait, a checkpoint, `train(False)` (whose evaluation they start), the process's end (then at
their last forward's end): a prediction after each optimizer step, whatever the module's mode
(known then, so written then, as below). Ended by the step's own work instead (a forward with
grad, a backward()), they are the step's, in its gap, as any is once its work has started (a
batch drawn), timed as forward: a frozen teacher's in distillation, a target network's and the
action chosen in DQN (whose batches come from a replay buffer, not a DataLoader).

A validation loop with neither `eval()` nor `no_grad()` (a student's) runs training forwards: it
is known afterwards, when IMPLICIT_EVAL_BATCHES batches or more drawn from one dataset right
after a step end, each fed to a forward, with no backward() between, end without one — at a
batch from another dataset, `train()`, a checkpoint, the process's end. They were an evaluation
from the first batch to there (written then, so an I/O tracer's phase markers do not see it),
and the step they were counted in gets back what it had before them. Ended by a backward()
instead (a loss summed over several batches before one backward, the next epoch's training on
the same dataset object), they stay the step's.

Loader waits. The first pass's `iter()` before any step (where a DataLoader forks its workers)
starts step 0, as its first batch would: it is that step's wait for its input, so data, and
startup ends with it. In an evaluation, a loader's wait (its pass's `iter()`, its end) is the
evaluation's, its phase starting there if it had not yet, unless the batch drawn right after it
from the same dataset goes to the next step (the next epoch's pass, started before train() is
called): then both are the step's. With no work of the evaluation's after it (a BatchNorm frozen
by `bn.eval()` around the pass's start) it is the step's.

A DataLoader worker's process runs its dataset's code: a transform that is a module (torchvision's
are) runs forwards there, with no grad when the worker was forked inside `no_grad()`. From
`data_worker()` on, no step, evaluation or checkpoint starts in that process.

The common step (a training forward or none, a backward(), an optimizer step, nothing between
two step ends) is taken in C where the extension is built (_fastpath.c): it finishes such a step
as end_step would, and replays its events into these methods whenever a step is anything else.

Parts never overlap: an interval opened inside another (a closure's forward and backward inside
`optimizer.step`, an activation-checkpoint recompute's forward inside backward) is that inner
part's time and is taken out of the outer one. So data + forward + backward + optimizer ≤ the
step, and "other" is the rest.
"""

from __future__ import annotations

import functools
import os
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from dlscope.contract.env import FAST_ENV
from dlscope.contract.records import PHASE_RECORDS

try:  # the common step in C (_fastpath.c); not built (no C compiler at install): every step here
    from dlscope.injob import _fastpath
except ImportError:
    _fastpath = None  # type: ignore[assignment]

PARTS = ("data", "forward", "backward", "optimizer")
DATA, FORWARD, BACKWARD, OPTIMIZER = range(len(PARTS))  # a part's index in StepMachine.totals
# the events the C fast path takes while the machine stands at a step end (_fastpath.c)
FAST_EVENTS = ("forward_begin", "forward_end", "backward_begin", "backward_end", "optimizer_begin", "optimizer_end")
# the C path's `fast_logged` once it holds a step's backward_end (and its optimizer_begin, one more)
BACKWARD_LOGGED = FAST_EVENTS.index("backward_end") + 1
# what Sink.write_step receives, in this order (positional: a keyword call costs ~1 µs a step)
STEP_ARGS = (
    "i",
    "src",
    "start",
    "end",
    "data",
    "data_source",
    "forward",
    "backward",
    "optimizer",
    "backwards",
    "forwards",
    "peak_rss",
    "peak_cuda",
    "profiled",
    "profiler_step",
    "profiler_seconds",
    "tid",
)
# this many forwards with no grad (or of modules in eval mode), with no train(False) around them and
# no backward() or step end between, are an evaluation; fewer are the step's own work
IMPLICIT_EVAL_FORWARDS = 4
# this many batches or more drawn right after a step end, each fed to a forward, with no backward()
# between, ended by something other than a backward(), were an evaluation (see the module's text)
IMPLICIT_EVAL_BATCHES = 4
MEMORY_INTERVAL_S = 0.1  # peak memory read at most this often: a /proc read costs ~10 µs
FOLDED_FILES = 20  # files listed per phase name among the phases past PHASE_RECORDS


class _ThreadId(threading.local):
    """The kernel's id of the calling thread: `threading.get_native_id` is a system call (~1 µs in
    a VM), asked once per thread (a `threading.local` runs `__init__` at a thread's first use)."""

    def __init__(self) -> None:
        self.tid = threading.get_native_id()


_this_thread = _ThreadId()
# read with no Python frame (a partial of a builtin): the step machine asks it at every step end
native_thread_id: Callable[[], int] = functools.partial(getattr, _this_thread, "tid")


def _forget_thread_id() -> None:
    _this_thread.tid = threading.get_native_id()  # a forked child's one thread has an id of its own


os.register_at_fork(after_in_child=_forget_thread_id)


class Sink(Protocol):
    """Where the machine's facts go (recorder.RecordFile)."""

    def write(self, record: dict[str, Any]) -> None: ...

    def write_step(self, *values: Any) -> None:
        """One finished step: the values named by STEP_ARGS, in that order."""
        ...


NOT_PROFILED = (None, None)


class StepProfiler(Protocol):
    """Driven at each primary step end; says how the step that starts next is profiled. Not
    asked before `idle_until` (a time: the steps until then are not profiled; read after each
    `after_step`, which alone moves it later)."""

    idle_until: float

    def after_step(self, index: int, start: float, now: float) -> tuple[str | None, int | None]:
        """Step `index` ran from `start` to `now`; (label of the next: wait|warmup|active|None, the
        profiler's own step number: ProfilerStep#N)."""
        ...

    def stop(self) -> None: ...


class NoProfiler:
    idle_until = float("inf")

    def after_step(self, index: int, start: float, now: float) -> tuple[str | None, int | None]:
        return None, None

    def stop(self) -> None:
        pass


STEP_PARTS_FIELDS = ("start", "totals", "backwards", "forwards", "batches", "first_work", "fresh")


class StepParts(_fastpath.StepPartsCore if _fastpath else object):  # type: ignore[misc]
    """The step being accumulated: its start, and the machine's running totals when it started
    (its parts, backward() calls, forwards and batches drawn are the totals' growth since).
    Its fields are the C base's where the fast path is built."""

    __slots__ = () if _fastpath else STEP_PARTS_FIELDS

    def __init__(self, start: float, totals: list[float], backwards: int, forwards: int, batches: int) -> None:
        self.start = start
        self.totals = totals[:]
        self.backwards, self.forwards, self.batches = backwards, forwards, batches
        self.first_work: float | None = None  # when its first part opened: the gap ends there
        self.fresh = True  # no training work yet: an eval or checkpoint before it moves its start


class StepMachine(_fastpath.StepCore if _fastpath else object):  # type: ignore[misc]
    """One per process: events in, step records and phase begin/end records out. Where the fast
    path is built, the fields the common step touches are its C base's (_fastpath.c)."""

    def __init__(
        self,
        sink: Sink,
        profiler: StepProfiler | None = None,
        memory: Callable[[], tuple[int | None, int | None]] | None = None,
        marker: tuple[Callable[[str], None], Callable[[str], None]] | None = None,
        clock: Callable[[], float] = time.time,
        thread_id: Callable[[], int] = native_thread_id,
        on_step: Callable[[int, float], None] | None = None,
        fast: bool = True,
    ) -> None:
        self.sink = sink
        self.on_step = on_step  # (steps so far, when the last ended) after each counted step: the live file
        self.clock = clock
        self.memory = memory
        self.marker = marker  # (mark_begin, mark_end): phase markers the I/O tracers see
        self.thread_id = thread_id
        self.reset(profiler or NoProfiler())
        # a step end fed after the fact (updates.py: an update outside no_grad, found at the next
        # event, before its clock is read): the next step starts as long after that end as
        # dlscope's own work there takes now, the script's work since then being the next step's
        self.ended_late = False
        # the common step taken in C: its six events shadowed on this instance by the C base's; the
        # class's methods stay the definition, replayed into whenever a step is anything else
        self.fast = fast and _fastpath is not None and os.environ.get(FAST_ENV) != "0"
        if self.fast:
            direct = getattr(sink, "row_format", None) == _fastpath.ROW_FORMAT  # a row packed in C
            self.fast_setup(StepMachine, NOT_PROFILED, native_thread_id, direct)
            for name in FAST_EVENTS:
                setattr(self, name, getattr(self, f"fast_{name}"))

    def backwards_now(self) -> int:
        """Step-ending backward() calls so far, one the C path holds and has not replayed yet
        included: read without settling it (updates.py asks at each outermost no_grad block)."""
        return self.backwards + (self.unsettled and self.fast_logged >= BACKWARD_LOGGED)

    def python_only(self) -> None:
        """Every event through this class's methods from now on (the C path's events replayed
        first): an observer that taps them (gpuclock.py) sees them all."""
        if self.fast:
            if self.unsettled:
                self.settle()
            self.fast = False
            for name in FAST_EVENTS:
                delattr(self, name)

    def reset(self, profiler: StepProfiler) -> None:
        if _fastpath is not None:  # what the C path holds: a step's events, this thread's id
            self.drop_logged()
        # the C path holds events of a step not yet replayed here: every other call into the
        # machine replays them first (`if self.unsettled: self.settle()`)
        self.unsettled = False
        self.profiler = profiler
        self.steps: dict[str, StepParts | None] = {"optimizer": None, "backward": None}
        self.live: list[StepParts] = []  # the steps above that are not None: the hot path's loops
        # a live step may be fresh / have no first work yet (set with every new StepParts)
        self.idle = self.unworked = True
        # idle, unworked or in eval: a part opening has more to do than open (the hot path's one check)
        self.attention = True
        self.counts = {"optimizer": 0, "backward": 0}
        self.optimizer_stepped = False
        self.has_optimizer = False
        self.stack: list[str] = []  # open phases
        self.stack_folded: list[float | None] = []  # each open phase's start if it is counted, not written
        self.phases_written: dict[str, int] = {}
        # phases past PHASE_RECORDS, by name: {"count", "seconds", "train_mode", "files"}
        self.phases_folded: dict[str, dict[str, Any]] = {}
        self.last_end = float("-inf")
        self.checkpoint_files: list[str] = []  # of the open checkpoint phase
        self.in_eval = False
        self.eval_explicit = False  # the evaluation was started by train(False), not by forwards with no grad
        # a loop that draws a batch, then calls train() or eval() (skorch's step functions): whether
        # the row of batches (row_*, below) drawn right before train(False) is the evaluation's if
        # it does any work (see train_mode); the last batch drawn in the evaluation with no forward
        # after it (start, end, source), and the dataset its forwards were fed from (see eval_end)
        self.eval_row = False
        self.eval_drawn: tuple[float, float, Any] | None = None
        self.eval_fed: Any = None
        # the last loader wait in the evaluation since its last forward (start, end, source): its
        # own, or the next step's if the batch drawn right after it is (see eval_end)
        self.eval_waited: tuple[float, float, Any] | None = None
        # the end of the last work outside the steps: an evaluation's (a forward, a batch, a loader's
        # wait), a forward with no grad between two steps
        self.eval_last = 0.0
        self.data_worker_process = False  # a DataLoader worker's: no step or phase starts (data_worker)
        # forwards with no grad (or in eval mode) since the last backward() or step end, the first's time
        self.quiet_forwards = 0
        self.quiet_since = 0.0
        # batches drawn since the last backward() or step end (a row), from `row_source`, how many
        # after a forward (fed); at its first: when, the totals and batch count then, whether the
        # step had no part yet (`unworked`: batches drawn only, as the epoch's end is)
        self.row = self.row_fed = 0
        self.row_source: Any = None
        self.row_since = self.row_forward = 0.0
        self.row_totals: list[float] = []
        self.row_batches = self.row_forward_calls = 0
        self.row_fresh = False
        # open parts, as exclusive time: the innermost runs (`part`, since `since`), those around it
        # (`outer`, innermost last) are paused until it closes — no list per part in a step
        self.part: int | None = None
        self.since = 0.0
        self.outer: list[int] = []
        # seconds per part, backward() calls, forwards timed as a step's and batches drawn since the
        # start: a part closing adds to one total whatever the number of steps accumulating (the
        # two streams before an optimizer has stepped)
        self.totals = [0.0, 0.0, 0.0, 0.0]
        self.backwards = self.forwards = self.batches = 0
        self.optimizer_depth = 0
        self.inner_steps = 0  # optimizer steps called inside another (a GradScaler's, a wrapper's)
        # the thread that ended the last primary step (until one has: the thread that attached,
        # the main thread, where nearly every loop runs); batches another thread draws (a
        # prefetcher's) are counted, never the steps' data
        self.step_thread = self.thread_id()
        self.batches_elsewhere = 0
        self.next_profiled: tuple[str | None, int | None] = NOT_PROFILED
        # asked with the index at the next primary step end, then dropped (set by the torch layer
        # when a forward ran in eval mode with grad: was that step a training step in eval mode?)
        self.eval_mode_check: Callable[[int], None] | None = None
        self.next_memory = float("-inf")  # when peak memory is read next
        self.next_work = float("-inf")  # when a step end next has memory or the profiler to look at
        # told (index, now) with the between-steps work; True: call again at the next step end
        # (the torch layer's slowdown watch, subnormals.py)
        self.watch: Callable[[int, float], bool] | None = None

    # phases ----------------------------------------------------------------------------------
    def begin(self, name: str, now: float, file: str | None = None) -> None:
        if self.unsettled:
            self.settle()
        now = max(now, self.last_end)  # never before the end of the phase just closed
        if self._written(name):
            record: dict[str, Any] = {"k": "B", "name": name, "ts": now, "tid": self.thread_id()}
            if file is not None:
                record["file"] = file
            self.sink.write(record)
            self.stack_folded.append(None)
        else:
            self.stack_folded.append(now)
        if self.marker:
            self.marker[0](name)  # after the timestamp: the marker's syscall falls inside the slice
        self.stack.append(name)

    def _written(self, name: str) -> bool:
        """Is this phase of `name` written (else counted: see PHASE_RECORDS)?"""
        written = self.phases_written.get(name, 0)
        if written >= PHASE_RECORDS:
            return False
        self.phases_written[name] = written + 1
        return True

    def _fold(self, name: str, seconds: float, facts: dict[str, Any]) -> None:
        folded = self.phases_folded.setdefault(name, {"count": 0, "seconds": 0.0, "train_mode": 0, "files": []})
        folded["count"] += 1
        folded["seconds"] += seconds
        folded["train_mode"] += bool(facts.get("train_mode"))
        files = folded["files"]
        files += [f for f in facts.get("files", ()) if f not in files][: FOLDED_FILES - len(files)]

    def end(self, name: str, now: float, *, known_late: bool = False, **facts: Any) -> None:
        """Close `name` (and what a lost event left open inside it); `facts` go on its end record.
        `known_late`: it ended at `now`, known only since (its marker comes late by that much)."""
        if self.unsettled:
            self.settle()
        while self.stack:
            top = self.stack.pop()
            folded_since = self.stack_folded.pop()
            if self.marker:
                self.marker[1](top)
                if not known_late:
                    now = max(now, self.clock())  # stamped after the marker: it falls inside the slice
            if folded_since is not None:
                self._fold(top, now - folded_since, facts if top == name else {})
            else:
                record = {"k": "E", "name": top, "ts": now, "tid": self.thread_id()}
                self.sink.write({**record, **facts} if top == name else record)
            self.last_end = now
            if top == name:
                return

    def _switch(self, old: str, new: str, now: float) -> None:
        if old in self.stack:
            self.end(old, now)
            self.begin(new, now)

    def eval_begin(self, now: float, forwarded: bool = True) -> None:
        """An evaluation; its phase from `now` when `forwarded` (it starts with a forward), else (a
        module put in eval mode) from its first batch drawn or forward with no grad (eval_work), if any."""
        if self.data_worker_process:
            return
        if not self.in_eval:
            self.in_eval = self.attention = True
            self.eval_explicit = False
            self.eval_drawn = self.eval_fed = self.eval_waited = None
            self.eval_last = now
        if forwarded:
            self.eval_work(now)
        else:
            self.eval_explicit = True

    def eval_work(self, now: float, source: Any = None) -> None:
        """The evaluation's first work (a forward, or a batch drawn from `source`) writes its phase."""
        if "eval" not in self.stack:  # its phase not written yet
            if self.eval_row:  # batches drawn right before train(False): the step gives them back
                self.eval_row = False
                self._give_back_row()
                # the evaluation's own when it does not draw from another dataset first (Lightning's
                # training batch drawn ahead, before its validation: in no phase)
                if source is None or source is self.row_source:
                    now = self.row_since
                    self.eval_drawn = (now, now, self.row_source)  # fed to its first forward
            if self.eval_waited is not None:  # its loader's pass started there (its workers forked)
                now = min(now, self.eval_waited[0])
            self.begin("eval", now)

    def eval_fed_by(self) -> None:
        """A forward of the evaluation's: the batch drawn last was drawn for it, and the loader's
        wait before it was the evaluation's."""
        self.eval_waited = None
        if self.eval_drawn is not None:
            self.eval_fed, self.eval_drawn = self.eval_drawn[2], None

    def eval_end(self, now: float) -> None:
        if not self.in_eval:
            return
        self.in_eval = False
        self.quiet_forwards = 0
        self.eval_row = False
        drawn, self.eval_drawn = self.eval_drawn, None
        waited, self.eval_waited = self.eval_waited, None
        if "eval" in self.stack:
            # a batch drawn after its last forward, from another dataset than the one it was fed
            # (skorch draws the next epoch's first batch, then calls module.train()): the next
            # step's, with the wait right before it from its loader (the pass's iter()), and the
            # evaluation ended where they began
            if drawn is None or drawn[2] is None or drawn[2] is self.eval_fed:
                self.end("eval", now)
                self._restart_fresh(self.last_end)  # (stamped after the phase marker: the next step starts there)
            else:
                if waited is not None and (waited[2] is not drawn[2] or waited[0] > drawn[0]):
                    waited = None  # another loader's (the evaluation's own end): the evaluation's
                since = drawn[0] if waited is None else waited[0]
                self.end("eval", since, known_late=True)
                self._restart_fresh(since)
                if waited is not None:
                    self.loader_waited(*waited)
                self.loader_next(*drawn)
        elif waited is not None:  # no work of its own after it (a BatchNorm frozen): the loop's wait
            self.loader_waited(*waited)

    def _restart_fresh(self, now: float) -> None:
        """Time spent in eval or a checkpoint between two steps belongs to neither."""
        for src, step in self.steps.items():
            if step is not None and step.fresh:
                self._set_step(src, self._new_step(now))

    def _new_step(self, start: float) -> StepParts:
        return StepParts(start, self.totals, self.backwards, self.forwards, self.batches)

    def _set_step(self, src: str, step: StepParts | None) -> None:
        self.steps[src] = step
        self.live = [s for s in self.steps.values() if s is not None]
        if step is not None:
            self.idle = self.unworked = self.attention = True

    # parts -----------------------------------------------------------------------------------
    def _open(self, part: int, now: float) -> None:
        """Open `part` while `attention` is set or a part is open (the begin methods set `part`
        themselves otherwise). First, while `attention` is set: leave eval, start the step's
        work, mark its first work (in that order); then a part open around `part` pauses (its
        time so far added) until `part` closes."""
        if self.attention:
            if self.in_eval:
                self.eval_end(now)
            if self.idle and self.unworked and self.steps["optimizer"] is not None:  # most steps
                self.idle = self.unworked = self.attention = False
                for step in self.live:
                    step.fresh = False
                    if step.first_work is None:
                        step.first_work = now
            else:
                if self.idle:
                    self.activity(now)
                if self.unworked:
                    self.unworked = False
                    for step in self.live:
                        if step.first_work is None:
                            step.first_work = now
                self.attention = self.in_eval or self.idle or self.unworked
        current = self.part
        if current is not None:
            spent = now - self.since
            if spent > 0.0:
                self.totals[current] += spent
            self.outer.append(current)
        self.part, self.since = part, now

    def _close(self, part: int, now: float) -> None:
        """Close the innermost open `part` (and anything a lost event left open inside it); the
        part around it runs again."""
        current = self.part
        if current is None:
            return
        spent = now - self.since
        if spent > 0.0:
            self.totals[current] += spent
        outer = self.outer
        while current != part and outer:
            current = outer.pop()
        self.part = outer.pop() if outer else None
        self.since = now

    # training activity -----------------------------------------------------------------------
    def activity(self, now: float) -> None:
        """Training work starts (a batch is drawn, a forward runs in train mode, a backward);
        called only while `idle` (the hot path checks the flag first)."""
        self.idle = False
        if self.steps["optimizer"] is None:
            self._steps_start(now)
        for step in self.live:
            step.fresh = False

    def _steps_start(self, now: float) -> None:
        """The first step starts: at the training's first work, or at the first pass's `iter()`
        before it (its wait for its input); startup ends with it (stamped at its marker, once that
        call has returned: the marker falls inside the phase). Never in a DataLoader worker."""
        if self.data_worker_process:
            return
        self.steps = {"optimizer": self._new_step(now), "backward": self._new_step(now)}
        self.live = list(self.steps.values())  # type: ignore[arg-type]
        self.unworked = self.attention = True
        self._switch("startup", "first_batch", now)

    def data_worker(self) -> None:
        """This process is a DataLoader worker: from now on no step, evaluation or checkpoint
        starts in it (see the module's text)."""
        if self.unsettled:
            self.settle()
        self.data_worker_process = True

    def loader_next(self, start: float, end: float, source: Any = None) -> None:
        if self.unsettled:
            self.settle()
        if self.in_eval:
            self.eval_work(start, source)
            self.eval_drawn = (start, end, source)
            self.eval_last = end
            return
        if self.thread_id() != self.step_thread:
            self.batches_elsewhere += 1
            return
        if self.quiet_forwards and self.idle:
            self.quiet_ends(start)
        totals = self.totals
        if source is None:  # not known: no row
            pass
        elif self.row and source is self.row_source:
            self.row += 1
            if totals[FORWARD] > self.row_forward:  # a forward ran since the batch before
                self.row_fed += 1
                self.row_forward = totals[FORWARD]
        else:  # the first of a row (one from another dataset ends the row before)
            self.row_ends(start)
            self.row, self.row_fed, self.row_source, self.row_since = 1, 0, source, start
            self.row_totals, self.row_batches, self.row_fresh = totals[:], self.batches, self.unworked
            self.row_forward_calls = self.forwards
            self.row_forward = totals[FORWARD]
        if self.idle:
            self.activity(start)
        self._data(start, end)
        self.batches += 1

    def loader_waited(self, start: float, end: float, source: Any = None) -> None:
        """A DataLoader call that drew no batch — a `__next__` at the iterator's end (an epoch's
        end, with non-persistent workers their shutdown), an `__iter__` (a pass's workers started:
        tens of ms a worker) — is the loop's wait for its input, so data if the step goes on, but no
        work of the step's: an evaluation or a checkpoint next moves the step's start past it
        (before, the evaluation after each epoch was inside the next step, as "other"). The first
        pass's, before any step, starts step 0; in an evaluation it is held (see eval_end)."""
        if self.unsettled:
            self.settle()
        if self.in_eval:
            self.eval_waited = (start, end, source)
            self.eval_last = end
            return
        if self.thread_id() != self.step_thread:
            return
        if self.quiet_forwards and self.idle:
            self.quiet_ends(start)
        if self.steps["optimizer"] is None:  # the first pass's: step 0 waits here (its workers fork)
            self._steps_start(start)
        self._data(start, end)

    def _data(self, start: float, end: float) -> None:
        """`start`–`end` inside a data source: data time, and a part open meanwhile paused."""
        current = self.part
        if current is not None:
            spent = start - self.since
            if spent > 0.0:
                self.totals[current] += spent
            self.since = end
        self.totals[DATA] += end - start

    def row_ends(self, now: float) -> None:
        """The row of batches drawn since the last backward() or step end ends without one: an
        evaluation from its first batch to `now` if it was long enough, every batch but the last
        fed to a forward, right after a step end, with no part open now (see the module's text)."""
        rows, self.row = self.row, 0
        if rows < IMPLICIT_EVAL_BATCHES or self.row_fed < rows - 1 or not self.row_fresh or self.part is not None:
            return
        self._give_back_row()
        self._past_eval(self.row_since, now, {"train_mode": True})

    def quiet_ends(self, now: float) -> None:
        """Forwards with no grad run between two steps (after a step end, before the next step's
        work) end with something other than that work: an evaluation from the first to `now`."""
        if self.quiet_forwards and self.idle and self.live:
            self._past_eval(self.quiet_since, now, {})

    def _past_eval(self, since: float, now: float, facts: dict[str, Any]) -> None:
        """An evaluation known once it is over, from `since` to `now`: its records alone, no
        markers (from `now` the next step's work runs); the steps start again at `now`."""
        since, tid = max(since, self.last_end), self.thread_id()
        if self._written("eval"):
            self.sink.write({"k": "B", "name": "eval", "ts": since, "tid": tid})
            self.sink.write({"k": "E", "name": "eval", "ts": now, "tid": tid, **facts})
        else:
            self._fold("eval", now - since, facts)
        self.quiet_forwards = 0
        self.last_end = now
        self._restart_fresh(now)

    def _give_back_row(self) -> None:
        """The step gets back what it had before the row's first batch, and starts again after
        the row (no work of its own before it)."""
        self.totals[:] = self.row_totals
        self.batches, self.forwards = self.row_batches, self.row_forward_calls
        for step in self.live:
            step.fresh, step.first_work = True, None

    def forward_begin(self, now: float, training: bool) -> None:
        if not training:
            if self.in_eval:
                self.eval_work(now)
                self.eval_fed_by()
                return
            # no grad, or a module in eval mode, with no train(False) around: an evaluation once
            # IMPLICIT_EVAL_FORWARDS run with no backward() or step end between (from the first);
            # until then the step's (a frozen teacher's, a target network's, an action chosen)
            self.quiet_forwards += 1
            if self.quiet_forwards == 1:
                self.quiet_since = now
            if self.quiet_forwards >= IMPLICIT_EVAL_FORWARDS:
                # the batches drawn since the step end were drawn for them: the evaluation's from
                # the first (the step gives them back; the row ends here, not counted again)
                self.eval_row = bool(self.row) and self.row_fresh and self.part is None
                self.row = 0
                self.eval_begin(self.quiet_since)
                self.eval_fed_by()
                return
            if self.idle:  # before the step's work: in its gap, as whatever else the loop does there
                return
        if self.attention or self.part is not None:
            if self.in_eval and self.eval_explicit and "eval" in self.stack:  # a loss module, in train mode
                self.eval_fed_by()
                return
            self._open(FORWARD, now)
        else:  # the step's work started, no part open: as in most steps
            self.part, self.since = FORWARD, now
        self.forwards += 1

    def forward_end(self, now: float) -> None:
        if self.part == FORWARD and not self.outer:  # the one part open: as in most steps
            self.totals[FORWARD] += now - self.since if now > self.since else 0.0
            self.part = None
        elif self.part == FORWARD or FORWARD in self.outer:
            self._close(FORWARD, now)
        else:  # (none open: an evaluation's forward, or one with no grad between two steps)
            self.eval_last = now

    def backward_begin(self, now: float) -> None:
        if self.attention or self.part is not None:
            self._open(BACKWARD, now)
        else:
            self.part, self.since = BACKWARD, now

    def backward_end(self, now: float, ends_step: bool = True) -> None:
        if self.part == BACKWARD and not self.outer:
            self.totals[BACKWARD] += now - self.since if now > self.since else 0.0
            self.part = None
        else:
            self._close(BACKWARD, now)
        if not ends_step:  # a differentiable gradient: its time, neither a backward() nor a step
            return
        self.backwards += 1
        self.quiet_forwards = self.row = 0
        # a closure's backward inside optimizer.step is part of that optimizer's step
        if not self.optimizer_stepped and self.optimizer_depth == 0:
            self.end_step("backward", now)

    def optimizer_created(self) -> None:
        if self.unsettled:
            self.settle()
        self.has_optimizer = True

    def optimizer_begin(self, now: float) -> None:
        depth = self.optimizer_depth
        self.optimizer_depth = depth + 1
        if depth:  # a wrapped optimizer's step calls the inner one: time the outer
            self.inner_steps += 1
            return
        if self.attention or self.part is not None:
            self._open(OPTIMIZER, now)
        else:
            self.part, self.since = OPTIMIZER, now

    def closure_begin(self, now: float) -> None:
        """optimizer.step's closure starts: its time is the step's forward (the loss, zero_grad)
        and backward, never optimizer (module forwards and backward nest inside it)."""
        if self.unsettled:
            self.settle()
        self._open(FORWARD, now)

    def closure_end(self, now: float) -> None:
        if self.unsettled:
            self.settle()
        self._close(FORWARD, now)

    def optimizer_end(self, now: float) -> None:
        depth = self.optimizer_depth
        if depth != 1:  # none open, or a wrapped optimizer's inner step ends
            self.optimizer_depth = depth - 1 if depth else 0
            return
        self.optimizer_depth = 0
        if self.part == OPTIMIZER and not self.outer:
            self.totals[OPTIMIZER] += now - self.since if now > self.since else 0.0
            self.part = None
        else:
            self._close(OPTIMIZER, now)
        if not self.optimizer_stepped:
            self.optimizer_stepped = self.has_optimizer = True
            self._set_step("backward", None)  # the backward stream stops: the optimizer's steps are the steps
        self.end_step("optimizer", now)

    def train_mode(self, now: float, mode: bool) -> None:
        if self.unsettled:
            self.settle()
        # batches drawn since the step ended, and nothing else yet: with train(False) next (skorch
        # draws the validation's first batch, then calls module.eval()), the evaluation's once it
        # does any work; not if training work comes first (a BatchNorm frozen by bn.eval())
        held = bool(self.row) and self.row_fresh and self.unworked and self.part is None
        self.row_ends(now)  # (it keeps the row's row_* fields: the held row is read from them)
        if mode:
            self.eval_end(now)
        else:
            if not self.in_eval:  # (skorch puts the module and the loss module in eval mode, one after the other)
                self.eval_row = held
                if self.quiet_forwards and self.idle and self.live:  # a prediction before it: its start
                    self.eval_begin(self.quiet_since)
            self.eval_begin(now, forwarded=False)

    # checkpoints -----------------------------------------------------------------------------
    def checkpoint_begin(self, now: float, name: str, file: str | None) -> bool:
        """False when a checkpoint phase is already open (a trainer's save around its torch.save
        and safetensors writes): the outer phase holds the inner writes, and lists their files."""
        if self.unsettled:
            self.settle()
        if self.data_worker_process:  # a dataset reading its samples with torch.load
            return False
        if any(p.startswith("checkpoint_") for p in self.stack):
            if file is not None and file not in self.checkpoint_files:
                self.checkpoint_files.append(file)
            return False
        self.row_ends(now)
        self.quiet_ends(now)
        self.eval_end(now)
        self.begin(name, now, file)
        self.checkpoint_files = [file] if file is not None else []
        return True

    def checkpoint_end(self, now: float, name: str) -> None:
        if self.unsettled:
            self.settle()
        self.end(name, now, files=self.checkpoint_files)
        self.checkpoint_files = []
        self._restart_fresh(self.last_end)

    # steps -----------------------------------------------------------------------------------
    def end_step(self, src: str, now: float) -> None:
        step = self.steps[src]
        if step is None:
            return
        counts = self.counts
        index = counts[src]
        counts[src] = index + 1
        peak_rss = peak_cuda = profiled = profiler_step = None
        resumed = now  # when the next step starts: after dlscope's own work at this step end
        tid = self.thread_id()
        if src == "optimizer" or not self.has_optimizer:  # the primary stream
            self.step_thread = tid
            if index == 0:
                self._switch("first_batch", "train_steps", now)
            if self.on_step is not None:
                self.on_step(index + 1, now)
            if self.eval_mode_check is not None:
                self.eval_mode_check(index)
                self.eval_mode_check = None
            profiled, profiler_step = self.next_profiled
            if now >= self.next_work:
                peak_rss, peak_cuda, resumed = self._between_steps(index, step.start, now)
            else:
                self.next_profiled = NOT_PROFILED
        totals = self.totals
        data, forward, backward, optimizer = totals
        data0, forward0, backward0, optimizer0 = step.totals
        if self.batches > step.batches:
            data, data_source = data - data0, "loader"
        else:
            gap = (now if step.first_work is None else step.first_work) - step.start
            data, data_source = (gap if gap > 0.0 else 0.0), "gap"
        self.sink.write_step(
            index,
            src,
            step.start,
            now,
            data,
            data_source,
            forward - forward0,
            backward - backward0,
            optimizer - optimizer0,
            self.backwards - step.backwards,
            self.forwards - step.forwards,
            peak_rss,
            peak_cuda,
            profiled,
            profiler_step,
            resumed - now,
            tid,
        )
        # the next step of this stream, in the same object (`steps` and `live` hold it)
        step.start = resumed
        step.totals = totals[:]
        step.backwards = self.backwards
        step.forwards = self.forwards
        step.batches = self.batches
        step.first_work = None
        step.fresh = True
        self.idle = self.unworked = self.attention = True
        self.quiet_forwards = self.row = 0

    def _between_steps(self, index: int, start: float, now: float) -> tuple[int | None, int | None, float]:
        """At a primary step end once `next_work` is due: peak memory (at most every
        MEMORY_INTERVAL_S) and the profiler (from its `idle_until`); (peak RSS, peak CUDA, when
        this work ended: the next step starts there)."""
        peak_rss = peak_cuda = None
        began = self.clock() if self.ended_late else now
        if now >= self.next_memory:
            self.next_memory = now + MEMORY_INTERVAL_S
            if self.memory is not None:
                peak_rss, peak_cuda = self.memory()
        profiler = self.profiler
        self.next_profiled = profiler.after_step(index, start, now) if now >= profiler.idle_until else NOT_PROFILED
        self.next_work = min(self.next_memory, profiler.idle_until)
        if self.watch is not None and self.watch(index, now):
            self.next_work = float("-inf")
        resumed = now + (self.clock() - began)
        return peak_rss, peak_cuda, resumed if resumed > now else now

    def finish(self, now: float, torch_attached: bool) -> None:
        """At exit: the facts a report needs to say whether the steps were observed at all."""
        if self.unsettled:
            self.settle()
        try:
            self.row_ends(now)
            self.quiet_ends(max(self.eval_last, self.quiet_since))  # (ended with its last forward)
            self.profiler.stop()
        finally:
            if self.in_eval and "eval" in self.stack:  # open at the end: it ended with its last work
                self.end("eval", self.eval_last, known_late=True)
            while self.stack:
                self.end(self.stack[-1], now)
            if self.phases_folded:
                self.sink.write({"k": "phases_folded", "phases": self.phases_folded})
            self.sink.write(
                {
                    "k": "observed",
                    "torch_attached": torch_attached,
                    "optimizer_steps": self.counts["optimizer"],
                    "backward_steps": self.counts["backward"],
                    "torch_optimizer": self.has_optimizer,
                    "batches_elsewhere": self.batches_elsewhere,
                    "pid": os.getpid(),
                }
            )
