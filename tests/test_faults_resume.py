"""Resume and verify as a user chains them: more epochs, a finished run, a test subset, a bad file."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
import torch

from dlscope.cli import main

QUICK = ["--train-subset", "300", "--test-subset", "100", "--batch-size", "100", "--no-progress", "--no-tensorboard"]


@pytest.fixture(scope="module")
def one_epoch(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("one") / "run"
    assert main(["train", "--out", str(run), "--epochs", "1", "--target-acc", "100", *QUICK]) == 0
    return run


def sections(run: Path) -> dict:
    return json.loads((run / "results.json").read_text())["sections"]


def test_resume_with_more_epochs_trains_the_remaining_ones(one_epoch, tmp_path):
    out = tmp_path / "more"
    last = one_epoch / "checkpoints" / "last.pt"
    assert main(["train", "--out", str(out), "--resume", str(last), "--epochs", "3", *QUICK]) == 0
    train = sections(out)["train"]
    assert [e["epoch"] for e in train["epochs"]] == [1, 2, 3] and train["resumed_from_epoch"] == 1
    assert train["schedule_restarted"]  # the saved one-cycle ended at epoch 1
    state = torch.load(out / "checkpoints" / "final.pt", weights_only=True)
    assert state["epoch"] == 3 and state["config"]["epochs"] == 3
    before = torch.load(last, weights_only=True)
    assert any(not torch.equal(state["model"][k], before["model"][k]) for k in before["model"])


def test_resume_of_a_finished_run_reports_it(one_epoch, tmp_path, capsys):
    """Issue 16 item 11: the same --epochs (here: none given) used to crash on a None accuracy."""
    final = one_epoch / "checkpoints" / "final.pt"
    recorded = torch.load(final, weights_only=True)["history"][-1]["test_acc"]
    capsys.readouterr()
    assert main(["train", "--out", str(tmp_path / "again"), "--resume", str(final), *QUICK]) == 0
    said = capsys.readouterr()
    out = (said.out + said.err).replace("\n", " ")
    assert "already at epoch 1 of 1" in out and f"{recorded:.2f}%" in out
    train = sections(tmp_path / "again")["train"]
    assert train["final_test_acc"] == recorded and train["steps"] == train["steps_per_epoch"]
    assert sections(tmp_path / "again")["checkpoint"]["verify"]["ok"]


def test_verify_uses_the_test_subset_the_checkpoint_records(one_epoch, capsys):
    assert main(["ckpt", "verify", str(one_epoch / "checkpoints" / "last.pt")]) == 0
    assert "identical predictions on 100 test images" in capsys.readouterr().out


@pytest.mark.parametrize(
    "content",
    [b"not a checkpoint\n", pickle.dumps(1.5j, protocol=4), pickle.dumps({"model": 1}, protocol=2)],
    ids=["text", "pickle-with-a-global", "not-dlscope"],
)
def test_resume_from_a_bad_file_creates_nothing(tmp_path, capsys, content):
    bad = tmp_path / "bad.pt"
    bad.write_bytes(content)
    out = tmp_path / "never"
    assert main(["train", "--out", str(out), "--resume", str(bad), *QUICK]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(bad) in err
    assert "weights_only" not in err and "False" not in err
    assert not out.exists()
