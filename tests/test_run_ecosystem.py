"""`dlscope run` on the ways the ecosystem drives a step — LBFGS closures, `optimizer.step(closure)`,
accelerate's wrapped optimizer, the Hugging Face Trainer, Lightning — each checked against the
truth the script itself prints (tests/scripts/). Tiny models, a few steps each."""

from __future__ import annotations

import csv
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dlscope.analysis import timeline
from dlscope.analysis.observed import PHASE_ROWS
from dlscope.analysis.stepfile import StepFile
from dlscope.analysis.steptable import open_stream, row
from dlscope.cli import main
from dlscope.injob.stepmachine import PHASE_RECORDS
from dlscope.rundir import load_results

SCRIPTS = Path(__file__).parent / "scripts"
FAST_PROFILE = ["--profile-steps", "2", "--wait", "1", "--warmup", "1"]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]


def observe_ranks(tmp_path: Path, capfd: pytest.CaptureFixture, argv: list[str]) -> tuple[dict, list[dict[str, str]]]:
    """Run `argv` under `dlscope run`; its sections and the `TRUTH k=v ...` lines it printed."""
    out = tmp_path / "run"
    code = main(["run", "--out", str(out), *FAST_PROFILE, "--", *argv])
    printed = capfd.readouterr().out
    assert code == 0, printed[-3000:]
    # Ranks print at once, and an unbuffered print writes its text and its newline apart
    # (PYTHONUNBUFFERED), so one rank's record may land in the middle of another's line.
    records = [r.partition("\n")[0] for r in re.split(r"(?=TRUTH )", printed)[1:]]
    truths = [dict(re.findall(r"(\w+)=(\S*)", record)) for record in records]
    assert truths, printed[-3000:]
    sections = load_results(out)["sections"]
    sections["steps"]["file"] = str(out / sections["steps"]["file"])  # recorded relative to the run directory
    return sections, truths


def observe(tmp_path: Path, capfd: pytest.CaptureFixture, argv: list[str]) -> tuple[dict, dict[str, str]]:
    sections, (truth,) = observe_ranks(tmp_path, capfd, argv)
    return sections, truth


def step_rows(sections: dict) -> list[dict]:
    """Every counted step of the training process, read back from its step file."""
    steps = StepFile(sections["steps"]["file"])
    loader = steps.codes["data_source"].index("loader")
    return [row(step, 0.0, steps.codes, loader) for step in open_stream(steps)[1]]


def check_anatomy(sections: dict) -> None:
    """Parts never overlap: measured parts add up to no more than the step, in every step."""
    rows = step_rows(sections)
    assert rows
    for r in rows:
        measured = r["data_ms"] + r["forward_ms"] + r["backward_ms"] + r["optimizer_ms"]
        assert measured <= 1.01 * r["ms"] + 0.01, r
    anatomy = sections["anatomy"]
    assert 99.0 <= sum(anatomy["percent"].values()) <= 101.0


def check_profiler_labels(sections: dict) -> None:
    """The steps labelled active are the training steps the profiler recorded, each with its operators."""
    active = {r["step"] for r in step_rows(sections) if r["profiled"] == "active"}
    recorded = {s["step"] for s in sections["top10"]["ops_per_step"] if s["ops"] > 0}
    assert active and active == recorded


def check_fed_steps(sections: dict, truth: dict[str, str]) -> None:
    """The exact step count, fed by a DataLoader, parts adding up, profiler windows labelled right."""
    steps = sections["steps"]
    assert (steps["source"], steps["count"]) == ("optimizer", int(truth["steps"]))
    assert sections["anatomy"]["data_source"] == "loader"
    check_anatomy(sections)
    check_profiler_labels(sections)


def phase_totals(sections: dict) -> dict[str, dict]:
    return {t["phase"]: t for t in sections["phases"]["totals"]}


UNPICKLED_OPTIMIZER = """
import sys, torch
model, optimizer = torch.load(sys.argv[1], weights_only=False)  # an Adagrad this process never built
for _ in range(3):
    optimizer.zero_grad()
    model(torch.ones(2, 4)).sum().backward()
    optimizer.step()
print("TRUTH steps=3")
"""


def test_an_unpickled_optimizer_steps_are_counted(tmp_path, capfd):
    """Its `__init__` never runs in the observed process (torch.load of a whole optimizer, or the
    copy a spawned worker receives): its class is timed when it is unpickled."""
    model = torch.nn.Linear(4, 2)
    torch.save((model, torch.optim.Adagrad(model.parameters())), tmp_path / "saved.pt")
    script = tmp_path / "unpickled.py"
    script.write_text(UNPICKLED_OPTIMIZER)
    sections, truth = observe(tmp_path, capfd, [sys.executable, str(script), str(tmp_path / "saved.pt")])
    assert (sections["steps"]["source"], sections["steps"]["count"]) == ("optimizer", int(truth["steps"]))
    assert all(r["optimizer_ms"] > 0 for r in step_rows(sections))


@pytest.mark.timing
@pytest.mark.slow
def test_lbfgs_one_step_per_optimizer_step_however_many_closures(tmp_path, capfd):
    sections, truth = observe(tmp_path, capfd, [sys.executable, str(SCRIPTS / "lbfgs_closure.py"), "--steps", "5"])
    steps = sections["steps"]
    assert (steps["source"], steps["count"]) == ("optimizer", int(truth["steps"]))  # hooks attached after find_spec
    check_anatomy(sections)
    # the closures' time is forward and backward: optimizer is only what LBFGS spends outside them
    # (a margin for the hooks' own calls: 20% and 1 ms over 5 steps)
    optimizer_ms = sum(r["optimizer_ms"] for r in step_rows(sections))
    assert optimizer_ms <= 1.2 * float(truth["optimizer_own_ms"]) + 1.0
    check_profiler_labels(sections)


@pytest.mark.slow
def test_closure_step_with_a_loader_a_checkpoint_and_a_warning(tmp_path, capfd):
    data = tmp_path / "data"
    data.mkdir()
    sections, truth = observe(tmp_path, capfd, [sys.executable, str(SCRIPTS / "closure_step.py"), str(data)])
    check_fed_steps(sections, truth)
    phases = phase_totals(sections)
    assert phases["checkpoint_save"]["count"] == int(truth["saves"])
    assert phases["checkpoint_save"]["files"] == [str(data / "model.pt")]
    assert phases["checkpoint_load"]["count"] == int(truth["loads"])
    assert truth["warnings_at"] == truth["warning_line"]  # torch.load's warning names the user's line


def check_batches(sections: dict, truth: dict[str, str], out: Path) -> None:
    """The batch x-ray inside a trainer's own loaders (training and evaluation): every batch taken
    is found where it was built, and every training step but the first is joined to the batch it
    drew (Lightning draws one batch ahead: its first is drawn before the first step starts)."""
    batches = sections["batches"]
    assert batches["batches_taken"] == batches["joined"] > 0
    with open(out / batches["file"], newline="") as f:
        drawn = {int(r["step"]) for r in csv.DictReader(f) if r["step"]}
    assert set(range(1, int(truth["steps"]))) <= drawn <= set(range(int(truth["steps"])))
    # one loader fed the steps; the evaluation loaders' passes are the evaluations, drawn in no step
    training = [lo for lo in batches["loaders"] if lo["in_steps"]]
    assert len(training) == 1 and training[0]["in_steps"] >= int(truth["steps"]) - 1
    assert sum(lo["passes"] for lo in batches["loaders"] if not lo["in_steps"]) == int(truth["evaluations"])


def check_trainer_run(sections: dict, truth: dict[str, str]) -> None:
    """Steps, anatomy, data from the loader, evaluations and checkpoints as the trainer says."""
    check_fed_steps(sections, truth)
    phases = phase_totals(sections)
    assert phases["eval"]["count"] == int(truth["evaluations"])
    assert phases["checkpoint_save"]["count"] == int(truth["saves"])
    assert set(truth["files"].split(",")) <= set(phases["checkpoint_save"]["files"])


@pytest.mark.slow
def test_lightning_fit_with_validation_and_checkpoints(tmp_path, capfd):
    ckpt = tmp_path / "ckpt"
    sections, truth = observe(tmp_path, capfd, [sys.executable, str(SCRIPTS / "lightning_fit.py"), str(ckpt)])
    check_trainer_run(sections, truth)
    check_batches(sections, truth, tmp_path / "run")
    for r in step_rows(sections):  # backward runs inside optimizer.step's closure: counted once
        assert r["backward_ms"] > 0 and r["forward_ms"] > 0


@pytest.mark.slow
def test_hf_trainer_through_accelerate_with_eval_and_checkpoints(tmp_path, capfd):
    out = tmp_path / "trainer"
    sections, truth = observe(tmp_path, capfd, [sys.executable, str(SCRIPTS / "hf_trainer.py"), str(out)])
    check_trainer_run(sections, truth)
    check_batches(sections, truth, tmp_path / "run")


@pytest.mark.slow
def test_accelerate_wrapped_optimizer_with_gradient_accumulation(tmp_path, capfd):
    sections, truth = observe(
        tmp_path, capfd, [sys.executable, str(SCRIPTS / "accelerate_loop.py"), "--accumulate", "2"]
    )
    check_fed_steps(sections, truth)  # one step per real optimizer step, two micro-batches each


def check_ranks(sections: dict, truths: list[dict[str, str]]) -> None:
    """Every rank seen with its own steps; DataLoader workers are no ranks; phases summed over ranks."""
    by_rank = {p["rank"]: p for p in sections["steps"]["processes"] if p["rank"] is not None}
    assert sorted(by_rank) == sorted(int(t["rank"]) for t in truths) == sections["run"]["ranks"]
    for t in truths:
        assert (by_rank[int(t["rank"])]["source"], by_rank[int(t["rank"])]["count"]) == ("optimizer", int(t["steps"]))
    check_anatomy(sections)
    phases = phase_totals(sections)
    assert phases["eval"]["count"] == sum(int(t["evaluations"]) for t in truths)
    assert phases["checkpoint_save"]["count"] == sum(int(t["saves"]) for t in truths)
    files = {f for t in truths for f in t["files"].split(",") if f}
    assert files and files <= set(phases["checkpoint_save"]["files"])
    distributed = sections["distributed"]
    assert distributed["world_size"] == 2 and distributed["ranks_traced"] == [0, 1]
    for rank in distributed["ranks"]:  # DDP all-reduces every gradient byte once per step
        assert 0.99 <= rank["bytes_vs_grad"] <= 1.1
    # ranks that all-reduce are no ranks apart (test_ranks_apart.py)
    assert not any(f["key"] == "distributed.ranks_apart" for f in sections["run"].get("findings", []))


@pytest.mark.slow
def test_lightning_ddp_under_torchrun(tmp_path, capfd):
    script = [str(SCRIPTS / "lightning_fit.py"), str(tmp_path / "ckpt"), "--devices", "2"]
    sections, truths = observe_ranks(tmp_path, capfd, [*TORCHRUN, *script])
    check_ranks(sections, truths)


@pytest.mark.slow
def test_hf_trainer_under_torchrun_with_loader_workers(tmp_path, capfd):
    script = [str(SCRIPTS / "hf_trainer.py"), str(tmp_path / "trainer"), "--workers", "1"]
    sections, truths = observe_ranks(tmp_path, capfd, [*TORCHRUN, *script])
    check_ranks(sections, truths)
    assert sections["anatomy"]["data_source"] == "loader"
    workers = [p for p in sections["run"]["processes"] if p["forked"] or "--multiprocessing-fork" in p["argv"]]
    assert workers and all(p["rank"] is None for p in workers)


@pytest.mark.timing
def test_a_loop_taking_its_gradients_with_autograd_grad_has_a_step_at_each(tmp_path, capfd):
    """No optimizer, no backward(): `torch.autograd.grad` and a hand-written update. Each call is
    a step, and its time is the step's backward (the update under no_grad after it ends the step)."""
    argv = [sys.executable, str(SCRIPTS / "grad_loops.py"), "functional"]
    sections, truth = observe(tmp_path, capfd, argv)
    assert (sections["steps"]["source"], sections["steps"]["count"]) == ("update", int(truth["steps"]))
    rows = step_rows(sections)
    assert all(r["backward_ms"] > 0 for r in rows)
    grad_ms = [float(ms) for ms in truth["step_grad_ms"].split(",")]
    # dlscope's clocks run inside the script's (each row rounded to the µs)
    assert sum(r["backward_ms"] for r in rows) <= sum(grad_ms) + 0.05
    # The script's clock around autograd.grad also holds dlscope's work at the step's end: the
    # profiler's start and stop (seconds at the first steps), the step's row (~20 µs). Compared
    # where that is all: from the third step, outside the profiler's window.
    steady = [i for i, r in enumerate(rows) if i >= 2 and r["profiled"] is None]
    assert steady and sum(rows[i]["backward_ms"] for i in steady) >= 0.75 * sum(grad_ms[i] for i in steady)
    check_anatomy(sections)


@pytest.mark.timing
@pytest.mark.parametrize("mode", ["sgd", "data", "decorated", "metric", "tensors", "bare", "bare_set", "bare_read"])
def test_a_parameter_update_the_script_writes_itself_is_the_steps_optimizer_part(tmp_path, capfd, mode):
    """No torch optimizer: each update under no_grad after backward() (`p -= lr * p.grad`, through
    `.data`, in a function decorated with @torch.no_grad(), of plain tensors with no module) or
    outside it through `.data` (`p.data.add_(...)` after clip_grad_norm_, as pytorch/examples'
    word_language_model; `p.data = p.data - ...`) is its step's optimizer part, and the step ends
    with it; a metric computed under no_grad between backward() and the update is not, nor are
    `.data` reads outside no_grad (a weight norm logged). Before, the update was "other" and the
    optimizer read 0% (outside no_grad: until now)."""
    argv = [sys.executable, str(SCRIPTS / "own_update.py"), mode]
    sections, truth = observe(tmp_path, capfd, argv)
    steps = sections["steps"]
    assert (steps["source"], steps["count"]) == ("update", int(truth["steps"]))
    (place,) = steps["update_places"]
    assert (Path(place["file"]).name, place["line"]) == ("own_update.py", int(truth["update_line"]))
    assert place["steps"] == int(truth["steps"])
    assert place["kind"] == ("data" if mode in ("bare", "bare_set") else "no_grad")
    rows = step_rows(sections)
    update_ms = [float(ms) for ms in truth["step_update_ms"].split(",")]
    # dlscope's clock runs inside the script's around each update (each row rounded to the µs)
    assert all(r["optimizer_ms"] <= ms + 0.01 for r, ms in zip(rows, update_ms, strict=True))
    # and holds most of it where dlscope does nothing else at the step's end (from the third step,
    # outside the profiler's window): the script's clock also holds dlscope's step end and, on a
    # busy machine, the waits for a core that fall there (a few ms in one step), so the median
    # step's share
    steady = [i for i, r in enumerate(rows) if i >= 2 and r["profiled"] is None]
    shares = sorted(rows[i]["optimizer_ms"] / update_ms[i] for i in steady)
    assert len(steady) >= 20 and shares[len(shares) // 2] >= 0.65, shares
    assert sections["anatomy"]["percent"]["optimizer"] > 0
    check_anatomy(sections)
    check_profiler_labels(sections)


@pytest.mark.timing
def test_an_update_through_data_that_only_backward_follows_is_timed_from_the_second_step(tmp_path, capfd):
    """Plain tensors, a function as the model and the loss, batches drawn before training: no event
    of the step machine's comes between an update through `.data` and the next backward(), which
    the C fast path times without one. The first update's window is found stale at the next
    `.data` (that update is lost), backward() is timed through Python from then on, and every later
    update is its step's optimizer part; before this, the update at the process's exit alone was
    counted: one step in all."""
    argv = [sys.executable, str(SCRIPTS / "own_update.py"), "bare_functional"]
    sections, truth = observe(tmp_path, capfd, argv)
    steps = sections["steps"]
    assert (steps["source"], steps["count"]) == ("update", int(truth["steps"]) - 1)
    (place,) = steps["update_places"]
    assert (Path(place["file"]).name, place["line"]) == ("own_update.py", int(truth["update_line"]))
    assert place["kind"] == "data" and place["steps"] == steps["count"]
    rows = step_rows(sections)
    update_ms = [float(ms) for ms in truth["step_update_ms"].split(",")][1:]  # the first: lost
    assert all(r["optimizer_ms"] <= ms + 0.01 for r, ms in zip(rows, update_ms, strict=True))
    check_anatomy(sections)


@pytest.mark.timing
def test_a_gradient_penalty_is_backward_time_inside_the_step_not_a_step(tmp_path, capfd):
    """WGAN-GP's penalty: `autograd.grad(create_graph=True)` inside each optimizer step. One step
    per optimizer step, and the penalty's gradient counted as backward, not "other"."""
    argv = [sys.executable, str(SCRIPTS / "grad_loops.py"), "penalty"]
    sections, truth = observe(tmp_path, capfd, argv)
    assert (sections["steps"]["source"], sections["steps"]["count"]) == ("optimizer", int(truth["steps"]))
    backwards = [int(step["backwards"]) for step in open_stream(StepFile(sections["steps"]["file"]))[1]]
    assert set(backwards) == {1}  # the loss's backward(): the penalty's gradient is no backward() of its own
    grad_ms, backward_ms = ([float(ms) for ms in truth[k].split(",")] for k in ("step_grad_ms", "step_backward_ms"))
    # From the third step: the first two hold dlscope's one-time work (the backward stream's step
    # end before the first optimizer step, the first step's records) inside the script's clocks.
    steady = slice(2, None)
    measured = sum(r["backward_ms"] for r in step_rows(sections)[steady])
    grad, backward = sum(grad_ms[steady]), sum(backward_ms[steady])
    # the penalty's gradient is in it (backward() alone would be `backward`), and dlscope's clocks
    # run inside the script's (each row rounded to the µs)
    assert backward + 0.5 * grad <= measured <= backward + grad + 0.05
    check_anatomy(sections)


@pytest.mark.timing
def test_a_step_the_gradscaler_skips_is_still_a_step_and_is_named(tmp_path, capfd):
    """Mixed precision: `GradScaler.step` skips the optimizer's step when it finds inf or NaN
    gradients. Each iteration is a step all the same (before, a skipped one was lumped into the
    next), the skipped ones are named, and the scaler's own check is the step's optimizer time."""
    argv = [sys.executable, str(SCRIPTS / "amp_scaler.py")]
    sections, truth = observe(tmp_path, capfd, argv)
    steps = sections["steps"]
    skipped = [int(i) for i in truth["skipped"].split(",")]
    assert (steps["source"], steps["count"]) == ("optimizer", int(truth["steps"]))
    assert steps["scaler_skipped"]["count"] == len(skipped) and steps["scaler_skipped"]["first_steps"] == skipped
    rows = step_rows(sections)
    scaler_ms = [float(ms) for ms in truth["scaler_step_ms"].split(",")]
    assert sum(r["optimizer_ms"] for r in rows) <= sum(scaler_ms) + 0.05  # inside the script's clock
    # The script's clock around scaler.step also holds dlscope's step-end work: the profiler's
    # start and stop (seconds at the first steps), the step's row (~20 µs of a ~0.2 ms scaler.step).
    # Compared where that is all, step by step (a stall of a few ms in one step's part outside the
    # optimizer's clock moved a sum of ~36 steps of ~0.2 ms by a third); the median step's share.
    steady = [i for i, r in enumerate(rows) if i >= 2 and r["profiled"] is None]
    shares = sorted(rows[i]["optimizer_ms"] / scaler_ms[i] for i in steady)
    assert len(steady) >= 20 and shares[len(shares) // 2] >= 0.65, shares
    check_anatomy(sections)
    report = " ".join((tmp_path / "run" / "report.md").read_text().split())
    # two NaN losses of 40 steps past the scale's start: over the warning's threshold
    assert f"{len(skipped)} of {truth['steps']} steps were skipped by the GradScaler" in report
    assert "2 of them (5% of the steps) came after the start of the run" in report


@pytest.mark.timing
@pytest.mark.parametrize("style", ["neither", "eval-grad", "eval-no-grad", "per-batch"])
def test_a_validation_pass_after_each_epoch_is_an_evaluation_in_no_step(tmp_path, capfd, style):
    """Each validation pass is one eval phase, and no step's interval holds any of it: with
    neither eval() nor no_grad() (a student's: training forwards on batches of its own loader, no
    backward; before, they were the next epoch's first step, doubling the steps' forward time),
    with eval() alone (its loss module runs in train mode with grad; before, it ended the eval
    phase at each batch: 30 phases), or with both (the loader's end before it made the next step
    start its work: the pass was inside that step, as "other"), or set as skorch sets them, in
    each batch's step function once its batch is drawn (before, the step around the evaluation
    held it, as "other"). A loss summed over four batches before one backward() stays training."""
    argv = [sys.executable, str(SCRIPTS / "naive_validation.py"), "--style", style]
    sections, truth = observe(tmp_path, capfd, argv)
    assert (sections["steps"]["source"], sections["steps"]["count"]) == ("optimizer", int(truth["steps"]))
    evals = [r["seconds"] * 1e3 for r in sections["phases"]["rows"] if r["phase"] == "eval"]
    passes = [float(ms) for ms in truth["val_ms"].split(",")]
    assert len(evals) == len(passes)
    # each from its first batch's draw, or its loader's iter() after model.eval(), to the next
    # training pass's (the last: to the process's end), as the script saw those begin on the same
    # clock (naive_validation.py's text)
    for measured, known in zip(evals[:-1], truth["val_span_ms"].split(",")[:-1], strict=True):
        assert abs(measured - float(known)) <= 1.0 + 0.01 * float(known), (evals, truth["val_span_ms"])
    rows = step_rows(sections)
    spans = [(r["begin_ts"], r["end_ts"]) for r in sections["phases"]["rows"] if r["phase"] == "eval"]
    for r in rows:  # (a step's start is rounded to the µs)
        assert not [s for s in spans if r["start_s"] + r["ms"] / 1e3 > s[0] + 1e-6 and r["start_s"] < s[1] - 1e-6], r
    assert sum(r["forward_ms"] for r in rows) <= 1.1 * float(truth["forward_ms"]) + 5.0
    assert sum(r["data_source"] == "loader" for r in rows) == len(rows)
    check_anatomy(sections)
    batches = sections["batches"]
    assert batches["in_steps"] == int(truth["steps"]) - 1 + 4  # the summed pass drew four
    # what to change: train mode in an evaluation; grad on in one (the model's forwards: a batch each)
    phases = sections["phases"]
    expected = {"neither": (3, 0), "eval-grad": (0, int(truth["val_batches"]))}.get(style, (0, 0))
    assert (phases.get("evals_in_train_mode", 0), phases.get("eval_grad_forwards", 0)) == expected
    report = " ".join((tmp_path / "run" / "report.md").read_text().split())
    assert ("3 evaluations ran in train mode with grad" in report) == (style == "neither")
    assert ("in evaluations ran with grad on" in report) == (style == "eval-grad")


@pytest.mark.timing
def test_a_pass_that_starts_its_workers_waits_in_data_not_other(tmp_path, capfd):
    """A DataLoader whose workers are not persistent starts them at each iter(): the loop's wait
    for its input, in the data of the pass's first step (before, its "other": the HF Trainer's
    first step of an epoch with 2 workers read 60 ms of other), the first pass's too (before,
    step 0's data began at its first batch, the iter() before it left to startup: 16 ms of data
    against the script's own 198 ms)."""
    sections, truth = observe(tmp_path, capfd, [sys.executable, str(SCRIPTS / "epoch_workers.py")])
    rows = {r["step"]: r for r in step_rows(sections)}
    iter_ms = [float(t) for t in truth["iter_ms"].split(",")]
    # step 0: from the first iter() to its first batch in hand, as the script clocked it around
    # both (dlscope's clocks run inside the script's: never more, less by the loop's own calls)
    waited = float(truth["first_ms"].split(",")[0])
    assert 0.9 * waited - 2.0 <= rows[0]["data_ms"] <= waited + 0.5, (rows[0], waited)
    for first, started in zip(truth["firsts"].split(",")[1:], iter_ms[1:], strict=True):
        r = rows[int(first)]
        assert r["data_ms"] >= 0.9 * started and r["other_ms"] < 0.5 * started + 1.0, (r, started)
    check_anatomy(sections)


@pytest.mark.timing
@pytest.mark.parametrize("persistent", [False, True])
def test_an_evaluation_whose_loader_starts_its_workers_is_one_evaluation_with_its_wait(tmp_path, capfd, persistent):
    """Workers started inside an evaluation's no_grad() run the dataset's transform (a module, as
    torchvision's are) with no grad: no evaluation of their own (before, each worker opened an
    eval phase that never closed: 9 evaluations for 3, and 5 with persistent workers). Each
    evaluation is as long as the script's own clock says: from its loader's iter() (its workers'
    start and the sampler's shuffle: before, left out, in no phase and no step), the last one to
    its last batch, not to the process's end (before, the script's 300 ms after it were in it)."""
    argv = [sys.executable, str(SCRIPTS / "eval_workers.py"), *(["--persistent"] if persistent else [])]
    sections, truth = observe(tmp_path, capfd, argv)
    assert sections["steps"]["count"] == int(truth["steps"])
    phases = sections["phases"]
    evals = next(t for t in phases["totals"] if t["phase"] == "eval")
    assert evals["count"] == int(truth["evals"]) == 3
    rows = [r for r in phases["rows"] if r["phase"] == "eval"]
    assert all(r["closed"] for r in rows)
    # the script's clock runs from model.eval() to the pass's end; dlscope's phase from the
    # loader's iter() to model.train() (the last: to its last batch's wait). A few ms either side
    for phase, known in zip(rows, truth["eval_ms"].split(","), strict=True):
        assert abs(1e3 * phase["seconds"] - float(known)) <= 5.0 + 0.05 * float(known), (rows, truth["eval_ms"])


@pytest.mark.timing
def test_a_prediction_with_no_grad_after_each_step_is_an_evaluation_in_no_step(tmp_path, capfd):
    """A prediction under torch.no_grad() after each optimizer step, the model left in train mode:
    an evaluation each (before, none: its time was the next step's "other"), as long as the
    script's own clock says, and its operators on the timeline lie in those phases, not in a step."""
    sections, truth = observe(tmp_path, capfd, [sys.executable, str(SCRIPTS / "predict_each_step.py")])
    assert sections["steps"]["count"] == int(truth["steps"])
    evals = next(t for t in sections["phases"]["totals"] if t["phase"] == "eval")
    predict_ms = float(truth["predict_ms"])
    assert evals["count"] == int(truth["predictions"])
    # each from its forward to the next batch's draw (the last: to its forward's end), the
    # script's clock from before no_grad() to after the argmax
    seconds = 1e3 * evals["seconds"]
    assert 0.95 * predict_ms - 2.0 <= seconds <= 1.05 * predict_ms + 2.0 * evals["count"], (evals, predict_ms)
    other_ms = [r["other_ms"] for r in step_rows(sections)[1:]]  # (step 0's has the start-up)
    assert sum(other_ms) / len(other_ms) < 0.5 * predict_ms / evals["count"]  # in no step's time
    check_anatomy(sections)
    trace = timeline.load(tmp_path / "run" / "timeline.json")
    (pid,) = {key[0] for key, name in trace.track_names.items() if name == "steps"}
    steps = trace.tracks_named(pid, "steps")
    phases = [s for s in trace.tracks_named(pid, "phases") if s.name == "eval"]
    ops = [s for key, s in trace.all_slices("cpu_op") if key[0] == pid]
    in_eval = [o for o in ops if timeline.inside(o.start, o.end, phases, 1.0)]
    assert in_eval and not [o for o in in_eval if timeline.inside(o.start, o.end, steps, 1.0)]


@pytest.mark.timing
def test_an_agent_acting_in_eval_mode_at_every_update_is_named_and_stays_bounded(tmp_path, capfd):
    """stable-baselines3's DQN shape: an eval phase at every update, the agent acting. Past the
    records a process keeps of a phase name, its phases are counted, not written: the records and
    results.json stay bounded at any length (before, 4,749 such phases made a 1.65 MB results.json
    of a 50 s run), and the report says what the phases are."""
    steps = PHASE_RECORDS + 100
    sections, truth = observe(tmp_path, capfd, [sys.executable, str(SCRIPTS / "agent_loop.py"), "--steps", str(steps)])
    assert (sections["steps"]["count"], int(truth["steps"])) == (steps, steps)
    phases = sections["phases"]
    evals = next(t for t in phases["totals"] if t["phase"] == "eval")
    assert evals["count"] == steps and phases["folded"] == {"eval": steps - PHASE_RECORDS}
    act_s = float(truth["act_ms"]) / 1e3
    assert 0.9 * act_s <= evals["seconds"] <= 1.2 * act_s + 0.1, (evals, act_s)
    assert sum(r["phase"] == "eval" for r in phases["rows"]) == PHASE_ROWS
    assert phases["rows_left_out"] == PHASE_RECORDS - PHASE_ROWS
    (records,) = (tmp_path / "run" / "processes").glob("*.jsonl")
    assert len(records.read_text().splitlines()) <= 2 * PHASE_RECORDS + 40
    report = " ".join((tmp_path / "run" / "report.md").read_text().split())
    assert f"eval ran {steps:,} times over {steps:,} steps, about once a step or more" in report
    assert f"{steps - PHASE_RECORDS:,} more eval phases were counted, not written" in report


@pytest.mark.parametrize("mode", ["forgot", "right", "adversarial", "teacher"])
def test_steps_that_train_a_model_left_in_eval_mode_are_named(tmp_path, capfd, mode):
    """A model.train() missing after an evaluation: the steps that trained the model in eval mode,
    exactly, and none where the model trains in train mode (an attack crafted in eval mode, a
    frozen teacher in eval mode beside it)."""
    sections, truth = observe(tmp_path, capfd, [sys.executable, str(SCRIPTS / "eval_mode.py"), mode])
    steps = sections["steps"]
    assert steps["count"] == int(truth["steps"])
    if not int(truth["eval_mode_steps"]):
        assert "eval_mode_steps" not in steps
        return
    moded = steps["eval_mode_steps"]
    count, first = int(truth["eval_mode_steps"]), int(truth["first"])
    assert (moded["steps"], moded["first"], moded["last"]) == (count, first, first + count - 1)
    assert moded["layers"] == ["BatchNorm1d", "Dropout"]
    report = " ".join((tmp_path / "run" / "report.md").read_text().split())
    assert f"{count} of {truth['steps']} steps trained Sequential in eval mode" in report


def test_a_run_that_sees_no_step_is_a_failed_observation(tmp_path, capfd):
    """Inference only: torch imported (after a find_spec), no optimizer, no backward. The command's
    status passes through; the run is not "ok", and the report says why."""
    script = tmp_path / "infer.py"
    script.write_text(
        "import importlib.util\nimportlib.util.find_spec('torch')\nimport torch\n"
        "with torch.no_grad():\n    torch.nn.Linear(4, 2)(torch.ones(3, 4))\n"
    )
    out = tmp_path / "run"
    assert main(["run", "--out", str(out), "--", sys.executable, str(script)]) == 0
    results = load_results(out)
    run = results["sections"]["run"]
    assert (run["steps_seen"], run["torch_attached"], results["run"]["status"]) == (0, True, "failed")
    assert "No training step was observed" in (out / "report.md").read_text()


def test_the_phases_table_names_every_file_of_a_trainer_checkpoint():
    """A Trainer checkpoint writes five files in one phase: the table names each, none cut short."""
    from dlscope.report.blocks import Table
    from dlscope.report.sections import phases

    folder = "out/checkpoint-10"
    names = ["model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state.pth", "training_args.bin"]
    totals = [{"phase": "checkpoint_save", "count": 1, "seconds": 0.1, "files": [f"{folder}/{n}" for n in names]}]
    [table] = [block for block in phases.render({"totals": totals, "rows": []}) if isinstance(block, Table)]
    cell = table.rows[0][3]
    assert cell.startswith(folder) and all(n in cell for n in names)


def test_gradscaler_skips_only_at_the_start_are_information():
    """Skips while the loss scale comes down (steps 0, 1, … in a row) and one now and then are
    what mixed precision does: no warning; the steps are named as ranges."""
    from dlscope.report.sections import steps

    level, text = steps.scaler_skipped({"count": 8, "first_steps": [0, 1, 2, 3, 4, 5, 6, 2050], "leading": 7}, 4000)
    assert level == "info" and "(steps 0–6, 2050)" in text and "The first 7 are the loss scale" in text
    level, text = steps.scaler_skipped({"count": 60, "first_steps": list(range(3, 63)), "leading": 0}, 1000)
    assert level == "warn" and "60 of them (6% of the steps)" in text


def test_a_parameters_data_at_an_update_place_saves_and_computes_as_a_plain_tensor(tmp_path):
    """At a place known to update through `.data`, `p.data` is dlscope's tensor type while the
    update's window is open: its writes are timed, and everything else is as torch's — results of
    other calls are plain tensors, and a file saved from it loads where dlscope is not."""
    from dlscope.injob.updates import view_class

    class Seen:
        writes = 0

        def view_wrote(self) -> None:
            self.writes += 1

    seen = Seen()
    p = torch.nn.Parameter(torch.ones(4))
    view = p.data.as_subclass(view_class(seen))
    view.add_(torch.ones(4), alpha=2.0)
    view[0] = 7.0
    assert seen.writes == 2 and p.tolist() == [7.0, 3.0, 3.0, 3.0]
    assert type(view * 2) is torch.Tensor and type(view.sum()) is torch.Tensor and seen.writes == 2
    torch.save({"w": view}, tmp_path / "w.pt")
    code = "import torch, sys; w = torch.load(sys.argv[1])['w']; print(type(w).__name__, w.tolist())"
    loaded = subprocess.run([sys.executable, "-c", code, str(tmp_path / "w.pt")], capture_output=True, text=True)
    assert loaded.stdout.split(None, 1) == ["Tensor", "[7.0, 3.0, 3.0, 3.0]\n"], loaded.stderr
