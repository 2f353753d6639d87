"""The step machine on recorded event sequences: no torch, no process."""

from __future__ import annotations

from typing import Any

import pytest

from dlscope.injob.stepmachine import PHASE_RECORDS, STEP_ARGS, StepMachine


class Records:
    def __init__(self) -> None:
        self.steps: list[dict[str, Any]] = []
        self.other: list[dict[str, Any]] = []

    def write(self, record: dict[str, Any]) -> None:
        self.other.append(record)

    def write_step(self, *values: Any) -> None:
        self.steps.append(dict(zip(STEP_ARGS, values, strict=True)))

    def phases(self) -> list[tuple[str, str]]:
        return [(r["k"], r["name"]) for r in self.other if r["k"] in "BE"]


class Profiler:
    """Labels the next step as torch's schedule would: wait 0, warmup 1, active 2, from step 1."""

    idle_until = float("-inf")  # asked at every step end

    def __init__(self) -> None:
        self.calls: list[int] = []
        self.spans: list[tuple[float, float]] = []  # each step's (start, end) as the profiler is told

    def after_step(self, index: int, start: float, now: float) -> tuple[str | None, int | None]:
        self.calls.append(index)
        self.spans.append((start, now))
        n = len(self.calls) - 1  # the profiler's own step number for the step that starts next
        return ({0: "warmup", 1: "active", 2: "active"}.get(n), n if n < 3 else None)

    def stop(self) -> None:
        pass


def machine(profiler: Any = None, memory: Any = None) -> tuple[StepMachine, Records]:
    records = Records()
    clock = [0.0]
    m = StepMachine(records, profiler, memory, clock=lambda: clock[0], thread_id=lambda: 1)
    m.begin("startup", 0.0)
    m.clock_cell = clock  # type: ignore[attr-defined]
    return m, records


def forward_backward(m: StepMachine, start: float, forward_end: float, backward_end: float) -> None:
    m.forward_begin(start, training=True)
    m.forward_end(forward_end)
    m.backward_begin(forward_end)
    m.backward_end(backward_end)


def plain_step(m: StepMachine, t: float, closure_calls: int = 0) -> float:
    """loader 1, forward 2, backward 3, optimizer 1 (with closures: each a forward 2 + backward 3)."""
    m.loader_next(t, t + 1)
    forward_backward(m, t + 1, t + 3, t + 6)
    t += 6
    m.optimizer_begin(t)
    for _ in range(closure_calls):
        forward_backward(m, t, t + 2, t + 5)
        t += 5
    m.clock_cell[0] = t + 1  # type: ignore[attr-defined]
    m.optimizer_end(t + 1)
    return t + 1


def parts_sum(step: dict[str, Any]) -> float:
    return step["data"] + step["forward"] + step["backward"] + step["optimizer"]


def test_plain_loop_one_step_per_optimizer_step_parts_add_up():
    m, r = machine()
    m.optimizer_created()
    t = 0.0
    for _ in range(3):
        t = plain_step(m, t)
    opt = [s for s in r.steps if s["src"] == "optimizer"]
    assert [s["i"] for s in opt] == [0, 1, 2]
    assert all((s["data"], s["forward"], s["backward"], s["optimizer"]) == (1, 2, 3, 1) for s in opt)
    assert all(parts_sum(s) == s["end"] - s["start"] for s in opt)
    assert r.phases()[:4] == [("B", "startup"), ("E", "startup"), ("B", "first_batch"), ("E", "first_batch")]


def test_closure_time_is_forward_and_backward_not_optimizer_and_one_step():
    m, r = machine()
    m.optimizer_created()
    t = 0.0
    for _ in range(2):
        t = plain_step(m, t, closure_calls=20)  # LBFGS: ~20 closure calls per step
    steps = r.steps
    assert [s["src"] for s in steps] == ["backward", "optimizer", "optimizer"]  # one backward before the first step
    opt = steps[1:]
    for s in opt:
        assert s["optimizer"] == pytest.approx(1.0)
        assert s["forward"] == pytest.approx(2 + 20 * 2)
        assert s["backward"] == pytest.approx(3 + 20 * 3)
        assert s["backwards"] == 21
        assert parts_sum(s) == pytest.approx(s["end"] - s["start"])


def test_closures_before_the_first_step_do_not_end_steps():
    """LBFGS with the closure doing all the work: no backward outside optimizer.step."""
    m, r = machine(Profiler())
    m.optimizer_created()
    t = 0.0
    for _ in range(3):
        m.optimizer_begin(t)
        for _ in range(5):
            forward_backward(m, t, t + 1, t + 2)
            t += 2
        m.optimizer_end(t)
    assert [(s["src"], s["i"]) for s in r.steps] == [("optimizer", 0), ("optimizer", 1), ("optimizer", 2)]


def test_profiler_driven_by_optimizer_steps_only_and_labels_from_it():
    """The first backward() must not start the profiler inside step 0 (off by one before)."""
    profiler = Profiler()
    m, r = machine(profiler)
    m.optimizer_created()
    t = 0.0
    for _ in range(5):
        t = plain_step(m, t)
    assert profiler.calls == [0, 1, 2, 3, 4]
    opt = [s for s in r.steps if s["src"] == "optimizer"]
    assert [(s["profiled"], s["profiler_step"]) for s in opt] == [
        (None, None),
        ("warmup", 0),
        ("active", 1),
        ("active", 2),
        (None, None),
    ]


def test_the_profiler_is_told_each_steps_span_an_evaluation_and_a_checkpoint_before_it_left_out():
    """What the profiler records as a step is the step: after an evaluation and a checkpoint
    between two steps, the next step starts after them (its ProfilerStep mark, from the last
    step's end, holds them: the profiler's top-10 takes the steps' operators by these spans)."""
    profiler = Profiler()
    m, _ = machine(profiler)
    m.optimizer_created()
    t = plain_step(m, 0.0)
    m.train_mode(t + 1, False)
    m.loader_next(t + 2, t + 3, "val")
    m.forward_begin(t + 3, training=False)
    m.forward_end(t + 4)
    m.train_mode(t + 5, True)
    m.clock_cell[0] = t + 7  # type: ignore[attr-defined]
    assert m.checkpoint_begin(t + 6, "checkpoint_save", "last.ckpt")
    m.checkpoint_end(t + 7, "checkpoint_save")
    end = plain_step(m, t + 8)
    assert profiler.spans == [(0.0, t), (t + 7, end)]


def test_no_optimizer_steps_end_at_backward_and_drive_the_profiler():
    profiler = Profiler()
    m, r = machine(profiler)
    for k in range(3):
        forward_backward(m, k * 4.0, k * 4.0 + 2, k * 4.0 + 3)
    assert [(s["src"], s["i"]) for s in r.steps] == [("backward", 0), ("backward", 1), ("backward", 2)]
    assert profiler.calls == [0, 1, 2]
    # the gap from a backward's end to the next forward
    assert r.steps[1]["data_source"] == "gap" and r.steps[1]["data"] == pytest.approx(1.0)


def test_a_differentiable_gradient_is_backward_time_and_no_step():
    """No optimizer: each iteration takes a gradient penalty (autograd.grad, create_graph=True),
    then backward(): one step each, both gradients its backward, one backward() counted."""
    m, r = machine()
    for k in range(3):
        t = k * 10.0
        m.forward_begin(t, training=True)
        m.forward_end(t + 2)
        m.backward_begin(t + 2)
        m.backward_end(t + 4, False)  # the penalty's gradient
        m.backward_begin(t + 5)
        m.backward_end(t + 8)
    assert [(s["src"], s["i"]) for s in r.steps] == [("backward", 0), ("backward", 1), ("backward", 2)]
    assert all((s["backward"], s["backwards"]) == (5.0, 1) for s in r.steps)


def test_batches_another_thread_draws_are_no_data_of_the_steps():
    """A prefetching thread draws from the DataLoader while the loop's thread runs the steps: its
    time is no wait of the loop's, and the draws are counted apart."""
    records = Records()
    thread = [1]  # the thread each event comes from: the loop's (1) or the prefetcher's (2)
    m = StepMachine(records, clock=lambda: 0.0, thread_id=lambda: thread[0])
    m.optimizer_created()
    t = 0.0
    for _ in range(3):
        thread[0] = 2
        m.loader_next(t, t + 5)  # inside the loop's step, as far as the clock goes
        thread[0] = 1
        forward_backward(m, t + 1, t + 3, t + 6)
        m.optimizer_begin(t + 6)
        m.optimizer_end(t + 7)
        t += 7
    later = [s for s in records.steps if s["src"] == "optimizer"][1:]  # (the first starts at its first work)
    assert len(later) == 2 and all((s["data"], s["data_source"], s["forward"]) == (1.0, "gap", 2.0) for s in later)
    m.finish(t, torch_attached=True)
    assert records.other[-1]["batches_elsewhere"] == 3


def test_wrapped_optimizer_nested_step_is_one_step():
    m, r = machine()
    m.optimizer_created()
    forward_backward(m, 0, 1, 2)
    m.optimizer_begin(2)  # accelerate's AcceleratedOptimizer.step
    m.optimizer_begin(2.5)  # the torch optimizer inside it
    m.optimizer_end(3)
    m.optimizer_end(3.5)
    opt = [s for s in r.steps if s["src"] == "optimizer"]
    assert len(opt) == 1 and opt[0]["optimizer"] == pytest.approx(1.5)


def test_gradient_accumulation_is_one_step_with_its_micro_batches():
    m, r = machine()
    m.optimizer_created()
    t = 0.0
    for _ in range(4):
        m.loader_next(t, t + 1)
        forward_backward(m, t + 1, t + 2, t + 3)
        t += 3
    m.optimizer_begin(t)
    m.optimizer_end(t + 1)
    opt = [s for s in r.steps if s["src"] == "optimizer"]
    assert len(opt) == 1
    assert (opt[0]["data"], opt[0]["forward"], opt[0]["backward"], opt[0]["backwards"]) == (4, 4, 4, 4)
    assert opt[0]["forwards"] == 4


def test_eval_forwards_are_an_eval_phase_and_leave_the_step_untouched():
    m, r = machine()
    m.optimizer_created()
    t = plain_step(m, 0.0)
    m.train_mode(t, False)
    for k in range(3):
        m.forward_begin(t + k, training=False)
        m.forward_end(t + k + 1)
    m.train_mode(t + 10, True)
    plain_step(m, t + 10)
    assert [p for p in r.phases() if p[1] == "eval"] == [("B", "eval"), ("E", "eval")]
    second = [s for s in r.steps if s["src"] == "optimizer"][1]
    assert second["start"] == t + 10 and second["forward"] == 2  # eval time belongs to no step


def test_an_evaluation_after_an_epochs_end_is_in_no_step_and_a_loss_module_in_it_is_its_work():
    """The loop's `for` ends its loader (a `__next__` with no batch), then evaluates with
    model.eval() and no no_grad(): the model's forwards in eval mode and a loss module's in train
    mode are the evaluation's, one phase; the next step starts after it, its parts its own (before:
    the epoch's end made the step start its work, so the evaluation was inside it, as "other")."""
    m, r = machine()
    m.optimizer_created()
    t = plain_step(m, 0.0)
    m.loader_waited(t, t + 0.5)
    m.train_mode(t + 1, False)
    for k in range(3):
        m.loader_next(t + 1 + 3 * k, t + 2 + 3 * k, "val")
        m.forward_begin(t + 2 + 3 * k, training=False)  # the model, in eval mode
        m.forward_end(t + 3 + 3 * k)
        m.forward_begin(t + 3 + 3 * k, training=True)  # the loss module, in train mode
        m.forward_end(t + 4 + 3 * k)
    m.train_mode(t + 12, True)
    end = plain_step(m, t + 12)
    assert eval_spans(r) == [(t + 1, t + 12)]
    step = r.steps[-1]
    assert (step["start"], step["end"], step["data"], step["forward"], step["backward"]) == (t + 12, end, 1, 2, 3)


def test_a_module_put_in_eval_mode_is_an_evaluation_only_once_it_draws_or_runs_a_forward():
    """`bn.eval()` at each step (a BatchNorm frozen) draws no batch and runs no forward with no
    grad: no eval phase, no record per step. `model.eval()` then a validation forward: an eval
    phase from that forward."""
    m, r = machine()
    m.optimizer_created()
    t = plain_step(m, 0.0)
    for _ in range(3):
        m.loader_next(t, t + 1)
        m.train_mode(t + 1, False)  # the BatchNorm's eval(): an outermost train(False)
        forward_backward(m, t + 2, t + 3, t + 4)  # the model's training forward ends it
        m.optimizer_begin(t + 4)
        m.optimizer_end(t + 5)
        t += 5
    assert not [p for p in r.phases() if p[1] == "eval"]
    assert [s["data"] for s in r.steps if s["src"] == "optimizer"][1:] == [1.0] * 3
    m.train_mode(t + 1, False)
    m.forward_begin(t + 3, training=False)
    m.forward_end(t + 4)
    m.train_mode(t + 5, True)
    evals = [(rec["k"], rec["ts"]) for rec in r.other if rec["k"] in "BE" and rec["name"] == "eval"]
    assert evals == [("B", t + 3), ("E", t + 5)]


def replay_step(m: StepMachine, t: float) -> float:
    """A step on a batch from a replay buffer (no DataLoader): forward 2, backward 3, optimizer 1."""
    forward_backward(m, t, t + 2, t + 5)
    m.optimizer_begin(t + 5)
    m.optimizer_end(t + 6)
    return t + 6


def test_no_grad_forwards_are_an_evaluation_only_from_enough_in_a_row():
    """Under no_grad alone (no eval()): 2 a step before its training forward (DQN's action and
    target, its batch from a replay buffer) are the step's gap; 6 in a row between two steps (a
    validation loop) are one eval phase, from the first."""
    m, r = machine()
    m.optimizer_created()
    t = plain_step(m, 0.0)
    for _ in range(3):
        for k in range(2):
            m.forward_begin(t + k, training=False)
            m.forward_end(t + k + 0.5)
        t = replay_step(m, t + 2)
    assert not [p for p in r.phases() if p[1] == "eval"]
    opt = [s for s in r.steps if s["src"] == "optimizer"]
    # their time is the step's (in its interval), not forward: none of its work had started
    assert [(s["end"] - s["start"], s["data"], s["data_source"], s["forward"]) for s in opt[1:]] == [
        (8.0, 2.0, "gap", 2.0)
    ] * 3
    for k in range(6):
        m.forward_begin(t + k, training=False)
        m.forward_end(t + k + 0.5)
    plain_step(m, t + 10)
    evals = [rec for rec in r.other if rec["k"] in "BE" and rec["name"] == "eval"]
    assert [(rec["k"], rec["ts"]) for rec in evals] == [("B", t), ("E", t + 11)]
    assert [s for s in r.steps if s["src"] == "optimizer"][-1]["start"] == t + 11  # eval time: no step's


def test_a_prediction_with_no_grad_between_two_steps_is_an_evaluation_whatever_the_modes():
    """One forward with no grad after each optimizer step, the model left in train mode (no
    eval()): ended by the next step's batch drawn, it was an evaluation from its start, in no
    step; so when a checkpoint, the epoch's end or train(False) ends it (the last one joins the
    evaluation that train(False) starts), or the process's end (it ended with its forward). A
    forward with no grad right after the batch is drawn (a frozen teacher's) stays the step's
    forward."""
    m, r = machine()
    m.optimizer_created()
    t = plain_step(m, 0.0)
    spans = []
    for _ in range(3):
        m.forward_begin(t + 1, training=False)
        m.forward_end(t + 3)
        spans.append((t + 1, t + 4))
        end = plain_step(m, t + 4)
        step = r.steps[-1]
        assert (step["start"], step["end"], step["data"], step["forward"], step["forwards"]) == (t + 4, end, 1, 2, 1)
        t = end
    assert eval_spans(r) == spans
    m.forward_begin(t + 1, training=False)
    m.forward_end(t + 2)
    assert m.checkpoint_begin(t + 3, "checkpoint_save", "model.pt")
    m.checkpoint_end(t + 4, "checkpoint_save")
    assert eval_spans(r)[-1] == (t + 1, t + 3)
    t = plain_step(m, t + 4)
    m.forward_begin(t + 1, training=False)
    m.forward_end(t + 2)
    m.loader_waited(t + 3, t + 5, "train")  # the epoch's end
    assert eval_spans(r)[-1] == (t + 1, t + 3)
    t = plain_step(m, t + 5)
    m.forward_begin(t + 1, training=False)
    m.forward_end(t + 2)
    m.train_mode(t + 3, False)
    m.loader_next(t + 4, t + 5, "val")
    m.forward_begin(t + 5, training=False)
    m.forward_end(t + 6)
    m.train_mode(t + 7, True)
    assert eval_spans(r)[-1] == (t + 1, t + 7)
    t = plain_step(m, t + 7)
    m.loader_next(t, t + 1)
    m.forward_begin(t + 1, training=False)  # the teacher's, on the batch just drawn
    m.forward_end(t + 2)
    forward_backward(m, t + 2, t + 4, t + 7)
    m.optimizer_begin(t + 7)
    m.optimizer_end(t + 8)
    assert len(eval_spans(r)) == 6 and r.steps[-1]["forward"] == 3
    m.forward_begin(t + 9, training=False)  # a last prediction, then the script's own end
    m.forward_end(t + 10)
    m.finish(t + 15, torch_attached=True)
    assert eval_spans(r)[-1] == (t + 9, t + 10)


def test_the_first_passs_iter_is_step_0s_data():
    """The first pass's iter() (its DataLoader forks its workers there) starts step 0: its data,
    not startup's; an evaluation's iter() is the evaluation's, unless the batch drawn next from
    that loader is the next step's (its pass started in eval mode); a module put in eval mode
    around it that does no work leaves it to the step (a BatchNorm frozen). An evaluation open
    when the process ends ended with its last work."""
    m, r = machine()
    m.optimizer_created()
    m.loader_waited(1.0, 3.0, "train")
    end = plain_step(m, 3.0)
    step = r.steps[-1]
    assert (step["i"], step["start"], step["end"], step["data"]) == (0, 1.0, end, 3.0)
    marks = [(rec["k"], rec["name"], rec["ts"]) for rec in r.other if rec["k"] in "BE"]
    assert marks[:3] == [("B", "startup", 0.0), ("E", "startup", 1.0), ("B", "first_batch", 1.0)]
    t = end + 1
    m.train_mode(t, False)  # a validation with model.eval() over a loader with workers
    m.loader_waited(t + 1, t + 3, "val")
    for k in range(2):
        m.loader_next(t + 3 + 2 * k, t + 4 + 2 * k, "val")
        m.forward_begin(t + 4 + 2 * k, training=False)
        m.forward_end(t + 5 + 2 * k)
    m.loader_waited(t + 7, t + 8, "val")  # its end: the evaluation's
    m.train_mode(t + 9, True)
    assert eval_spans(r)[-1] == (t + 1, t + 9)
    t = plain_step(m, t + 9)
    for k in range(4):  # a validation under no_grad alone, then the next epoch with no train() call
        m.loader_next(t + 2 * k, t + 2 * k + 1, "val")
        m.forward_begin(t + 2 * k + 1, training=False)
        m.forward_end(t + 2 * k + 2)
    m.loader_waited(t + 8, t + 9, "val")
    m.loader_waited(t + 9, t + 11, "train")  # the next pass's iter()
    end = train_step(m, t + 11)
    # one evaluation, from its first batch (drawn for its forwards: before, the step kept those
    # batches, and they were counted again as an evaluation of their own where the row ended)
    assert len(eval_spans(r)) == 2 and eval_spans(r)[-1] == (t, t + 9)
    step = r.steps[-1]
    assert (step["start"], step["data"], step["forward"]) == (t + 9, 3, 2)
    t = end
    m.train_mode(t, False)  # a BatchNorm frozen before the pass: no work of an evaluation's
    m.loader_waited(t, t + 2, "train")
    m.train_mode(t + 2, True)
    t = plain_step(m, t + 2)
    assert r.steps[-1]["data"] == 3
    m.train_mode(t + 1, False)  # the last evaluation: open when the process ends, later
    m.loader_waited(t + 1, t + 2, "val")
    m.loader_next(t + 2, t + 3, "val")
    m.forward_begin(t + 3, training=False)
    m.forward_end(t + 4)
    m.loader_waited(t + 4, t + 5, "val")
    m.finish(t + 9, torch_attached=True)
    assert eval_spans(r)[-1] == (t + 1, t + 5)


def test_a_dataloader_workers_process_starts_no_step_and_no_phase():
    """A worker forked inside no_grad() runs its dataset's transforms (modules) with no grad: no
    evaluation; nor a torch.load of its samples a checkpoint; nor anything else a step."""
    m, r = machine()
    m.end("startup", 0.0)  # (a forked child has none)
    r.other.clear()
    m.data_worker()
    for k in range(8):
        m.forward_begin(float(k), training=False)
        m.forward_end(k + 0.5)
    m.train_mode(9.0, False)
    m.forward_begin(10.0, training=False)
    m.forward_end(11.0)
    assert not m.checkpoint_begin(12.0, "checkpoint_load", "sample.pt")
    m.optimizer_created()
    m.loader_next(13.0, 14.0, "x")
    forward_backward(m, 14.0, 15.0, 16.0)
    m.optimizer_begin(16.0)
    m.optimizer_end(17.0)
    m.finish(18.0, torch_attached=True)
    assert r.steps == [] and [rec["k"] for rec in r.other] == ["observed"]


def fed_batches(m: StepMachine, t: float, n: int, source: str) -> float:
    """`n` batches of `source`, each fed to a training forward (no backward): 1 + 2 each."""
    for _ in range(n):
        m.loader_next(t, t + 1, source)
        m.forward_begin(t + 1, training=True)
        m.forward_end(t + 3)
        t += 3
    return t


def train_step(m: StepMachine, t: float, source: str = "train") -> float:
    m.loader_next(t, t + 1, source)
    forward_backward(m, t + 1, t + 3, t + 6)
    m.optimizer_begin(t + 6)
    m.optimizer_end(t + 7)
    return t + 7


def eval_spans(r: Records) -> list[tuple[float, float]]:
    marks = [rec["ts"] for rec in r.other if rec["k"] in "BE" and rec["name"] == "eval"]
    return list(zip(marks[::2], marks[1::2], strict=True))


def test_batches_fed_to_training_forwards_with_no_backward_were_an_evaluation():
    """A validation loop with neither eval() nor no_grad(): known when a batch of another dataset
    comes, it is an eval phase from its first batch, and the step it was counted in gets back
    what it had; an epoch's end (no batch: source None) between changes nothing."""
    m, r = machine()
    m.optimizer_created()
    t = train_step(m, 0.0)
    m.loader_next(t, t + 0.5, None)  # the training loader's StopIteration
    val = t + 0.5
    t = fed_batches(m, val, 5, "val")
    t = train_step(m, t)
    assert eval_spans(r) == [(val, val + 15)]
    step = r.steps[-1]
    assert (step["start"], step["end"], step["data"], step["forward"], step["forwards"], step["data_source"]) == (
        val + 15,
        t,
        1,
        2,
        1,
        "loader",
    )
    t = fed_batches(m, t, 4, "val")  # the last pass: ended by the process's end
    m.finish(t + 1, torch_attached=True)
    assert eval_spans(r)[-1] == (t - 12, t + 1)


def test_batches_ended_by_a_backward_or_drawn_back_to_back_stay_the_steps():
    """Four batches each fed to a forward, then one backward() on the summed loss: training. Four
    drawn back to back, then a forward and backward each (the HF Trainer's gradient accumulation
    draws its micro-batches first): training, even when another dataset's batch ends them."""
    m, r = machine()
    m.optimizer_created()
    t = train_step(m, 0.0)
    t = fed_batches(m, t, 4, "train")
    m.backward_begin(t)
    m.backward_end(t + 3)
    m.optimizer_begin(t + 3)
    m.optimizer_end(t + 4)
    assert (r.steps[-1]["data"], r.steps[-1]["forward"], r.steps[-1]["backward"]) == (4, 8, 3)
    t += 4
    for k in range(4):
        m.loader_next(t + k, t + k + 1, "train")
    m.loader_next(t + 4, t + 5, "unlabelled")
    t = train_step(m, t + 5)
    assert not eval_spans(r)
    assert r.steps[-1]["data"] == 6


def test_checkpoint_inside_a_trainer_save_is_one_phase_listing_its_files():
    m, r = machine()
    assert m.checkpoint_begin(1.0, "checkpoint_save", "last.ckpt")
    assert not m.checkpoint_begin(1.1, "checkpoint_save", None)  # Lightning's torch.save into memory
    m.checkpoint_end(2.0, "checkpoint_save")
    assert m.checkpoint_begin(3.0, "checkpoint_save", None)  # the HF Trainer's _save_checkpoint
    for name in ("model.safetensors", "optimizer.pt"):
        assert not m.checkpoint_begin(3.1, "checkpoint_save", name)
    m.checkpoint_end(4.0, "checkpoint_save")
    ends = [x for x in r.other if x.get("name") == "checkpoint_save" and x["k"] == "E"]
    assert [e["files"] for e in ends] == [["last.ckpt"], ["model.safetensors", "optimizer.pt"]]


def test_activation_checkpoint_recompute_is_forward_not_backward_twice():
    m, r = machine()
    m.optimizer_created()
    m.forward_begin(0, True)
    m.forward_end(2)
    m.backward_begin(2)
    m.forward_begin(3, True)  # recompute inside backward
    m.forward_end(4)
    m.backward_end(6)
    m.optimizer_begin(6)
    m.optimizer_end(7)
    s = next(s for s in r.steps if s["src"] == "optimizer")
    assert (s["forward"], s["backward"], s["optimizer"]) == (3, 3, 1)


def test_memory_is_sampled_at_a_bounded_rate():
    reads: list[int] = []

    def memory() -> tuple[int, None]:
        reads.append(1)
        return 100, None

    m, r = machine(memory=memory)
    m.optimizer_created()
    for k in range(100):  # 100 steps within 0.5 s
        m.optimizer_begin(k * 0.005)
        m.optimizer_end(k * 0.005 + 0.001)
    assert len(reads) == 5
    assert sum(s["peak_rss"] is not None for s in r.steps) == 5


def test_finish_records_whether_steps_were_observed():
    m, r = machine()
    m.finish(1.0, torch_attached=True)
    observed = r.other[-1]
    assert observed["k"] == "observed" and observed["optimizer_steps"] == 0 and observed["backward_steps"] == 0
    assert r.phases()[-1] == ("E", "startup")


def test_a_closure_is_forward_and_backward_never_optimizer():
    """optimizer.step(closure): the closure's own time (the loss, zero_grad) is forward, its module
    forward and backward are theirs; optimizer is only what the step spends outside the closure."""
    m, records = machine()
    m.optimizer_created()
    m.optimizer_begin(0.0)
    m.closure_begin(1.0)
    forward_backward(m, 2.0, 3.0, 5.0)  # module forward 1, backward 2
    m.closure_end(6.0)  # 2 of the closure's own
    m.optimizer_end(8.0)
    [step] = records.steps
    assert (step["forward"], step["backward"], step["optimizer"]) == (3.0, 2.0, 3.0)


@pytest.mark.parametrize("marked", [False, True])
def test_a_batch_drawn_before_its_train_or_eval_call_goes_with_the_work_it_was_drawn_for(marked):
    """skorch's loop draws a batch, then calls module.train() or module.eval() in its step
    function: the validation's first batch is drawn in train mode, the next epoch's first
    training batch in eval mode. The evaluation runs from its first batch to the next step's
    batch, and that step is its own (before: the step around the evaluation held it, as other).
    With phase markers (an I/O tracer's), the evaluation's end is stamped where the batch was
    drawn, not when the marker is written."""
    m, r = machine()
    m.optimizer_created()
    marks: list[str] = []
    if marked:
        m.marker = (lambda name: marks.append("B " + name), lambda name: marks.append("E " + name))

    def skorch_train_step(t: float) -> float:
        m.loader_next(t, t + 1, "train")
        m.train_mode(t + 1, True)  # the module's, then the loss module's
        m.train_mode(t + 1, True)
        forward_backward(m, t + 1, t + 3, t + 6)
        m.optimizer_begin(t + 6)
        m.optimizer_end(t + 7)
        return t + 7

    t = 0.0
    for _ in range(3):
        t = skorch_train_step(t)
    m.loader_waited(t, t + 0.5)  # the training loader's StopIteration
    val = t = t + 0.5
    for _ in range(3):
        m.loader_next(t, t + 1, "val")
        m.train_mode(t + 1, False)
        m.train_mode(t + 1, False)
        m.forward_begin(t + 1, training=False)
        m.forward_end(t + 2)
        t += 2
    m.loader_waited(t, t + 0.5)
    train_batch = t = t + 0.5
    t = skorch_train_step(t)
    assert eval_spans(r) == [(val, train_batch)]
    assert [mark for mark in marks if mark.endswith(" eval")] == (["B eval", "E eval"] if marked else [])
    step = r.steps[-1]
    assert (step["start"], step["end"], step["data"], step["forward"], step["backward"], step["optimizer"]) == (
        train_batch,
        t,
        1,
        2,
        3,
        1,
    )
    # an evaluation whose loop draws one batch more than it uses (a `break` after n batches): that
    # batch, of the evaluation's own dataset, stays its own
    m.train_mode(t, False)
    for k in range(3):
        m.loader_next(t + 2 * k, t + 2 * k + 1, "val")
        m.forward_begin(t + 2 * k + 1, training=False)
        m.forward_end(t + 2 * k + 2)
    m.loader_next(t + 6, t + 7, "val")
    m.train_mode(t + 7, True)
    assert eval_spans(r)[-1] == (t, t + 7)


def test_phases_past_the_records_kept_of_a_name_are_counted_with_their_files():
    """A checkpoint at every step of a long job: its first PHASE_RECORDS phases are written, the
    rest counted (with the files they wrote, a bounded list) and written once at exit."""
    m, r = machine()
    for k in range(PHASE_RECORDS + 3):
        m.checkpoint_begin(2.0 * k, "checkpoint_save", f"ckpt-{k % 30}.pt")
        m.checkpoint_end(2.0 * k + 1, "checkpoint_save")
    m.finish(1e4, torch_attached=True)
    assert len([x for x in r.other if x.get("name") == "checkpoint_save"]) == 2 * PHASE_RECORDS
    (folded,) = [x["phases"] for x in r.other if x["k"] == "phases_folded"]
    expected = [f"ckpt-{k % 30}.pt" for k in range(PHASE_RECORDS, PHASE_RECORDS + 3)]
    assert folded == {"checkpoint_save": {"count": 3, "seconds": 3.0, "train_mode": 0, "files": expected}}


def test_a_training_batch_drawn_ahead_of_a_validation_is_neither_its_nor_in_the_step_around_it():
    """Lightning draws the next training batch before it validates (its fetcher keeps one ahead),
    then calls model.eval() and draws the validation's own batches: the evaluation runs from its
    first batch, and the step after it starts where it ended (its batch was drawn before)."""
    m, r = machine()
    m.optimizer_created()
    t = train_step(m, 0.0)
    m.loader_next(t, t + 1, "train")  # drawn ahead
    m.train_mode(t + 1, False)
    val = t + 2
    t = fed_batches(m, val, 3, "val")  # (forwards in eval mode: the evaluation's)
    m.train_mode(t, True)
    forward_backward(m, t + 1, t + 3, t + 6)
    m.optimizer_begin(t + 6)
    m.optimizer_end(t + 7)
    assert eval_spans(r)[-1] == (val, t)
    step = r.steps[-1]
    assert (step["start"], step["data_source"], step["forward"], step["backward"]) == (t, "gap", 2, 3)
