"""--autotune: candidates timed on real training steps, the fastest applied, the evidence recorded."""

from __future__ import annotations

import torch

from dlscope.autotune import MAX_SHARE, compile_decision, stages
from dlscope.checkpoint import CheckpointObserver, load_checkpoint, verify_checkpoint
from dlscope.models import build_model
from dlscope.train import StopAtAccuracy, TrainConfig, Trainer

# 160 steps of batch 16: enough for every candidate of the cnn (threads, conv1, conv2, op order)
TUNED = dict(model="cnn", epochs=1, batch_size=16, train_subset=2560, test_subset=500, autotune=True, log_every=10)


def test_the_fastest_candidate_trains_the_rest_of_the_run(mnist, tmp_path):
    checkpoints = CheckpointObserver(tmp_path)
    trainer = Trainer(TrainConfig(**TUNED), mnist, [checkpoints])
    result = trainer.fit()
    tune = result.autotune
    assert [s["stage"] for s in tune["stages"]] == ["threads", "conv1", "conv2", "op order"]
    # every timed step was a training step of this run, within the share tuning may take
    assert 0 < tune["steps"] <= MAX_SHARE * trainer.steps_per_epoch
    assert result.steps == trainer.steps_per_epoch == 160
    for stage in tune["stages"]:
        names = [c["name"] for c in stage["candidates"]]
        assert stage["chosen"] in names and len(set(names)) == len(names)
        assert all(c["steps"] == tune["timed_steps_per_candidate"] for c in stage["candidates"])
    # the last stage's choice is what trains on, and it is the layout the model now computes in
    assert (
        tune["chosen"]
        == tune["stages"][-1]["chosen"]
        == trainer.model.layout.describe() + (f", {tune['threads']} thread{'s' if tune['threads'] > 1 else ''}")
    )
    assert torch.get_num_threads() == tune["threads"]
    assert tune["cost_s"] >= 0 and tune["seconds"] < result.wall_seconds
    assert result.final.test_acc > 90.0
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


def test_too_short_a_run_keeps_the_default_and_says_why(mnist):
    config = TrainConfig(**{**TUNED, "train_subset": 320})
    result = Trainer(config, mnist).fit()
    assert "too few" in result.autotune["skipped"] and result.steps == 20


def test_compile_is_only_worth_it_when_the_rest_of_the_run_is_long():
    assert not compile_decision(remaining_steps=900, step_s=0.05)["could_pay_back"]
    long_run = compile_decision(remaining_steps=14 * 938, step_s=0.4)
    assert long_run["could_pay_back"] and long_run["best_saving_s"] > long_run["compile_s"]


def test_scheduled_evaluation_stops_inside_the_epoch(mnist):
    config = TrainConfig(epochs=2, batch_size=64, train_subset=6000, test_subset=1000, eval_every=10, log_every=10)
    trainer = Trainer(config, mnist, [StopAtAccuracy(94.0)])
    result = trainer.fit()
    steps = [e.step for e in result.evaluations]
    assert result.target_reached_step == steps[-1] and result.evaluations[-1].test_acc >= 94.0
    # scheduled ones every 10 steps, only once the training accuracy came within a point of the target
    assert all(s % 10 == 0 for s in steps[:-1])
    assert result.stopped_early and result.final.steps < trainer.steps_per_epoch * len(result.epochs)
    assert result.final.test_acc == result.evaluations[-1].test_acc  # no second evaluation at the stop
