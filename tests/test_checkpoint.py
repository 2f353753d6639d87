"""Checkpoints: crash-safety under SIGKILL, weights_only loading, verification, clear errors."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from dlscope.checkpoint import save_checkpoint, verify_checkpoint
from dlscope.data.loaders import normalise
from dlscope.errors import CheckpointError
from dlscope.fsutil import TEMP_MARK
from dlscope.restore import load_checkpoint
from dlscope.train import TrainConfig, Trainer

WRITER = """
import sys, torch
from dlscope.checkpoint import save_checkpoint
path = sys.argv[1]
save_checkpoint(path, {"model": {"w": torch.zeros(4)}, "config": {"model": "cnn"}, "generation": 0})
print("ready", flush=True)
generation = 1
while True:  # ~80 MB per save, so a kill lands mid-write most of the time
    w = torch.full((20_000_000,), float(generation))
    save_checkpoint(path, {"model": {"w": w}, "config": {"model": "cnn"}, "generation": generation})
    generation += 1
"""


@pytest.mark.slow
@pytest.mark.parametrize("delay", [0.05, 0.2, 0.45, 0.8])
def test_sigkill_mid_write_never_leaves_a_torn_file(tmp_path, delay):
    path = tmp_path / "ckpt.pt"
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(path)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(delay)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    state = load_checkpoint(path)  # always a complete file: the old one or a new one
    w = state["model"]["w"]
    assert torch.all(w == state["generation"]) if state["generation"] else w.shape == (4,)
    # the next save, by a new process, removes the dead writer's temp file
    info = save_checkpoint(path, {"model": {"w": torch.ones(2)}, "config": {"model": "cnn"}})
    assert not list(tmp_path.glob(f"{TEMP_MARK}*"))
    assert info.bytes == path.stat().st_size


def test_truncated_and_foreign_files_are_one_line_errors(tmp_path):
    good = tmp_path / "good.pt"
    save_checkpoint(good, {"model": {"w": torch.ones(1000)}, "config": {"model": "cnn"}})
    torn = tmp_path / "torn.pt"
    torn.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    with pytest.raises(CheckpointError, match="not a loadable checkpoint") as err:
        load_checkpoint(torn)
    assert str(err.value).startswith(str(torn)) and "\n" not in str(err.value)
    foreign = tmp_path / "foreign.pt"
    torch.save([1, 2, 3], foreign)
    with pytest.raises(CheckpointError, match="not a dlscope checkpoint"):
        load_checkpoint(foreign)
    with pytest.raises(CheckpointError, match="not found"):
        load_checkpoint(tmp_path / "absent.pt")


def test_weights_only_refuses_arbitrary_objects(tmp_path):
    evil = tmp_path / "evil.pt"
    torch.save({"model": {}, "config": {}, "payload": print}, evil)  # a global function, not a tensor
    with pytest.raises(CheckpointError, match="not a loadable checkpoint"):
        load_checkpoint(evil)


def test_verify_detects_identical_and_altered_weights(mnist, tmp_path):
    # 5 steps: verification compares the saved and the reloaded model's predictions, at any accuracy
    config = TrainConfig(epochs=1, train_subset=500, test_subset=1000, batch_size=100)
    trainer = Trainer(config, mnist)
    trainer.fit()
    state = trainer.state_dict()
    assert state["fingerprint"]["samples"] == 1000
    path = tmp_path / "final.pt"
    save_checkpoint(path, state)
    ok = verify_checkpoint(path, trainer.test_images, trainer.test_labels, reference=trainer.model)
    assert ok.ok and ok.logits_max_abs_diff == 0.0 and ok.accuracy_loaded == ok.accuracy_saved
    # the same fingerprint with other weights must fail verification
    state["model"] = {k: v + 0.05 * torch.randn_like(v) for k, v in state["model"].items()}
    save_checkpoint(path, state)
    bad = verify_checkpoint(path, normalise(mnist.test_images[:1000]), mnist.test_labels[:1000])
    assert not bad.predictions_identical and not bad.ok


def test_save_into_unwritable_place_is_checkpoint_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(CheckpointError, match="cannot write checkpoint"):
        save_checkpoint(blocker / "sub" / "c.pt", {"model": {}, "config": {}})
    assert os.listdir(tmp_path) == ["file"]
