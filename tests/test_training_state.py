"""Observing training never changes it: profiling and the sweep's byte count work on copies."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import pytest
import torch

from dlscope.cli import main
from dlscope.experiments.batch_device import count_step_bytes
from dlscope.instruments.profiler import profile_training
from dlscope.train import TrainConfig, Trainer


def assert_same_state(before: Any, after: Any, where: str = "state") -> None:
    """Every tensor equal bit for bit (torch.equal), every other value equal, at every depth."""
    assert type(before) is type(after), where
    if isinstance(before, dict):
        assert before.keys() == after.keys(), where
        for key in before:
            assert_same_state(before[key], after[key], f"{where}[{key!r}]")
    elif isinstance(before, list | tuple):
        assert len(before) == len(after), where
        for i, (b, a) in enumerate(zip(before, after, strict=True)):
            assert_same_state(b, a, f"{where}[{i}]")
    elif isinstance(before, torch.Tensor):
        assert torch.equal(before, after), f"{where} changed"
    elif isinstance(before, np.ndarray):
        assert np.array_equal(before, after), f"{where} changed"
    else:
        assert before == after, f"{where} changed"


def test_profiling_and_byte_count_leave_the_trainer_untouched(mnist):
    # "net" has dropout, so a profiled step draws random numbers too
    config = TrainConfig(model="net", epochs=1, batch_size=64, train_subset=256, test_subset=200, target_acc=None)
    trainer = Trainer(config, mnist)
    trainer.fit()
    before = copy.deepcopy(trainer.state_dict())
    assert int(before["optimizer"]["state"][0]["step"]) == before["global_step"] == 4

    profile_training(trainer.model, trainer.optimizer, trainer.batches, wait=1, warmup=1, active=2)
    assert_same_state(before, trainer.state_dict())

    x, y = trainer.sample_batch(16)
    count_step_bytes(trainer.model, trainer.optimizer, x, y)  # the sweep step forks the RNG around it
    after = trainer.state_dict()
    assert_same_state({k: before[k] for k in ("model", "optimizer")}, {k: after[k] for k in ("model", "optimizer")})


@pytest.mark.slow
def test_final_checkpoint_is_the_trained_state_after_profile_and_sweep(lab_run, capsys):
    checkpoints = lab_run[0] / "checkpoints"  # tests/conftest.py: the lab's steps, profile and sweep among them
    last = torch.load(checkpoints / "last.pt", weights_only=True)
    final = torch.load(checkpoints / "final.pt", weights_only=True)
    assert all(int(s["step"]) == final["global_step"] for s in final["optimizer"]["state"].values())
    assert_same_state(last, final)
    capsys.readouterr()
    assert main(["ckpt", "diff", str(checkpoints / "last.pt"), str(checkpoints / "final.pt")]) == 0
    assert "identical" in capsys.readouterr().out
