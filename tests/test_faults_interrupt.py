"""Ctrl-C and SIGTERM to `dlscope trace` under every backend, early (while the tracer starts)
and late (while the command runs): the command gets the user's signal, no tracer or command
outlives dlscope, the run is recorded as interrupted with the signal, the report is written, and
dlscope exits 128 + signal."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import weakref
from pathlib import Path

import pytest

from dlscope.errors import Interrupted, interrupts_delivered, raise_interrupted
from dlscope.supervise.iotrace.tracer import availability

BACKENDS = [
    pytest.param(name, marks=pytest.mark.skipif(why is not None, reason=f"{name}: {why}"))
    for name, why in availability().items()
]
SLOW = """
import sys, time
import dlscope
with dlscope.phase("waiting"):
    for _ in range(1200):
        with open(sys.argv[1], "w") as f:
            f.write("x")
        time.sleep(0.05)
"""


def processes_mentioning(text: str) -> list[str]:
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if text in cmdline.read_bytes().decode(errors="replace"):
                found.append(cmdline.parent.name)
        except OSError:
            continue  # gone meanwhile
    return found


@pytest.mark.slow
@pytest.mark.parametrize(
    ("signum", "moment"),
    [(signal.SIGINT, "late"), (signal.SIGTERM, "early")],  # the other two pairs pass too; kept out for time
    ids=["SIGINT-late", "SIGTERM-early"],
)
@pytest.mark.parametrize("backend", BACKENDS)
def test_interrupt_stops_tracer_and_command(tmp_path, backend, signum, moment):
    script = tmp_path / "slow.py"
    script.write_text(SLOW)
    marker = tmp_path / "written-by-the-command"
    run = tmp_path / "run"
    argv = [sys.executable, "-m", "dlscope.cli", "trace", "--backend", backend, "--out", str(run)]
    dlscope = subprocess.Popen(
        [*argv, "--", sys.executable, str(script), str(marker)], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    deadline = time.monotonic() + 120
    ready = (lambda: (run / "results.json").exists()) if moment == "early" else marker.exists
    while not ready() and time.monotonic() < deadline and dlscope.poll() is None:
        time.sleep(0.05)
    # early: the run directory exists (a signal while its first results.json is being written
    # leaves that file saying "interrupted" but no report: there is nothing to report yet);
    # late: the command is well inside its phase
    time.sleep(0.2 if moment == "early" else 1)
    dlscope.send_signal(signum)
    out, err = dlscope.communicate(timeout=120)
    assert dlscope.returncode == 128 + signum, err.decode()
    assert err.decode().strip().endswith(f"dlscope: interrupted by {signum.name}")
    assert b"ok in" not in out
    results = json.loads((run / "results.json").read_text())
    assert results["run"]["status"] == "interrupted" and results["run"]["signal"] == signum.name, err.decode()
    assert (run / "report.html").exists()
    if moment == "late":
        section = results["sections"]["iotrace"]
        assert section["interrupted"] == signum.name and section["exit_code"] == 128 + signum
        assert any(p["phase"] == "waiting" for p in section["phases"])
    assert processes_mentioning(str(script)) == [], "the traced command outlived dlscope"
    assert processes_mentioning(str(run)) == [], "a tracer outlived dlscope"
    assert not list(run.rglob(".dlscope-tmp-*"))


def test_an_interrupt_raised_where_python_ignores_exceptions_is_delivered_again():
    """A signal whose handler runs inside a weakref callback (the import lock's, as dlscope starts)
    raises where Python only prints "Exception ignored": the signal must come again and stop the
    run in ordinary code, never be lost."""

    class Owner:
        pass

    owner = Owner()

    def callback(_: weakref.ref) -> None:
        raise_interrupted(signal.SIGTERM, None)  # as if SIGTERM arrived just then

    ref = weakref.ref(owner, callback)
    with pytest.raises(Interrupted) as caught, interrupts_delivered():
        del owner  # the callback runs here and its exception is swallowed
        deadline = time.monotonic() + 10  # the signal comes again within a moment
        while time.monotonic() < deadline:
            pass
    assert caught.value.signum == signal.SIGTERM and ref() is None
