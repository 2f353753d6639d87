"""Shared fixtures: the real MNIST (loaded once), and small configurations for quick runs."""

from __future__ import annotations

import compileall
import importlib.util
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from filelock import FileLock  # torch's own dependency

import dlscope
from dlscope.data.mnist import MNIST, load_mnist

# Keras picks its backend once per process; with TensorFlow installed it would pick tensorflow.
# The in-process Keras tests use torch; the TensorFlow backend is tested in subprocesses.
os.environ.setdefault("KERAS_BACKEND", "torch")
# A step field the row does not hold fails loudly in tests (in a user's job it is noted and kept).
os.environ.setdefault("DLSCOPE_STRICT_RECORDS", "1")

# A shell without job control starts `make test &` with SIGINT ignored, and an ignored signal stays
# ignored across exec: every dlscope the tests start would then shrug off the Ctrl-C the interrupt
# tests send it. A handler (unlike SIG_IGN) is reset to the default on exec, so the children get
# Python's usual KeyboardInterrupt again.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# Every dlscope a test starts (the CLI, the bootstrap in each observed process, its DataLoader
# workers and ranks) imports dlscope from this tree. Where PYTHONDONTWRITEBYTECODE is set (containers,
# this CI) no process caches what it compiles, so each compiled dlscope anew: ~0.4 s of a 3 s
# `dlscope run`. Compiled once a session here (only what changed since); quiet=2: a read-only
# install is left as it is.
compileall.compile_dir(Path(dlscope.__file__).parent, quiet=2)


@pytest.fixture(scope="session")
def observe_script():
    """`dlscope run` through the runner, no terminal output: (results, the command's exit status)."""
    from dlscope.options import RunOptions, ScriptOptions, StepOptions
    from dlscope.runner import Plan, run_command

    def observe(command: list[str], out, **script) -> tuple[dict, int]:
        options = StepOptions(script=ScriptOptions(command, **script))
        results = run_command(
            Plan("run", ["run"], options=RunOptions(out=str(out)), step_options=options), render=False
        )
        return results, results["sections"]["run"]["exit_code"]

    return observe


@pytest.fixture(scope="session")
def lab_run(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """`dlscope lab` with every step on a small configuration, once, in its own process at 80 columns:
    (the run directory, the finished command). Tests read it and never change it. Once for all of
    pytest-xdist's workers too: the first to ask makes it, under a lock in the temporary directory
    they share, and the others read what it left."""
    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent  # this session's, above each worker's own
    run, finished = shared / "lab", shared / "lab.json"
    with FileLock(shared / "lab.lock"):
        if not finished.exists():
            tiny = ["--epochs", "1", "--train-subset", "3000", "--test-subset", "1000", "--batch-size", "100"]
            tiny += ["--target-acc", "90", "--no-progress", "--profile-steps", "2"]
            proc = subprocess.run(
                [sys.executable, "-m", "dlscope.cli", "lab", "--out", str(run), *tiny],
                capture_output=True,
                text=True,
                env={**os.environ, "COLUMNS": "80"},
                timeout=900,
            )
            assert proc.returncode == 0, proc.stderr
            finished.write_text(
                json.dumps({"args": proc.args, "returncode": 0, "stdout": proc.stdout, "stderr": proc.stderr})
            )
    return run, subprocess.CompletedProcess(**json.loads(finished.read_text()))


@pytest.fixture(scope="session")
def mnist() -> MNIST:
    return load_mnist()


@pytest.fixture(autouse=True)
def _two_threads():
    # CI machines have 2 cores; pin so timings and results do not depend on the host
    torch.set_num_threads(2)
    yield


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """`make test` runs `-n 2 --dist loadfile`: pytest-xdist's workers take a test file each at a time,
    but the files holding tests marked timing are one unit, run one after another in one worker.
    Those tests compare a time dlscope measured with one the script measured, or two runs: never
    two of them beside each other on a 2-core machine. (Read here, in the process that hands the
    files out, from the files' text: it collects no tests. pytest-xdist's own --dist loadgroup
    groups nothing under pytest 9.2, pytest-xdist#1386.)"""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    tests = Path(__file__).parent
    timing = {
        str(path.relative_to(config.rootpath))
        for path in tests.glob("test_*.py")
        if "pytest.mark.timing" in path.read_text()
    }

    class TimingApart(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = super()._split_scope(nodeid)
            return "timing" if path in timing else path

    return TimingApart(config, log)


def pytest_collection_modifyitems(config, items):
    if importlib.util.find_spec("tensorflow") is not None:
        return
    skip = pytest.mark.skip(reason="needs TensorFlow: pip install -e '.[tf]' (make test installs it)")
    for item in items:
        if item.get_closest_marker("tf") is not None:
            item.add_marker(skip)
