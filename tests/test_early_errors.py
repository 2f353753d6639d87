"""Options that cannot work are refused before anything is created or printed; a run that fails
later says why in results.json (run.error) and in its report, and lists only what exists."""

from __future__ import annotations

import json
import re
import shutil

import pytest
import torch

from dlscope.cli import main
from dlscope.data.mnist import vendored_dir

AVAILABLE = {"cuda": torch.cuda.is_available(), "mps": torch.backends.mps.is_available()}
UNAVAILABLE = [device for device, ok in AVAILABLE.items() if not ok]


def exit_status(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as e:  # argparse's own errors
        return e.code


def assert_refused_early(capsys, out, argv: list[str], *fragments: str) -> None:
    assert exit_status(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == "", "nothing is printed before the options are checked"
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dlscope"), captured.err
    assert all(f in lines[0] for f in fragments), lines[0]
    assert not out.exists(), "nothing is created"


@pytest.mark.skipif(not UNAVAILABLE, reason="every device is available here")
@pytest.mark.parametrize("command", ["lab", "train", "profile", "graph"])
def test_an_unavailable_device_is_refused_before_the_run_starts(tmp_path, capsys, command):
    for device in UNAVAILABLE:
        out = tmp_path / f"{command}-{device}"
        assert_refused_early(capsys, out, [command, "--device", device, "--out", str(out)], device)


@pytest.mark.skipif("cuda" not in UNAVAILABLE, reason="CUDA is available here")
def test_a_sweep_over_an_unavailable_device_is_refused(tmp_path, capsys):
    out = tmp_path / "sweep"
    assert_refused_early(capsys, out, ["sweep", "--devices", "cpu,cuda", "--out", str(out)], "cuda")


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["lab", "--threads", "0"], "threads"),
        (["train", "--threads", "-2"], "threads"),
        (["sweep", "--threads", "0"], "≥ 1"),
        (["train", "--workers", "-1"], "workers"),
        (["lab", "--data-dir", "/nonexistent/mnist"], "/nonexistent/mnist"),
        (["train", "--resume", "/nonexistent/last.pt"], "/nonexistent/last.pt"),
    ],
)
def test_impossible_options_are_refused_before_the_run_starts(tmp_path, capsys, argv, fragment):
    out = tmp_path / "run"
    assert_refused_early(capsys, out, [*argv, "--out", str(out)], fragment)


def test_a_run_that_fails_later_records_and_shows_its_error(tmp_path, capsys):
    raw = tmp_path / "data" / "MNIST" / "raw"
    shutil.copytree(vendored_dir(), raw, ignore=shutil.ignore_patterns("*.md"))
    broken = raw / "t10k-labels-idx1-ubyte.gz"
    broken.write_bytes(broken.read_bytes()[:100])  # cut short: found only once the dataset step reads it
    run = tmp_path / ("run-" + "x" * 80)  # longer than the terminal: still printed whole
    argv = ["lab", "--steps", "environment,dataset,train", "--data-dir", str(tmp_path / "data"), "--out", str(run)]
    assert main([*argv, "--no-progress"]) == 2
    captured = capsys.readouterr()
    assert "t10k-labels" in captured.err
    results = json.loads((run / "results.json").read_text())
    assert results["run"]["status"] == "failed" and "t10k-labels" in results["run"]["error"]
    assert "t10k-labels" in (run / "report.html").read_text() and "t10k-labels" in (run / "report.md").read_text()
    where = re.sub(r"\s*\n\s*", "", captured.out[captured.out.index("where everything is") :])  # paths may fold
    assert str(run / "results.json") in where
    assert not any(name in where for name in ("tensorboard", "checkpoints", "profile")), where
