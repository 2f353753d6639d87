"""The state of a running process, read from outside: each thread's kernel wait channel and
current system call (/proc/PID/task/TID/{wchan,syscall}) with the file behind a blocked fd, the
live status file, and — for a process with dlscope's bootstrap — every thread's Python stack,
dumped on a signal (injob/hangagent.py). Facts only; analysis/hangverdict.py reads them.
Linux x86-64 and arm64 syscall numbers; another machine gets the number."""

from __future__ import annotations

import contextlib
import os
import platform
import re
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from dlscope.contract.env import STACK_SIGNAL, STACK_SIGNAL_IN_C
from dlscope.contract.live import LiveView
from dlscope.contract.records import stacks_path

# the system calls a stuck thread sits in; the first argument of those in FD_CALLS is an fd
_X86_64 = {
    0: "read", 1: "write", 7: "poll", 17: "pread64", 18: "pwrite64", 19: "readv", 20: "writev",
    23: "select", 34: "pause", 35: "nanosleep", 42: "connect", 43: "accept", 44: "sendto",
    45: "recvfrom", 46: "sendmsg", 47: "recvmsg", 61: "wait4", 72: "fcntl", 73: "flock",
    74: "fsync", 75: "fdatasync", 202: "futex", 230: "clock_nanosleep", 232: "epoll_wait",
    247: "waitid", 257: "openat", 270: "pselect6", 271: "ppoll", 281: "epoll_pwait",
    288: "accept4", 16: "ioctl", 128: "rt_sigtimedwait", 130: "rt_sigsuspend",
}  # fmt: skip
_ARM64 = {
    63: "read", 64: "write", 67: "pread64", 68: "pwrite64", 65: "readv", 66: "writev",
    73: "ppoll", 72: "pselect6", 101: "nanosleep", 203: "connect", 202: "accept", 206: "sendto",
    207: "recvfrom", 211: "sendmsg", 212: "recvmsg", 260: "wait4", 25: "fcntl", 32: "flock",
    82: "fsync", 83: "fdatasync", 98: "futex", 115: "clock_nanosleep", 22: "epoll_pwait",
    95: "waitid", 56: "openat", 242: "accept4", 29: "ioctl", 137: "rt_sigtimedwait", 133: "rt_sigsuspend",
}  # fmt: skip
SYSCALLS = {"x86_64": _X86_64, "aarch64": _ARM64}.get(platform.machine(), {})
FD_CALLS = {
    "read", "write", "pread64", "pwrite64", "readv", "writev", "connect", "accept", "accept4", "sendto",
    "recvfrom", "sendmsg", "recvmsg", "fsync", "fdatasync", "flock", "ioctl", "fcntl", "epoll_wait", "epoll_pwait",
}  # fmt: skip
AT_FDCWD = -100
# how long a dump may take to appear: between bytecodes, then (blocked in C) from the C handler
ANSWER_S = 0.5
STACK_WAIT_S = 2.0  # a process swapped out, a loaded machine
_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-f]+) \(most recent call first\):")
_FRAME = re.compile(r'^  File "(.*)", line (\d+) in (.*)$')


def read_proc(path: str) -> str | None:
    """A /proc file's text (None: the process or thread is gone)."""
    try:
        with open(path, "rb") as f:
            return f.read().decode(errors="replace")
    except OSError:
        return None


def main_thread_runnable_s(pid: int) -> float | None:
    """Seconds the process's main thread (its thread id is the pid) has wanted a core: run on one,
    and waited in the run queue for one (schedstat). On a machine others share, a thread that
    computes all along runs only part of the time, and waits the rest. Without schedstat, the time
    it ran (utime + stime)."""
    sched = (read_proc(f"/proc/{pid}/task/{pid}/schedstat") or "").split()
    if len(sched) >= 2:
        return (int(sched[0]) + int(sched[1])) / 1e9
    stat = read_proc(f"/proc/{pid}/task/{pid}/stat")
    if stat is None:
        return None
    fields = stat.rsplit(")", 1)[1].split()  # fields[0] is the state (the 3rd field): utime is the 14th
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def alive(pid: int) -> bool:
    stat = read_proc(f"/proc/{pid}/stat")
    return stat is not None and stat.rsplit(")", 1)[1].split()[0] != "Z"


def zombie_exit(pid: int) -> dict[str, int] | None:
    """How a process its parent has not yet waited for ended (/proc stat exit_code); None when
    it is gone altogether (its status went to its parent)."""
    stat = read_proc(f"/proc/{pid}/stat")
    if stat is None:
        return None
    status = int(stat.rsplit(")", 1)[1].split()[-1])
    return {"signal": status & 0x7F} if status & 0x7F else {"code": status >> 8}


def descendants(root: int) -> list[int]:
    """`root` and every process below it, from /proc (children that left its session included)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = read_proc(f"/proc/{entry}/stat")
            if stat:
                children.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(entry))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def syscall_of(pid: int, tid: int) -> dict[str, Any] | None:
    """The system call a thread is blocked in (None: running, or not readable)."""
    text = read_proc(f"/proc/{pid}/task/{tid}/syscall")
    if not text or not text[0].isdigit():
        return None  # "running", "-1 ..." (not in a syscall), or no permission
    fields = text.split()
    number = int(fields[0])
    name = SYSCALLS.get(number, f"syscall {number}")
    call: dict[str, Any] = {"name": name, "number": number}
    if name == "openat" and len(fields) > 2:  # blocked opening (a FIFO with no writer): the path it names
        call["target"] = _opened_path(pid, int(fields[1], 16), int(fields[2], 16))
    elif name in FD_CALLS and len(fields) > 1:
        fd = int(fields[1], 16)
        call["fd"] = fd
        try:
            call["target"] = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            call["target"] = None
    return call


def _opened_path(pid: int, dirfd: int, address: int) -> str | None:
    """The path an openat() names, read from the process's memory (the same access as /proc/PID/syscall)."""
    try:
        with open(f"/proc/{pid}/mem", "rb") as mem:
            mem.seek(address)
            raw = mem.read(4096).split(b"\0", 1)[0]
    except (OSError, ValueError, OverflowError):
        return None
    path = os.fsdecode(raw)
    if path.startswith("/"):
        return path
    base = f"/proc/{pid}/cwd" if dirfd in (AT_FDCWD, AT_FDCWD + (1 << 64)) else f"/proc/{pid}/fd/{dirfd}"
    try:
        return os.path.join(os.readlink(base), path)
    except OSError:
        return None


def threads_of(pid: int) -> list[dict[str, Any]]:
    rows = []
    try:
        tids = sorted(int(t) for t in os.listdir(f"/proc/{pid}/task"))
    except OSError:
        return rows
    for tid in tids:
        stat = read_proc(f"/proc/{pid}/task/{tid}/stat")
        if stat is None:
            continue
        rows.append(
            {
                "tid": tid,
                "name": stat[stat.index("(") + 1 : stat.rindex(")")],
                "state": stat.rsplit(")", 1)[1].split()[0],
                "wchan": (read_proc(f"/proc/{pid}/task/{tid}/wchan") or "").strip() or None,
                "syscall": syscall_of(pid, tid),
            }
        )
    return rows


def catches(pid: int, signum: int) -> bool:
    """Whether the process has a handler for `signum` (/proc status SigCgt)."""
    for line in (read_proc(f"/proc/{pid}/status") or "").splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    return False


def parse_faulthandler(text: str) -> list[dict[str, Any]]:
    """faulthandler's all-threads dump: each thread's ident and frames, innermost first. Only the
    first dump in `text` (a process that answered both stack signals wrote two)."""
    threads: list[dict[str, Any]] = []
    for line in text.splitlines():
        head = _THREAD.match(line)
        if head:
            ident = int(head.group(2), 16)
            if any(t["ident"] == ident for t in threads):
                break
            threads.append({"ident": ident, "frames": []})
            continue
        frame = _FRAME.match(line)
        if frame and threads:
            threads[-1]["frames"].append(
                {"file": frame.group(1), "line": int(frame.group(2)), "function": frame.group(3)}
            )
    return threads


def python_stacks(pids: list[int], directory: Path | None) -> dict[int, tuple[list[dict[str, Any]] | None, str]]:
    """Every thread's Python stack of each process, and how it was had ("faulthandler"), or None
    with why it was not ("no_bootstrap": the process has no dlscope stack handler; "no_answer": no
    dump came within STACK_WAIT_S). All are asked at once, between bytecodes (STACK_SIGNAL); those
    that have not answered within ANSWER_S — blocked in C — by the C-level dump (STACK_SIGNAL_IN_C)."""
    answers: dict[int, tuple[list[dict[str, Any]] | None, str]] = {}
    asked: dict[int, tuple[Path, int]] = {}  # pid: its stacks file, its size before the signal
    for pid in pids:
        stacks = Path(stacks_path(directory, pid)) if directory is not None else None
        if stacks is None or not stacks.exists() or not catches(pid, STACK_SIGNAL):
            answers[pid] = None, "no_bootstrap"
            continue
        asked[pid] = stacks, stacks.stat().st_size
        _send(pid, STACK_SIGNAL)
    started = time.monotonic()
    pending, sizes, in_c = set(asked), {pid: before for pid, (_, before) in asked.items()}, False
    while pending and time.monotonic() < started + STACK_WAIT_S:
        time.sleep(0.02)
        for pid in list(pending):
            stacks, before = asked[pid]
            now = stacks.stat().st_size
            if now > before and now == sizes[pid]:  # grew, then stopped growing: the dump is complete
                pending.discard(pid)
            sizes[pid] = now
        if not in_c and time.monotonic() >= started + ANSWER_S:
            in_c = True
            for pid in pending:
                if sizes[pid] == asked[pid][1] and catches(pid, STACK_SIGNAL_IN_C):
                    _send(pid, STACK_SIGNAL_IN_C)
    for pid, (stacks, before) in asked.items():
        with stacks.open("rb") as f:
            f.seek(before)
            text = f.read().decode(errors="replace")
        answers[pid] = (parse_faulthandler(text), "faulthandler") if text else (None, "no_answer")
    return answers


def _send(pid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # it ended meanwhile: its capture says so
        os.kill(pid, signum)


def capture(pids: list[int], directory: Path | None, views: dict[int, LiveView]) -> list[dict[str, Any]]:
    """The processes as they are now; `directory` holds the live and stacks files of those with
    the bootstrap, `views` their live status."""
    taken: dict[int, dict[str, Any]] = {}
    for pid in pids:
        live = views.get(pid)
        if not alive(pid):
            taken[pid] = {"pid": pid, "alive": False, "live": asdict(live) if live else None, "exit": zombie_exit(pid)}
            continue
        cmdline = (read_proc(f"/proc/{pid}/cmdline") or "").split("\0")
        taken[pid] = {
            "pid": pid,
            "alive": True,
            "argv": [a for a in cmdline if a],
            "live": asdict(live) if live else None,
            # before the signal: a C sleep it interrupts may not resume (a read does)
            "threads": threads_of(pid),
        }
    stacks = python_stacks([pid for pid, p in taken.items() if p["alive"]], directory)
    for pid, (python, source) in stacks.items():
        taken[pid].update(python=python, python_source=source)
    return [taken[pid] for pid in pids]
