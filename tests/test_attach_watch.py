"""`dlscope attach` and `dlscope watch` on a real job running under `dlscope run`: a loop whose step
becomes a big matmul once a flag file appears is profiled on demand after it slowed (the window
covers the slow steps and its top operator is the matmul), while `dlscope watch` runs in a
pseudo-terminal 80 columns wide, shows the live figures (a checkpoint, a stall while the job
pauses) and ends by itself when the job ends (a second one, on Ctrl-C, leaving the job running).
Bad targets get one line naming them and exit status 2."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import signal
import struct
import subprocess
import sys
import termios
import threading
import time
from pathlib import Path

from dlscope.cli import main
from dlscope.contract.live import read_all
from test_hang import wait_for

SCRIPTS = Path(__file__).parent / "scripts"
STYLE = re.compile(r"\x1b\[[0-9;]*m")  # colours: inside a line
CURSOR = re.compile(r"\x1b\[[0-9;?]*[A-Za-ln-z]")  # moves and erases: a redraw starts a new line


def steps_of(run: Path) -> int:
    views = read_all(run / "processes") if (run / "processes").is_dir() else []
    return max((v.steps for v in views), default=0)


class Terminal:
    """A command in a pseudo-terminal of `columns` × `rows`; everything it writes, kept."""

    def __init__(self, command: list[str], columns: int = 80, rows: int = 40) -> None:
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
        env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "NO_COLOR")}
        env["TERM"] = "xterm-256color"
        self.process = subprocess.Popen(command, stdin=slave, stdout=slave, stderr=slave, env=env, close_fds=True)
        os.close(slave)
        self.master, self.output = master, bytearray()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        while True:
            try:
                data = os.read(self.master, 65536)
            except OSError:  # the command ended and closed its side
                return
            if not data:
                return
            self.output += data

    def text(self) -> str:
        return CURSOR.sub("\n", STYLE.sub("", self.output.decode(errors="replace"))).replace("\r", "")

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        self.reader.join(5)
        os.close(self.master)


def test_a_job_that_slows_is_profiled_on_demand_and_watched_at_80_columns(tmp_path, capsys):
    run, flag, stop = tmp_path / "run", tmp_path / "slow", tmp_path / "stop"
    command = [sys.executable, str(SCRIPTS / "slows_on_flag.py"), str(flag), str(stop)]
    job = subprocess.Popen(
        [sys.executable, "-m", "dlscope.cli", "run", "--out", str(run), "--hang-after", "off", "--", *command],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    terminal = None
    try:
        wait_for(lambda: steps_of(run) >= 20, "the job's first 20 steps")
        terminal = Terminal([sys.executable, "-m", "dlscope.cli", "watch", str(run), "--interval", "0.2"])
        wait_for(lambda: "a second" in terminal.text(), "watch showing the step rate")
        (tmp_path / "pause").touch()  # no step ends while it exists
        wait_for(lambda: "stalled: no step for" in terminal.text(), "watch saying the job stalled")
        (tmp_path / "pause").unlink()
        flag.touch()
        slowed_at = steps_of(run)  # every step that starts from here on runs the matmul
        # by `dlscope run`'s own PID: the script below it is the process profiled
        assert main(["attach", str(job.pid), "--profile-steps", "3", "--json"]) == 0
        [process] = json.loads(capsys.readouterr().out)["processes"]
        window = process["window"]
        assert window["trigger"] == "attach" and window["active_steps"] == 3
        assert window["first_step"] > slowed_at and window["last_step"] == window["first_step"] + 2
        assert window["rows"][0]["name"] == "aten::mm" and window["rows"][0]["self_cpu_pct"] > 50
        assert (run / "processes" / Path(window["trace"]).name).exists()
        assert window["cost"]["active_step_ms"] > 0 and window["cost"]["unprofiled_steps"] > 0
        second = Terminal([sys.executable, "-m", "dlscope.cli", "watch", str(run)])
        try:  # Ctrl-C ends a watch, not the job
            wait_for(lambda: "a second" in second.text(), "a second watch showing the step rate")
            second.process.send_signal(signal.SIGINT)
            assert second.process.wait(60) == 0 and job.poll() is None
        finally:
            second.close()
        stop.touch()
        assert job.wait(120) == 0
        assert terminal.process.wait(60) == 0  # watch ends by itself when the job does
    finally:
        stop.touch()
        if job.poll() is None:
            job.kill()
            job.wait()
        if terminal is not None:
            terminal.close()
    shown = terminal.text()
    for figure in ("steps", "step time", "p50", "anatomy", "data wait", "slowest", "state", "Processes", "train_steps"):
        assert figure in shown
    assert f"saved{tmp_path / 'ckpt.pt'}in" in re.sub(r"\s", "", shown)  # the path may wrap in its cell
    assert "the job has ended" in shown.replace("\n", " ")
    assert max(len(line) for line in shown.splitlines()) <= 80

    # the run's own results list both windows with their step ranges; the on-demand one shows the matmul
    top10 = json.loads((run / "results.json").read_text())["sections"]["top10"]
    scheduled, attached = top10["windows"]
    assert scheduled["trigger"] == "schedule" and scheduled["last_step"] < slowed_at
    mm_share = {
        w["trigger"]: next((r["self_cpu_pct"] for r in w["rows"] if r["name"] == "aten::mm"), 0.0)
        for w in (scheduled, attached)
    }
    assert mm_share["schedule"] < 50 < mm_share["attach"]  # the small Linear's own backward is an mm too
    assert (attached["trigger"], attached["first_step"]) == ("attach", window["first_step"])
    assert top10["profiled_cost"]["unprofiled_steps"] > 0 and top10["profiled_cost"]["ratio"] > 0
    assert attached["rows"][0]["name"] == "aten::mm" and (run / attached["trace"]).exists()
    report = (run / "report.md").read_text()
    assert f"steps {window['first_step']}–{window['last_step']}" in report and "dlscope attach" in report

    # a finished run: nothing to attach to, nothing to watch
    for argv in (["attach", str(run), "--profile-steps", "3"], ["watch", str(run)]):
        assert main(argv) == 2
        error = capsys.readouterr().err
        assert error.count("\n") == 1 and str(run) in error and "has ended" in error


def test_a_target_that_is_no_running_job_is_one_line_naming_it(tmp_path, capsys):
    plain = subprocess.Popen(["sleep", "600"])
    try:
        gone = subprocess.Popen(["true"])
        gone.wait()
        cases = {
            str(tmp_path / "nothing"): "not a `dlscope run` directory",
            str(plain.pid): "not a process of a `dlscope run` job",
            str(gone.pid): "no such running process",
        }
        for target, why in cases.items():
            for argv in (["attach", target, "--profile-steps", "2"], ["watch", target]):
                assert main(argv) == 2
                error = capsys.readouterr().err
                assert error.count("\n") == 1 and target in error and why in error, error
    finally:
        plain.kill()
        plain.wait()


def test_a_request_no_process_takes_is_withdrawn_and_said(tmp_path, capsys):
    """A process that has ended steps but never reaches another step end (this test's own, with a
    live file and no bootstrap): attach gives up at --timeout, says so, exits 1 and leaves no request."""
    from dlscope.contract.live import LiveStatus
    from dlscope.contract.requests import request_path, write_request

    processes = tmp_path / "run" / "processes"
    processes.mkdir(parents=True)
    live = LiveStatus(str(processes), None)
    live.step_ended(12, time.time())
    assert main(["attach", str(tmp_path / "run"), "--profile-steps", "2", "--timeout", "0.5"]) == 1
    said = capsys.readouterr().out
    assert "NO PROFILE" in said and f"process {os.getpid()}" in said and "not written within 0.5 s" in said
    assert not request_path(processes, os.getpid()).exists()
    write_request(processes, os.getpid(), {"id": "x", "steps": 1})  # another attach's, not yet taken
    # no .json beside the profiler's traces: HTA and TensorBoard read every one there as a trace
    assert request_path(processes, os.getpid()).exists() and not list(processes.glob("*.json"))
    assert main(["attach", str(tmp_path / "run"), "--profile-steps", "2"]) == 2
    assert "already waiting" in capsys.readouterr().err


def test_a_window_taken_after_the_job_slowed_is_not_called_the_profilers_cost(tmp_path):
    """Steps of 10 ms, then 50 ms from step 100 on; a window on demand at steps 150–152 (50 ms each).
    Against the unprofiled steps around it the profiler costs nothing (1.0×); against every unprofiled
    step of the run (the median, 10 ms) it would read 5×."""
    from dlscope.analysis import steptable
    from dlscope.analysis.observed import window_cost
    from dlscope.analysis.stepfile import StepFile
    from dlscope.injob.recorder import RecordFile

    records = RecordFile(str(tmp_path))
    start = 0.0
    for i in range(300):
        seconds = 0.010 if i < 100 else 0.050
        profiled = {149: "warmup", 150: "active", 151: "active", 152: "active"}.get(i)
        fields = dict(i=i, src="optimizer", start=start, end=start + seconds, data=0.0, data_source="gap")
        records.write_step(**fields, forward=0.0, backward=0.0, optimizer=0.0, profiled=profiled)
        start += seconds
    os.close(records.fd)
    steps = StepFile(tmp_path / f"{os.getpid()}.steps")
    cost = window_cost(steptable.open_stream(steps)[1], steps.codes, 150, 152)
    assert cost["active_step_ms"] == cost["unprofiled_step_ms"] == 50.0
    assert cost["unprofiled_steps"] == 100
