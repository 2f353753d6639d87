"""An error in the observed program prints the traceback it prints without dlscope, less the
frames dlscope's wrappers stand in for; an error raised in dlscope's own code keeps them all."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from dlscope.cli import main
from dlscope.injob import tracebacks

SCRIPT = Path(__file__).parent / "scripts" / "errors.py"
FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+), in (\S+)', re.M)


def frames(stderr: str) -> list[tuple[str, str, str]]:
    return FRAME.findall(stderr)


@pytest.mark.parametrize("where", ["forward", "worker", "load", "start"])
def test_a_failing_script_shows_its_own_traceback_and_the_summary_names_its_error(tmp_path, capfd, where):
    """The traceback as without dlscope; and the summary says what ended the command — the
    error's type, the script's own line it came through (the `torch.load` call, not torch's
    line), its message — and, when no step had run, no guess at why none was seen."""
    argv = [sys.executable, str(SCRIPT), where, str(tmp_path / "missing.pt")]
    bare = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    code = main(["run", "--out", str(tmp_path / "run"), "--profile-steps", "0", "--", *argv])
    captured = capfd.readouterr()
    observed = captured.err
    assert code == bare.returncode == 1
    seen = frames(observed)
    assert seen and not [f for f in seen if f[0].startswith(tracebacks.OBSERVERS)]
    # the script's frames and the error line as without dlscope; the frames left are all bare ones
    assert [f for f in seen if f[0] == str(SCRIPT)] == [f for f in frames(bare.stderr) if f[0] == str(SCRIPT)]
    assert set(seen) <= set(frames(bare.stderr))
    error = next(line for line in bare.stderr.splitlines() if line.startswith(("RuntimeError", "ValueError", "File")))
    assert error in observed
    kind = error.split(":")[0]
    # the process's own traceback (a worker's is quoted in the message after it)
    own = [f for f in frames(bare.stderr.split("\n" + kind + ":")[0]) if f[0] == str(SCRIPT)]
    (uncaught,) = json.loads((tmp_path / "run" / "results.json").read_text())["sections"]["run"]["uncaught"]
    assert (uncaught["type"], uncaught["file"], uncaught["line"]) == (kind, str(SCRIPT), int(own[-1][1]))
    assert uncaught["message"] == error.split(": ", 1)[1]
    summary = " ".join(captured.out.split())
    assert f"It failed with {kind} at {SCRIPT.name}:{uncaught['line']}" in summary
    assert ("No training step ran before the error" in summary) == (where == "start")
    assert "inference-only" not in summary


def raise_through(raiser: str) -> BaseException:
    """An error raised by `raiser` (user code or ours) and passed on by a wrapper of ours."""
    ours = compile(
        "def wrapper(call):\n    return call()\ndef raising():\n    raise KeyError('ours')\n",
        str(Path(tracebacks.OBSERVERS) / "script" / "wrapper.py"),
        "exec",
    )
    namespace: dict = {}
    exec(ours, namespace)

    def users() -> None:
        raise KeyError("theirs")

    try:
        namespace["wrapper"](users if raiser == "user" else namespace["raising"])
    except KeyError as e:
        return e
    raise AssertionError("nothing raised")


def names(tb) -> list[str]:
    out = []
    while tb is not None:
        out.append(tb.tb_frame.f_code.co_name)
        tb = tb.tb_next
    return out


def test_only_an_error_passing_through_our_frames_loses_them():
    theirs = raise_through("user")
    assert names(theirs.__traceback__) == ["raise_through", "wrapper", "users"]
    assert names(tracebacks.without_our_frames(theirs.__traceback__)) == ["raise_through", "users"]
    ours = raise_through("ours")
    assert names(tracebacks.without_our_frames(ours.__traceback__)) == ["raise_through", "wrapper", "raising"]


def test_a_script_that_exits_with_a_status_of_its_own_before_any_step_is_not_guessed_at(tmp_path, capfd):
    """argparse's usage error, a `sys.exit(3)`: no uncaught error to name, and no step. The summary
    says the command ended with its status before any step, not that it may be inference-only."""
    script = tmp_path / "cli.py"
    script.write_text(
        "import argparse, torch\nargparse.ArgumentParser().parse_args(['--nope'])  # usage error: exit 2\n"
    )
    code = main(["run", "--out", str(tmp_path / "run"), "--", sys.executable, str(script)])
    summary = " ".join(capfd.readouterr().out.split())
    assert code == 2
    assert "No training step ran before the command ended with status 2" in summary, summary
    assert "inference-only" not in summary
