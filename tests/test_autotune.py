"""--autotune: candidates timed on real training steps, the fastest applied, the evidence recorded."""

from __future__ import annotations

import pytest
import torch

import dlscope.autotune
from dlscope.autotune import DROP_ABOVE, MARGIN, MAX_SHARE, autotune, compile_bound, stages
from dlscope.checkpoint import CheckpointObserver, verify_checkpoint
from dlscope.data.loaders import normalise
from dlscope.measure.timing import StepTimer
from dlscope.models import build_model
from dlscope.report.sections.train import autotune_blocks
from dlscope.restore import load_checkpoint
from dlscope.train import StopAtAccuracy, TrainConfig, Trainer, make_optimizer, train_step

# 200 steps of batch 16: enough for every candidate of the cnn (threads, conv1, conv2, op order, optimizer)
TUNED = dict(model="cnn", epochs=1, batch_size=16, train_subset=3200, test_subset=500, autotune=True, log_every=10)


def test_the_fastest_candidate_trains_the_rest_of_the_run(mnist, tmp_path):
    checkpoints = CheckpointObserver(tmp_path)
    trainer = Trainer(TrainConfig(**TUNED), mnist, [checkpoints], tuner=autotune)
    result = trainer.fit()
    tune = result.autotune
    assert [s["stage"] for s in tune["stages"]] == ["threads", "conv1", "conv2", "op order", "optimizer"]
    # every timed step was a training step of this run, within the share tuning may take
    assert 0 < tune["steps"] <= MAX_SHARE * trainer.steps_per_epoch
    assert result.steps == trainer.steps_per_epoch == 200
    for stage in tune["stages"]:
        names = [c["name"] for c in stage["candidates"]]
        assert stage["chosen"] in names and len(set(names)) == len(names)
        # every candidate timed in full unless sequential elimination stopped it
        for c in stage["candidates"]:
            assert (c["dropped_after"] is None) == (c["steps"] == tune["timed_steps_per_candidate"])
    # the last stage's choice is what trains on, and it is how the model and optimizer now compute
    assert tune["chosen"] == tune["stages"][-1]["chosen"]
    assert tune["chosen"].startswith(trainer.model.layout.describe())
    assert torch.get_num_threads() == tune["threads"]
    assert all(bool(g["fused"]) == tune["fused_optimizer"] for g in trainer.optimizer.param_groups)
    assert not tune["compile"]["tried"] and trainer.step_model is trainer.model  # 200 steps cannot pay a compile
    assert tune["cost_s"] >= 0 and tune["seconds"] < result.wall_seconds
    assert result.final.test_acc > 90.0
    # the report states the decision, its evidence and its cost; each candidate's verdict in the table
    findings, table = autotune_blocks({"autotune": tune, "wall_seconds": result.wall_seconds})
    assert tune["chosen"] in findings.items[0][1] and f"{tune['cost_s']:.1f} s" in findings.items[0][1]
    verdicts = [row[-1] for row in table.rows]
    assert verdicts.count("kept") == len(tune["stages"])
    dropped = [c for stage in tune["stages"] for c in stage["candidates"] if c["dropped_after"] is not None]
    assert sum(v.startswith("dropped") for v in verdicts) == len(dropped)
    # the checkpoint keeps the layout, so a fresh model reloaded from it predicts exactly the same
    assert load_checkpoint(checkpoints.path)["layout"] == tune["layout"]
    assert verify_checkpoint(checkpoints.path, trainer.test_images, trainer.test_labels, trainer.model).ok


def test_explicit_threads_are_not_tuned():
    model = build_model("cnn")
    assert [name for name, _ in stages(model, torch.device("cpu"), tune_threads=False)] == [
        "conv1",
        "conv2",
        "op order",
    ]
    assert [name for name, _ in stages(build_model("net"), torch.device("cpu"))] in ([], ["threads"])
    adadelta = torch.optim.Adadelta(model.parameters())  # has no fused kernel: no optimizer stage
    assert "optimizer" not in [name for name, _ in stages(model, torch.device("cpu"), optimizer=adadelta)]


def test_too_short_a_run_keeps_the_default_and_says_why(mnist):
    config = TrainConfig(**{**TUNED, "train_subset": 320})
    result = Trainer(config, mnist, tuner=autotune).fit()
    assert "too few" in result.autotune["skipped"] and result.steps == 20


def test_compile_is_only_tried_when_the_rest_of_the_run_could_pay_it_back():
    assert not compile_bound(remaining_steps=900)["could_pay_back"]  # the rest of the lab's two epochs
    assert compile_bound(remaining_steps=14 * 469)["could_pay_back"]  # pytorch/examples' 14 epochs


class FakeTimer(StepTimer):
    """Runs every step for real but reports the duration `seconds_for(trainer)` gives for the
    configuration it ran under, on a clock of its own: the tuner's decisions from chosen timings."""

    def __init__(self, trainer, seconds_for):
        super().__init__(torch.device("cpu"))
        self.trainer, self.seconds_for, self.clock = trainer, seconds_for, 0.0

    def now(self):
        return self.clock

    def time_steps(self, step, n):
        seconds = []
        for _ in range(n):
            step()
            seconds.append(self.seconds_for(self.trainer))
            self.clock += seconds[-1]
        return seconds


def tuned(mnist, monkeypatch, seconds_for):
    # the timings are given, so the steps may be as small as they come: 200 steps of batch 8
    trainer = Trainer(
        TrainConfig(**{**TUNED, "threads": 1, "batch_size": 8, "train_subset": 1600}), mnist, tuner=autotune
    )
    monkeypatch.setattr(dlscope.autotune, "StepTimer", lambda device: FakeTimer(trainer, seconds_for))
    return trainer, trainer.fit().autotune


def test_a_candidate_is_chosen_only_when_measured_faster(mnist, monkeypatch):
    # conv2 channels-last 10% faster, everything else alike: only the conv2 stage changes anything
    def seconds_for(trainer):
        return 0.009 if trainer.model.layout.path(1) == "onednn-cl" else 0.010

    trainer, tune = tuned(mnist, monkeypatch, seconds_for)
    changed = {s["stage"]: s["changed"] for s in tune["stages"]}
    assert changed == {"conv1": False, "conv2": True, "op order": False, "optimizer": False}
    assert tune["layout"] == {"paths": ["onednn", "onednn-cl"], "pool_first": False} and not tune["fused_optimizer"]
    assert trainer.model.layout.path(1) == "onednn-cl"
    # below the margin, the incumbent stays
    slightly = 0.010 * (1 - MARGIN / 2)
    trainer, tune = tuned(mnist, monkeypatch, lambda t: slightly if t.model.layout.pool_first else 0.010)
    assert not any(s["changed"] for s in tune["stages"]) and tune["chosen"] == tune["default"]


def test_tuning_costs_only_the_slower_candidates_excess_time(mnist, monkeypatch):
    # the fused optimizer is twice as fast, conv1 on the native path 1.2× slower; every other candidate alike
    def seconds_for(trainer):
        if trainer.optimizer.param_groups[0]["fused"]:
            return 0.005
        return 0.012 if trainer.model.layout.path(0) == "native" else 0.010

    trainer, tune = tuned(mnist, monkeypatch, seconds_for)
    assert tune["fused_optimizer"] and trainer.optimizer.param_groups[0]["fused"]
    timed = tune["timed_steps_per_candidate"]
    fused_steps = native_steps = 2 + timed  # cold, warm-up and timed steps: neither was dropped
    others = tune["steps"] - fused_steps - native_steps
    assert tune["seconds"] == pytest.approx(0.010 * others + 0.005 * fused_steps + 0.012 * native_steps)
    # every stage's steps ran at its choice's pace, but for the native conv1's (2 ms beyond) and the foreach
    # optimizer's cold and warm-up steps (5 ms beyond the fused one's): the cost; the steps trained the model
    assert tune["cost_s"] == pytest.approx(native_steps * 0.002 + 2 * 0.005)
    # 2× slower than the fastest after its warm-up step: the foreach optimizer was timed no further
    foreach, fused = tune["stages"][-1]["candidates"]
    assert foreach["dropped_after"] == 0 and foreach["steps"] == 0 and DROP_ABOVE**2 < 2
    assert fused["dropped_after"] is None and fused["steps"] == tune["timed_steps_per_candidate"]


def test_scheduled_evaluation_stops_inside_the_epoch(mnist):
    config = TrainConfig(epochs=2, batch_size=64, train_subset=6000, test_subset=1000, eval_every=10, log_every=10)
    # 90%: reached near step 60 of the epoch's 94 (94% came at step 80, close to the epoch's own evaluation)
    trainer = Trainer(config, mnist, [StopAtAccuracy(90.0)])
    result = trainer.fit()
    steps = [e.step for e in result.evaluations]
    assert result.target_reached_step == steps[-1] and result.evaluations[-1].test_acc >= 90.0
    # scheduled ones every 10 steps, only once the training accuracy came within a point of the target
    assert all(s % 10 == 0 for s in steps[:-1])
    assert result.stopped_early and result.final.steps < trainer.steps_per_epoch * len(result.epochs)
    assert result.final.test_acc == result.evaluations[-1].test_acc  # no second evaluation at the stop


@pytest.mark.slow
def test_a_compile_that_could_pay_back_is_measured_and_kept_only_if_it_does(mnist, monkeypatch):
    monkeypatch.setattr(dlscope.autotune, "COMPILE_MIN_STEPS", 0)  # as if any run could pay a compile back
    trainer = Trainer(TrainConfig(**{**TUNED, "threads": 1}), mnist, tuner=autotune)
    result = trainer.fit()
    trial = result.autotune["compile"]
    assert trial["tried"]
    # with AVX2 kernels (ATEN_CPU_CAPABILITY=avx2) this torch build's Inductor code for the cnn
    # fails its own bounds check or trains to NaN: the failed trial is undone (tested below)
    if "failed" not in trial:
        assert trial["compile_s"] > 0 and trial["steps"] > 0
        faster = trial["compiled_step_ms"] < trial["eager_step_ms"] * (1 - MARGIN)
        assert trial["kept"] == (faster and trial["saving_s"] > trial["compile_s"])
    assert (trainer.step_model is not trainer.model) == trial["kept"]
    assert result.steps == trainer.steps_per_epoch and result.final.test_acc > 90.0


class NaNCompiled(torch.nn.Module):
    """Stands for a compile whose kernels are wrong on this machine: its steps train to NaN."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x) * float("nan")


class FailingCompiled(NaNCompiled):
    """Stands for a compile that raises in its third step (after two have trained the model)."""

    calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        FailingCompiled.calls += 1
        if FailingCompiled.calls == 3:
            raise RuntimeError("kernel.cpp:67, index out of bounds: 0 <= tmp7 < 4L\nand more lines")
        return super().forward(x)


@pytest.mark.parametrize("broken", [NaNCompiled, FailingCompiled])
def test_a_compile_whose_steps_fail_is_undone_and_training_goes_on(mnist, monkeypatch, broken):
    monkeypatch.setattr(dlscope.autotune, "COMPILE_MIN_STEPS", 0)
    monkeypatch.setattr(dlscope.autotune.torch, "compile", broken)
    trainer = Trainer(TrainConfig(**{**TUNED, "threads": 1}), mnist, tuner=autotune)
    result = trainer.fit()
    trial = result.autotune["compile"]
    assert trial["tried"] and not trial["kept"] and trainer.step_model is trainer.model
    expected = "RuntimeError: kernel.cpp:67, index out of bounds" if broken is FailingCompiled else "not finite"
    assert expected in trial["failed"] and "and more lines" not in trial["failed"]
    assert all(bool(torch.isfinite(p).all()) for p in trainer.model.parameters())
    epoch = result.epochs[-1]
    assert epoch.train_loss == epoch.train_loss  # not NaN: the failed steps' metrics were put back
    lost = 1 if broken is FailingCompiled else 0  # the step that raised drew its batch and never ended
    assert result.steps == trainer.steps_per_epoch - lost and result.final.test_acc > 90.0


def test_the_fused_optimizer_computes_the_same_update(mnist):
    x, y = normalise(mnist.train_images[:64]), mnist.train_labels[:64]
    params = []
    for fused in (False, True):
        torch.manual_seed(0)
        model = build_model("cnn")
        optimizer = make_optimizer(TrainConfig(), model)
        for step in range(4):
            if step == 2:  # switched as the autotuner switches it, with the optimizer's state under way
                for group in optimizer.param_groups:
                    group["fused"], group["foreach"] = (True, False) if fused else (None, None)
            train_step(model, optimizer, x, y)
        params.append(dict(model.named_parameters()))
    for name, value in params[0].items():
        torch.testing.assert_close(params[1][name], value, rtol=1e-4, atol=1e-6, msg=name)
