"""Real write faults: a full disk, a read-only mount, files where directories should be, two
runs in one directory, a killed writer's temp files. Each: one line, exit 2, nothing left behind,
earlier files byte-identical."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import resource
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dlscope.cli import main
from dlscope.fsutil import TEMP_MARK

QUICK = ["--epochs", "1", "--train-subset", "300", "--test-subset", "100", "--batch-size", "100", "--no-progress"]


def cli(*args: str, preexec=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "dlscope.cli", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "COLUMNS": "80"},
        preexec_fn=preexec,
    )


def assert_one_line(stderr: str, *needles: str) -> None:
    # only dlscope's own lines: TensorFlow, when installed and imported, logs to stderr by itself
    lines = [line for line in stderr.splitlines() if line.startswith("dlscope")]
    assert len(lines) == 1 and lines[0].startswith("dlscope: error: "), stderr
    assert stderr.rstrip().endswith(lines[0])
    assert "Traceback" not in stderr and all(n in lines[0] for n in needles), stderr


def temps_under(root: Path) -> list[Path]:
    return list(root.rglob(f"{TEMP_MARK}*"))


def digests(root: Path) -> dict[str, str]:
    files = (p for p in root.rglob("*") if p.is_file())
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


@contextlib.contextmanager
def mounted(source: str, target: Path, *options: str) -> Iterator[None]:
    target.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", *options, source, str(target)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount here ({done.stderr.strip()}); needs root")
    try:
        yield
    finally:
        subprocess.run(["umount", "-l", str(target)], check=False)


def can_mount() -> bool:
    return os.geteuid() == 0 and Path("/proc/filesystems").read_text().find("tmpfs") >= 0


def fill(directory: Path, leave_kib: int) -> None:
    """Use up a small file system, leaving `leave_kib` free."""
    st = os.statvfs(directory)
    free = st.f_bavail * st.f_frsize
    (directory / "filler").write_bytes(b"\0" * max(free - leave_kib * 1024, 0))


@pytest.mark.parametrize("leave_kib", [4, 100, 600])  # fails at results.json, last.pt, final.pt
def test_full_disk_is_one_line_and_leaves_no_temp(tmp_path, leave_kib):
    disk = tmp_path / "disk"
    if can_mount():
        with mounted("tmpfs", disk, "-t", "tmpfs", "-o", "size=2m"):
            fill(disk, leave_kib)
            done = cli("train", "--out", str(disk / "run"), *QUICK)
            temps = temps_under(disk)
        cause = "no space left on the device"
    else:  # no mount: the same fault through a file-size limit on the child
        disk.mkdir()

        def limit() -> None:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # write() then fails with EFBIG
            resource.setrlimit(resource.RLIMIT_FSIZE, (leave_kib * 1024, leave_kib * 1024))

        done = cli("train", "--out", str(disk / "run"), *QUICK, preexec=limit)
        temps = temps_under(disk)
        cause = "file too large"
    assert done.returncode == 2, done.stderr
    assert_one_line(done.stderr, cause, str(disk / "run"))
    assert temps == []


def test_read_only_mount_and_files_in_the_way(tmp_path, capsys):
    source = tmp_path / "src"
    (source / "old").mkdir(parents=True)
    (source / "old" / "results.json").write_text("{}")
    ro = tmp_path / "ro"
    with mounted(str(source), ro, "--bind", "-o", "ro"):
        for out in (ro / "old", ro / "new"):
            done = cli("train", "--out", str(out), *QUICK)
            assert done.returncode == 2
            assert_one_line(done.stderr, "read-only file system", str(out))
    assert (source / "old" / "results.json").read_text() == "{}"
    a_file = tmp_path / "a-file"
    a_file.write_text("keep")
    for out, cause in ((a_file, "exists as a file"), (a_file / "below", "is a file, not a directory")):
        assert main(["train", "--out", str(out), *QUICK]) == 2
        assert_one_line(capsys.readouterr().err, str(out), cause)
    assert a_file.read_text() == "keep"


def test_checkpoints_being_a_file_is_one_line(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "checkpoints").write_text("in the way")
    assert main(["train", "--out", str(run), *QUICK, "--no-tensorboard"]) == 2
    err = capsys.readouterr().err
    assert_one_line(err, str(run / "checkpoints"), "exists as a file")
    assert (run / "checkpoints").read_text() == "in the way"
    assert json.loads((run / "results.json").read_text())["run"]["status"] == "failed"


HOLD_LOCK = textwrap.dedent(
    """
    import sys, time
    from dlscope.rundir import RunDir
    run = RunDir(sys.argv[1], "holder")  # held while this object lives
    print("held", flush=True)
    time.sleep(600)
    """
)


def test_second_writer_is_refused_and_a_dead_holder_releases(tmp_path, capsys):
    run = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(run)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        before = digests(run)
        assert main(["train", "--out", str(run), *QUICK]) == 2
        assert_one_line(capsys.readouterr().err, str(run), f"pid {holder.pid}")
        assert digests(run) == before  # the refused run wrote nothing
    finally:
        holder.kill()  # a crash: the kernel drops its lock with its descriptors
        holder.wait()
    assert main(["train", "--out", str(run), *QUICK, "--no-tensorboard"]) == 0
    assert json.loads((run / "results.json").read_text())["run"]["command"] == "train"


def test_two_concurrent_runs_into_one_directory(tmp_path, capsys):
    run = tmp_path / "run"
    common = ["train", "--out", str(run), "--no-progress", "--no-tensorboard"]
    # the first run (a process of its own) trains until stopped, so the second (this one) surely
    # starts while it writes
    endless = ["--epochs", "1000", "--target-acc", "100", "--train-subset", "300", "--test-subset", "100"]
    first = subprocess.Popen(
        [sys.executable, "-m", "dlscope.cli", *common, *endless],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.time() + 120
        while not (run / "checkpoints" / "last.pt").exists() and time.time() < deadline:
            time.sleep(0.05)
        assert main([*common, *QUICK]) == 2
        assert_one_line(capsys.readouterr().err, f"pid {first.pid}")
        assert first.poll() is None  # the first run went on, untouched
    finally:
        first.send_signal(signal.SIGTERM)
        first.wait(timeout=120)
    assert first.returncode == 128 + signal.SIGTERM
    results = json.loads((run / "results.json").read_text())
    assert results["run"]["status"] == "interrupted" and results["run"]["argv"][-1] == "100"


def test_stale_temp_of_a_killed_writer_is_removed_by_the_next_run(tmp_path):
    """Issue 16 item 12: a SIGKILL mid-write leaves .dlscope-tmp-results.json.<pid>; the next run cleans it."""
    run = tmp_path / "run"
    run.mkdir()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)
    stale = [run / f"{TEMP_MARK}results.json.{dead_pid}", run / "checkpoints" / f"{TEMP_MARK}last.pt.{dead_pid}"]
    stale[1].parent.mkdir()
    for path in stale:
        path.write_bytes(b"half")
    alive = run / f"{TEMP_MARK}results.json.{os.getppid()}"  # a live process's: not ours to remove
    alive.write_bytes(b"busy")
    assert main(["train", "--out", str(run), *QUICK, "--no-tensorboard"]) == 0
    assert not any(p.exists() for p in stale) and alive.exists()
