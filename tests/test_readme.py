"""The README's Python API example runs as written, and its two set-up commands exist."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def python_api_example() -> str:
    text = README.read_text()
    section = text.split("## Python API", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "the README's Python API section has no python block"
    return match.group(1)


@pytest.mark.slow
def test_python_api_example_runs(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-c", python_api_example()], cwd=tmp_path, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr
    assert "test accuracy" in proc.stdout and "aten::" in proc.stdout and "verified: True" in proc.stdout
    assert list((tmp_path / "runs" / "notebook" / "tensorboard" / "train").glob("events.out.tfevents.*"))
    assert (tmp_path / "runs" / "notebook" / "cnn.pt").is_file()


def test_readme_gives_the_two_commands():
    text = README.read_text()
    block = text.split("## On a fresh machine", 1)[1].split("```", 2)[1]
    commands = [line.split("#")[0].strip() for line in block.splitlines()[1:] if line.strip()]
    assert commands == ["make lab", "make test"]
    ci = (README.parent / ".ci" / "run").read_text()
    assert "make test" in ci
