"""The CLI end to end on a tiny configuration, and one-line errors for bad input."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

TINY = [
    "--epochs",
    "1",
    "--train-subset",
    "3000",
    "--test-subset",
    "1000",
    "--batch-size",
    "100",
    "--target-acc",
    "90",
    "--no-progress",
    "--profile-steps",
    "2",
]


def dlscope(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "120"}
    return subprocess.run(
        [sys.executable, "-m", "dlscope.cli", *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=600
    )


@pytest.mark.slow
def test_lab_end_to_end_writes_every_section(tmp_path):
    run = tmp_path / "lab"
    proc = dlscope("lab", "--out", str(run), *TINY)
    assert proc.returncode == 0, proc.stderr
    assert "where everything is" in proc.stdout and "report.html" in proc.stdout
    results = json.loads((run / "results.json").read_text())
    from dlscope.steps import STEPS

    expected = [step.name for step in STEPS]
    assert results["steps"] == expected and results["run"]["status"] == "ok"
    html = (run / "report.html").read_text()
    for name in expected:
        assert f'<section id="{name}">' in html
    assert "<link" not in html and 'src="http' not in html  # self-contained, offline
    assert html.count("data:image/png;base64,") >= 2  # the curves and the top-10 chart
    md = (run / "report.md").read_text()
    assert all(f'<a id="{name}"></a>' in md for name in expected)
    for link in re.findall(r"\]\((figures/[^)]+)\)", md):
        assert (run / link).is_file()
    assert results["sections"]["train"]["final_test_acc"] >= 85
    assert results["sections"]["checkpoint"]["verify"]["ok"]
    assert (run / "profile" / "trace.json").is_file() and (run / "profile" / "top10_ops.csv").is_file()
    assert list((run / "tensorboard").glob("events.out.tfevents.*"))
    # the report renders from results.json alone
    for leftover in ("report.html", "report.md", "figures", "tensorboard", "profile", "checkpoints"):
        target = run / leftover
        shutil.rmtree(target) if target.is_dir() else target.unlink()
    again = dlscope("report", str(run))
    assert again.returncode == 0, again.stderr
    assert (run / "report.html").read_text().count("<section id=") == len(expected)

    # a checkpoint from the CLI verifies from the CLI (the full test set: a subset fingerprint must be refused)
    proc = dlscope(
        "train",
        "--out",
        str(tmp_path / "t"),
        "--epochs",
        "1",
        "--train-subset",
        "2000",
        "--no-progress",
        "--no-tensorboard",
        "--target-acc",
        "50",
    )
    assert proc.returncode == 0, proc.stderr
    ok = dlscope("ckpt", "verify", str(tmp_path / "t" / "checkpoints" / "final.pt"))
    assert ok.returncode == 0 and "identical predictions on 10,000" in ok.stdout


def assert_one_line_error(proc: subprocess.CompletedProcess, *fragments: str) -> None:
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    for fragment in fragments:
        assert fragment in lines[0]


def test_bad_flags_are_one_line_errors(tmp_path):
    assert_one_line_error(dlscope("lab", "--batch-size", "0", "--out", str(tmp_path / "r")), "batch sizes must be ≥ 1")
    assert not (tmp_path / "r").exists()  # validated before anything is written
    assert_one_line_error(dlscope("lab", "--model", "vgg"), "invalid choice")
    assert_one_line_error(dlscope("lab", "--target-acc", "101"), "target accuracy")
    assert_one_line_error(dlscope("train", "--epochs", "x"), "invalid int value")


def test_bad_files_are_one_line_errors(tmp_path):
    assert_one_line_error(dlscope("report", str(tmp_path)), str(tmp_path), "no results.json")
    (tmp_path / "results.json").write_text("{not json")
    assert_one_line_error(dlscope("report", str(tmp_path)), "not valid JSON")
    torn = tmp_path / "torn.pt"
    torn.write_bytes(b"PK\x03\x04" + b"\x00" * 100)
    assert_one_line_error(dlscope("ckpt", "verify", str(torn)), str(torn), "not a loadable checkpoint")
    assert_one_line_error(dlscope("data", "verify", "--data-dir", str(tmp_path / "none")), "does not exist")
    assert_one_line_error(dlscope("tensorboard", str(tmp_path)), "no tensorboard/ directory")


def test_data_verify_and_models(tmp_path):
    proc = dlscope("data", "verify")
    assert proc.returncode == 0 and "checksums verified" in proc.stdout
    proc = dlscope("models")
    assert proc.returncode == 0 and all(name in proc.stdout for name in ("cnn", "net", "lenet", "mlp"))
