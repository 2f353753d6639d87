"""The watchdog of `dlscope run` on real hung jobs, with short --hang-after values: a 2-rank gloo
job whose rank 1 sleeps at step 5 (the verdict names rank 1, its line and rank 0's pending
collective), a DataLoader worker blocked reading a FIFO (named with its path), a job that only
slows down 3× (never called hung); no process is left behind. And the stack capture itself on a
process blocked in C with the GIL held. The built-in job (`dlscope train`) under the same watchdog,
a rank hung by its test hook: in two ranks, and in dlscope's own process."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from dlscope import fit as fit_module
from dlscope.analysis import hangverdict
from dlscope.cli import main
from dlscope.contract.env import HANG_RANK_ENV
from dlscope.contract.live import live_path, read_all, read_live
from dlscope.distributed.iorank import rank_pids
from dlscope.errors import HANG_EXIT_CODE
from dlscope.injob.hangagent import STACK_SIGNAL
from dlscope.options import HangOptions, RunOptions, ScriptOptions, StepOptions
from dlscope.report.sections import hang as hang_section
from dlscope.runner import Plan, run_command
from dlscope.supervise.bootstrap_env import with_bootstrap
from dlscope.supervise.capture import alive, capture, parse_faulthandler
from test_run_ecosystem import step_rows

SCRIPTS = Path(__file__).parent / "scripts"
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
END_AFTER_2S = HangOptions(hang_after=2.0, on_hang="end")


def line_of(script: Path, text: str) -> int:
    return next(n for n, line in enumerate(script.read_text().splitlines(), 1) if text in line)


def run_job(out: Path, command: list[str], hang: HangOptions) -> tuple[dict, int]:
    script = ScriptOptions(command, profile_steps=0, hang=hang)
    plan = Plan("run", ["run"], options=RunOptions(out=str(out)), step_options=StepOptions(script=script))
    sections = run_command(plan, render=False)["sections"]
    sections["steps"]["file"] = str(out / sections["steps"]["file"])  # recorded relative to the run directory
    return sections, sections["run"]["exit_code"]


def assert_none_left(out: Path) -> None:
    pids = [int(p.stem.split("-")[1]) for p in (out / "processes").glob("live-*.bin")]
    assert pids and not [pid for pid in pids if alive(pid)]


def test_a_rank_that_stops_is_named_with_its_line_and_the_collective_the_other_waits_in(tmp_path):
    script = SCRIPTS / "hang_ddp.py"
    sections, code = run_job(tmp_path / "run", [*TORCHRUN, str(script), "--stop-rank", "1"], END_AFTER_2S)
    assert code == HANG_EXIT_CODE
    section = sections["hang"]
    assert section["ended_job"] and len(section["captures"]) == 1
    verdict = section["captures"][0]["verdict"]
    [stopped] = verdict["stopped"]
    assert (stopped["rank"], stopped["steps"]) == (1, 5)
    where = stopped["where"]
    assert Path(where["file"]).name == "hang_ddp.py" and where["line"] == line_of(script, "time.sleep(3600)")
    [pending] = verdict["collectives"]
    # 5 steps × (DDP's bucket all-reduce + the script's all_reduce) finished; #11 is the DDP all-reduce of step 6
    assert (pending["rank"], pending["op"], pending["seq"], pending["missing_ranks"]) == (0, "all_reduce", 11, [1])
    words = [text for _, text in hang_section.verdict_findings(verdict)]
    assert any("rank 1" in w and f"hang_ddp.py:{where['line']}" in w for w in words)
    assert any(w.startswith("rank 0") and "all_reduce #11, which rank 1 never entered" in w for w in words)
    assert_none_left(tmp_path / "run")


def test_a_rank_that_died_is_named_with_its_exit_status_while_the_other_waits(tmp_path):
    """A launcher that reaps rank 0 first (rank 1 stays a zombie, its status readable) and a rank 0
    that polls for the shard file rank 1 would have written: gloo never sees the death."""
    never = tmp_path / "rank1.shard"
    command = [sys.executable, str(SCRIPTS / "hang_launcher.py"), "--exit-rank", "1", "--wait-for", str(never)]
    sections, code = run_job(tmp_path / "run", command, END_AFTER_2S)
    assert code == HANG_EXIT_CODE
    verdict = sections["hang"]["captures"][0]["verdict"]
    [dead] = verdict["died"]
    assert (dead["rank"], dead["steps"], dead["exit"], dead["exited_python"]) == (1, 5, {"code": 3}, False)
    [stopped] = verdict["stopped"]
    assert stopped["rank"] == 0 and stopped["where"]["line"] == line_of(SCRIPTS / "hang_ddp.py", "time.sleep(0.05)")
    words = [text for _, text in hang_section.verdict_findings(verdict)]
    assert any(w.startswith("rank 1") and "died after step 5 with exit status 3" in w for w in words)
    assert_none_left(tmp_path / "run")


def test_a_dataloader_worker_blocked_reading_a_fifo_is_named_with_the_path(tmp_path):
    fifo = tmp_path / "samples.fifo"
    os.mkfifo(fifo)
    held = os.open(fifo, os.O_RDWR)  # a writer that never writes: the worker's open succeeds, its read blocks
    try:
        command = [sys.executable, str(SCRIPTS / "hang_loader.py"), "--fifo", str(fifo)]
        sections, code = run_job(tmp_path / "run", command, END_AFTER_2S)
    finally:
        os.close(held)
    assert code == HANG_EXIT_CODE
    [blocked] = sections["hang"]["captures"][0]["verdict"]["blocked_io"]
    assert (blocked["role"], blocked["syscall"], blocked["path"]) == ("worker", "read", str(fifo))
    assert blocked["where"]["line"] == line_of(SCRIPTS / "hang_loader.py", "f.read(64)")
    assert_none_left(tmp_path / "run")


def test_a_job_that_slows_down_3x_is_not_hung(tmp_path):
    """Steps of 0.2 s, then 0.6 s: longer than --hang-after 0.5, far inside 20 × the median step."""
    command = [sys.executable, str(SCRIPTS / "hang_loader.py"), "--steps", "14", "--step-ms", "200"]
    sections, code = run_job(tmp_path / "run", [*command, "--slow-after", "6"], HangOptions(hang_after=0.5))
    assert code == 0 and "hang" not in sections
    ms = [row["ms"] for row in step_rows(sections)]
    assert len(ms) == 14 and min(ms[8:]) > 2.5 * 200  # it did slow down, past --hang-after


def test_a_step_that_computes_past_the_threshold_is_not_hung(tmp_path):
    """Steps of 50 ms, then one that runs on a core for 6 s: past max(20 × the median, 1 s),
    but computing (pytorch/examples' LBFGS time_sequence_prediction was called hung at 90 s)."""
    command = [sys.executable, str(SCRIPTS / "hang_loader.py"), "--steps", "12", "--step-ms", "50"]
    long_step = ["--long-step", "6", "--long-s", "6"]
    sections, code = run_job(tmp_path / "run", [*command, *long_step], HangOptions(hang_after=1.0))
    assert code == 0 and "hang" not in sections
    assert max(row["ms"] for row in step_rows(sections)) > 6000  # it did run that long


def test_stacks_come_from_a_process_blocked_in_c_with_the_gil_held(tmp_path):
    code = (
        "import ctypes, os\nr, w = os.pipe()\n"
        "ctypes.PyDLL(None).read(r, ctypes.create_string_buffer(1), 1)  # libc read, called with the GIL held\n"
    )
    script = tmp_path / "gil.py"
    script.write_text(code)
    env = with_bootstrap(DLSCOPE_RUN_DIR=str(tmp_path))
    child = subprocess.Popen([sys.executable, str(script)], env=env)
    try:
        live = None
        while live is None or not (tmp_path / f"stacks-{child.pid}.txt").exists():
            assert child.poll() is None
            time.sleep(0.05)
            live = read_live(live_path(tmp_path, child.pid))
        time.sleep(0.5)  # into the sleep
        [taken] = capture([child.pid], tmp_path, {child.pid: live})
        assert taken["python_source"] == "faulthandler"
        frames = [f for thread in taken["python"] for f in thread["frames"]]
        assert {"file": str(script), "line": 3, "function": "<module>"} in frames
        main = next(t for t in taken["threads"] if t["tid"] == child.pid)
        assert main["syscall"]["name"] == "read" and main["syscall"]["target"].startswith("pipe:")
        time.sleep(0.2)
        assert child.poll() is None  # the dump did not end it: the read goes on
        [again] = capture([child.pid], tmp_path, {child.pid: live})  # and it answers a second time
        assert again["python"] and next(t for t in again["threads"] if t["tid"] == child.pid)["syscall"]
    finally:
        child.kill()
        child.wait()


BUSY = """
import sys, threading, time
from dlscope.injob import hangagent as agent
agent.install(sys.argv[1])
def recurse(n):
    return 0 if n == 0 else 1 + recurse(n - 1)
def spin():
    while True:
        sum(i for i in range(100)) + recurse(40)
threading.Thread(target=spin, daemon=True).start()
print("ready", flush=True)
deadline = time.time() + 3
while time.time() < deadline:
    recurse(80)
"""


def test_a_stream_of_stack_signals_kills_neither_a_busy_process_nor_one_exiting(tmp_path):
    """A stack signal every 2 ms on two threads pushing and popping frames, then through the
    interpreter's exit: a C-level dump there read half-built frames (SIGSEGV), and a signal during
    finalization met its default action (killed by the signal itself)."""
    script = tmp_path / "busy.py"
    script.write_text(BUSY)
    child = subprocess.Popen(
        [sys.executable, str(script), str(tmp_path)], env=with_bootstrap(), stdout=subprocess.PIPE, text=True
    )
    assert child.stdout.readline() == "ready\n"
    sent = 0
    while child.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child.pid, STACK_SIGNAL)
            sent += 1
        time.sleep(0.002)
    assert child.wait() == 0 and sent > 200
    dumps = (tmp_path / f"stacks-{child.pid}.txt").read_text()
    first = parse_faulthandler(dumps)  # the first dump: both threads
    assert len(first) == 2 and all(thread["frames"] for thread in first)
    # over all the dumps, the main thread was caught inside recurse too, and never in the handler itself
    functions = set(re.findall(r"^  File .* in (\S+)$", dumps, re.MULTILINE))
    assert {"recurse", "<module>", "spin"} <= functions and "_dump_stacks" not in functions


def test_on_hang_wait_leaves_the_job_running_and_the_capture_whole_on_disk(tmp_path):
    """--on-hang wait: hang-1.json holds every process's threads and stacks; once it is there a writer
    opens the FIFO (the worker's blocked open returns, its read gets end-of-file) and the job ends well."""
    fifo, out = tmp_path / "late.fifo", tmp_path / "run"
    os.mkfifo(fifo)
    writer = subprocess.Popen(["sh", "-c", f'while [ ! -e "{out}/hang-1.json" ]; do sleep 0.1; done; : > "{fifo}"'])
    try:
        command = [sys.executable, str(SCRIPTS / "hang_loader.py"), "--fifo", str(fifo)]
        sections, code = run_job(out, command, HangOptions(hang_after=1.0, on_hang="wait"))
    finally:
        writer.kill()
        writer.wait()
    section = sections["hang"]
    assert code == 0 and not section["ended_job"] and step_rows(sections)[-1]["step"] > 8
    [blocked] = section["captures"][0]["verdict"]["blocked_io"]
    assert (blocked["syscall"], blocked["path"]) == ("openat", str(fifo))  # blocked opening: no writer yet
    taken = json.loads((out / section["captures"][0]["file"]).read_text())
    assert all(p["threads"] and p["python_source"] == "faulthandler" for p in taken["processes"] if p["alive"])


def wait_for(condition, what: str, limit_s: float = 180.0):
    """Poll until `condition()` is truthy; a guard against a test that would never end, not a timing check."""
    deadline = time.monotonic() + limit_s
    while not (value := condition()):
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.1)
    return value


def test_stacks_on_demand_of_a_run_and_of_a_process_without_dlscope(tmp_path, capsys):
    fifo, out = tmp_path / "samples.fifo", tmp_path / "run"
    os.mkfifo(fifo)
    held = os.open(fifo, os.O_RDWR)
    command = [sys.executable, str(SCRIPTS / "hang_loader.py"), "--fifo", str(fifo)]
    job_err = tmp_path / "job.stderr"  # why the job ended, if it ends before the test is done with it
    job = subprocess.Popen(
        [sys.executable, "-m", "dlscope.cli", "run", "--out", str(out), "--hang-after", "off", "--", *command],
        stdout=subprocess.DEVNULL,
        stderr=job_err.open("w"),
    )
    plain = subprocess.Popen(["sleep", "600"])
    try:
        wait_for(
            lambda: (out / "processes").is_dir() and any(v.forked for v in read_all(out / "processes")), "a worker"
        )
        worker = next(v.pid for v in read_all(out / "processes") if v.forked)

        def blocked() -> list:
            capsys.readouterr()
            assert main(["stacks", str(out), "--json"]) == 0, f"job: {job.poll()}, {job_err.read_text()[-3000:]}"
            return json.loads(capsys.readouterr().out)["verdict"]["blocked_io"]

        [io] = wait_for(blocked, "the worker blocked in its read")
        assert (io["pid"], io["syscall"], io["path"]) == (worker, "read", str(fifo))
        assert main(["stacks", str(plain.pid), "--json"]) == 0
        [alone] = json.loads(capsys.readouterr().out)["processes"]
        assert alone["python"] is None and alone["threads"][0]["syscall"]["name"] in ("clock_nanosleep", "nanosleep")
        assert main(["stacks", str(tmp_path / "nothing")]) == 2
    finally:
        plain.kill()
        job.terminate()
        job.wait()
        os.close(held)
    assert not [v.pid for v in read_all(out / "processes") if alive(v.pid)]


# the built-in job (dlscope train): the same watchdog, with a rank hung by the test hook ------------
BUILTIN = ["--model", "small", "--epochs", "1", "--batch-size", "64", "--train-subset", "512", "--test-subset", "200"]
BUILTIN_QUIET = ["--target-acc", "100", "--no-progress", "--no-tensorboard", "--hang-after", "2", "--on-hang", "end"]
HANG_LINE = line_of(Path(fit_module.__file__), "time.sleep(3600)")


def assert_builtin_hung(out: Path, stderr: str) -> dict:
    """The CLI's one line, the run failed with the hang recorded (and in the report); the verdict."""
    errors = [line for line in stderr.splitlines() if line.startswith("dlscope: error")]
    assert len(errors) == 1 and "the training hung" in errors[0] and "hang-1.json" in errors[0]
    results = json.loads((out / "results.json").read_text())
    assert results["run"]["status"] == "failed"
    section = results["sections"]["hang"]
    assert section["ended_job"] and not section["captures"][0]["left_behind"]
    assert "Hung job" in (out / "report.md").read_text()
    return section["captures"][0]["verdict"]


def test_a_hung_rank_of_the_builtin_job_is_named_and_the_job_ended_with_124(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(HANG_RANK_ENV, "1:5")
    out = tmp_path / "ranks"
    assert main(["train", "--nproc-per-node", "2", "--out", str(out), *BUILTIN, *BUILTIN_QUIET]) == HANG_EXIT_CODE
    verdict = assert_builtin_hung(out, capsys.readouterr().err)
    [stopped] = verdict["stopped"]
    assert (stopped["rank"], stopped["steps"], stopped["phase"]) == (1, 5, "train-epoch-1")
    assert (stopped["where"]["file"], stopped["where"]["line"]) == (fit_module.__file__, HANG_LINE)
    [pending] = verdict["collectives"]  # DDP's gradient all-reduce of step 6
    assert (pending["rank"], pending["op"], pending["seq"], pending["missing_ranks"]) == (0, "all_reduce", 6, [1])
    ranks = rank_pids(out)
    assert len(set(ranks.values())) == 2 and not [pid for pid in ranks if alive(pid)]
    assert_none_left(out)


def test_the_builtin_job_in_one_process_ends_itself_and_its_loader_workers(tmp_path):
    """dlscope's own process is the job: the watchdog thread ends it by raising in its main thread."""
    out = tmp_path / "one"
    args = ["train", "--out", str(out), "--loader", "torch", "--workers", "1", "--threads", "1"]
    job = subprocess.run(
        [sys.executable, "-m", "dlscope.cli", *args, *BUILTIN, *BUILTIN_QUIET],
        env={**os.environ, HANG_RANK_ENV: "0:3"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        timeout=300,
    )
    assert job.returncode == HANG_EXIT_CODE
    verdict = assert_builtin_hung(out, job.stderr)
    [stopped] = verdict["stopped"]
    assert (stopped["pid"], stopped["steps"], stopped["phase"]) == (job_pid(out), 3, "train-epoch-1")
    assert (stopped["where"]["file"], stopped["where"]["line"]) == (fit_module.__file__, HANG_LINE)
    workers = [p for p in verdict["processes"] if p["role"] == "worker"]
    assert workers and not [p for p in workers if alive(p["pid"])]


def job_pid(out: Path) -> int:
    return next(v.pid for v in read_all(out / "processes") if not v.forked)


def test_no_frame_of_dlscopes_machinery_is_a_hung_process_line():
    """A stack with no frame of the user's own (a script installed as a package, run with -m):
    the line named is the built-in job's training code when it is in the stack, else the
    innermost library frame, never a frame of dlscope's observing code — its wrappers, the
    contract, the profiler's stderr guard (before, the innermost frame of all, and a frame in
    measure/ or contract/ was taken for the built-in job's)."""
    package = Path(hangverdict.__file__).resolve().parent.parent
    installed = {"file": "/usr/lib/python3/site-packages/trainer/loop.py", "line": 7, "function": "fit"}
    builtin = {"file": str(package / "train.py"), "line": 5, "function": "train_epoch"}
    for machinery in ("measure/native_stderr.py", "contract/live.py", "phases.py", "injob/hooks.py"):
        ours = {"file": str(package / machinery), "line": 3, "function": "wrapper"}
        assert hangverdict._where([ours, installed])["file"] == installed["file"]
        assert hangverdict._where([ours, builtin, installed])["file"] == builtin["file"]
