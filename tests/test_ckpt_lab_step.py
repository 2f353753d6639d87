"""The lab's checkpoint-anatomy step: run on a real dlscope checkpoint in a run directory, then the
report is rendered from results.json alone."""

from __future__ import annotations

import os

import pytest
import torch

from dlscope.checkpoint import save_checkpoint
from dlscope.models import build_model
from dlscope.options import AnatomyOptions, RunOptions, StepOptions
from dlscope.plan import Plan
from dlscope.report.render import render_report
from dlscope.rundir import RunDir, load_results
from dlscope.runner import run_command
from dlscope.train import TrainConfig, rng_state


def lab_run(tmp_path) -> RunDir:
    """A run directory as the checkpoint step leaves it: checkpoints/final.pt."""
    run = RunDir.create(tmp_path / "run", "test")
    model = build_model("cnn")
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(2, 1, 28, 28)).sum().backward()
    optimizer.step()
    state = {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "epoch": 1,
        "rng": rng_state(),
        "config": TrainConfig().to_dict(),
        "fingerprint": {"samples": 0, "predictions_sha256": "", "accuracy": 0.0},
    }
    save_checkpoint(run.sub("checkpoints") / "final.pt", state)
    run.release()  # the step's own run takes the directory over
    return run


def test_step_dissects_final_pt_and_proves_the_reload_exact(tmp_path):
    run = lab_run(tmp_path)
    run_command(Plan("test", ["ckpt_anatomy"], options=RunOptions(out=str(run.path), progress=False)), render=False)
    section = load_results(run.path)["sections"]["ckpt_anatomy"]
    anatomy = section["torch"]
    assert anatomy["path"] == "checkpoints/final.pt" and anatomy["safe_to_load"]
    assert {r["role"] for r in anatomy["by_role"]} == {"parameter", "optimizer", "rng"}
    assert anatomy["reload_diff"]["identical"], anatomy["reload_diff"]["tensors"]
    text = render_report(run.path)[1].read_text()
    assert "## Checkpoint anatomy" in text
    assert "Reload is exact" in text and "identical: all 26 tensors equal bit for bit" in text
    assert "archive/data.pkl" in text and "exp_avg_sq" in text


@pytest.mark.slow
def test_keras_seed_003_listing(tmp_path, mnist):
    os.environ.setdefault("KERAS_BACKEND", "torch")
    pytest.importorskip("keras", reason="seed 003's Keras MLP needs the optional keras extra")
    run = RunDir.create(tmp_path / "run", "test")
    run.release()
    keras = AnatomyOptions(keras_seed=True, keras_epochs=1, keras_train_subset=512)
    plan = Plan("test", ["ckpt_anatomy"], options=RunOptions(out=str(run.path), progress=False))
    plan.step_options = StepOptions(ckpt_anatomy=keras)
    run_command(plan, render=False)
    keras = load_results(run.path)["sections"]["ckpt_anatomy"]["keras"]
    h5 = keras["h5"]
    assert [layer["class_name"] for layer in h5["architecture"]["layers"]][1:] == [
        "Flatten",
        "Dense",
        "Dropout",
        "Dense",
    ]
    assert h5["layout"]["training_config"]["loss"] == "sparse_categorical_crossentropy"
    assert h5["layout"]["training_config"]["optimizer_config"]["class_name"] == "Adam"
    shapes = {t["name"].rsplit("/", 2)[-2] + "/" + t["name"].rsplit("/", 1)[-1]: t["shape"] for t in h5["tensors"]}
    assert shapes["dense/kernel"] == [784, 512] and shapes["dense_1/bias"] == [10]  # the seed's listing
    assert keras["keras"]["training"]["optimizer"] == "Adam"
    text = render_report(run.path)[1].read_text()
    assert "model_config = " in text and "training_config = " in text
