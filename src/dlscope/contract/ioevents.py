"""The one event record every backend produces, the syscall kinds, and fd → path resolution.

An event is a plain dict (one JSON line in events.jsonl):

    {"ts": 1732248000.123456, "pid": 4242, "tid": 4243, "call": "read", "kind": "read",
     "path": "/work/data/train-images-idx3-ubyte", "fd": 5, "ret": 65536, "bytes": 65536,
     "dur": 1.2e-05, "err": null}

`ts` and `dur` are seconds; `bytes` is set for reads and writes that moved data; `err` is the
errno name of a failed call. Phase markers become {"call": "phase", "name": ..., "edge": ...}.
"""

from __future__ import annotations

import errno
import heapq
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

from dlscope.phases import parse_marker

Event = dict[str, Any]

KINDS: dict[str, tuple[str, ...]] = {
    "open": ("open", "openat", "openat2", "creat"),
    "close": ("close",),
    "read": ("read", "pread64", "readv", "preadv", "preadv2"),
    "write": ("write", "pwrite64", "writev", "pwritev", "pwritev2"),
    "seek": ("lseek",),
    "sync": ("fsync", "fdatasync"),
    "rename": ("rename", "renameat", "renameat2"),
    "unlink": ("unlink", "unlinkat"),
    "mkdir": ("mkdir", "mkdirat"),
    "stat": ("stat", "lstat", "fstat", "newfstatat", "statx"),
    "getdents": ("getdents64",),
    "mmap": ("mmap",),
    "dup": ("dup", "dup2", "dup3", "fcntl"),
}
KIND_OF = {call: kind for kind, calls in KINDS.items() for call in calls}
TRACED_SYSCALLS = tuple(KIND_OF)
FD_KINDS = ("close", "read", "write", "seek", "sync", "getdents", "mmap", "dup")  # calls whose first argument is an fd
FD_ARG_CALLS = frozenset(call for kind in FD_KINDS for call in KINDS[kind]) | {"fstat"}
F_DUPFD, F_DUPFD_CLOEXEC = 0, 1030


def errno_name(ret: int) -> str | None:
    return errno.errorcode.get(-ret, f"E{-ret}") if ret < 0 else None


def make_event(
    ts: float,
    pid: int,
    tid: int,
    call: str,
    ret: int,
    dur: float | None = None,
    path: str | None = None,
    fd: int | None = None,
    target: str | None = None,
) -> Event:
    """A syscall event, or a phase event when `path` is a phase marker."""
    if path is not None and call in KINDS["open"]:
        marker = parse_marker(path)
        if marker is not None:
            return {"ts": ts, "pid": pid, "tid": tid, "call": "phase", "name": marker[0], "edge": marker[1]}
    kind = KIND_OF.get(call, call)
    moved = ret if kind in ("read", "write") and ret > 0 else None
    event = {
        "ts": ts,
        "pid": pid,
        "tid": tid,
        "call": call,
        "kind": kind,
        "path": path,
        "fd": fd,
        "ret": ret,
        "bytes": moved,
        "dur": dur,
        "err": errno_name(ret),
    }
    if target is not None:  # rename's new name
        event["target"] = target
    return event


class FdTables:
    """fd → path per process (threads share their process's table), following opens, dups,
    fcntl(F_DUPFD*), close and fork — for backends that see only numbers (eBPF).

    Each descriptor remembers when the call that named it started: a close that started before
    it is of the descriptor's previous holder, delivered late (bpftrace reads the CPUs' buffers
    unevenly, beyond `reorder`'s window under load; another thread closed that number just before
    this open took it), and must not unname the file being read."""

    STD: ClassVar[dict[int, str]] = {0: "<stdin>", 1: "<stdout>", 2: "<stderr>"}

    def __init__(self) -> None:
        self.tables: dict[int, dict[int, str]] = {}
        self.named_at: dict[int, dict[int, float]] = {}  # pid → fd → start of the call that named it
        self.cwds: dict[int, str] = {}  # pid → working directory, where a chdir was seen

    def fork(self, parent: int, child: int) -> None:
        """The child starts with a copy of the parent's descriptors as they are at the fork.
        (A new thread is reported as a fork too; its copy goes unused: threads use the pid's.)"""
        self.tables[child] = dict(self.table(parent))
        self.named_at[child] = dict(self.named_at.get(parent, {}))
        if parent in self.cwds:
            self.cwds[child] = self.cwds[parent]

    def chdir(self, event: Event, start: str) -> None:
        """A "cwd" record: the process now works in the directory it names (joined to where it was;
        `start`: the command's directory where no chdir was seen) or its descriptor `fd` opened."""
        pid = event["pid"]
        path = event.get("path")
        if path is None:
            path = self.table(pid).get(event.get("fd", -1))
        if path is not None:
            self.cwds[pid] = os.path.normpath(os.path.join(self.cwds.get(pid, start), path))

    def table(self, pid: int) -> dict[int, str]:
        table = self.tables.get(pid)
        if table is None:
            table = self.tables[pid] = dict(self.STD)
        return table

    def exit(self, pid: int) -> None:
        self.tables.pop(pid, None)
        self.named_at.pop(pid, None)
        self.cwds.pop(pid, None)

    def resolve(self, event: Event, arg: int | None = None) -> None:
        """Fill event["path"] from its fd and update the table from the call's result
        (`arg`: fcntl's cmd, telling F_DUPFD* from the other commands)."""
        call, ret, fd, ts = event["call"], event["ret"], event.get("fd"), event["ts"]
        table = self.table(event["pid"])
        named_at = self.named_at.setdefault(event["pid"], {})
        dirfd = event.pop("dirfd", None)
        if dirfd is not None:  # a *at() call: its path is relative to this directory descriptor
            path, directory = event.get("path") or "", table.get(dirfd)
            if directory is not None and not path.startswith("/"):
                event["path"] = f"{directory}/{path}" if path else directory
        if call in KINDS["open"]:
            if ret >= 0 and event.get("path") is not None and ts >= named_at.get(ret, ts):
                table[ret], named_at[ret] = event["path"], ts
            return
        if fd is None or call not in FD_ARG_CALLS:
            return
        event["path"] = table.get(fd, f"<fd {fd}>")
        if ret < 0:
            return
        if call == "close":
            if ts >= named_at.get(fd, ts):  # not a late close of the number's previous holder
                table.pop(fd, None)
                named_at.pop(fd, None)
        elif call in ("dup", "dup2", "dup3") or (call == "fcntl" and arg in (F_DUPFD, F_DUPFD_CLOEXEC)):
            table[ret], named_at[ret] = event["path"], ts  # the new descriptor (dup2/dup3 return newfd)


class Reorder:
    """Events into timestamp order as they come: tracers deliver per-CPU buffers slightly out of
    order, so a short window is held (a heap, not the whole trace) and what is older is handed on."""

    def __init__(self, emit: Callable[[Event], None], window_s: float = 0.5) -> None:
        self.emit, self.window_s = emit, window_s
        self.heap: list[tuple[float, int, Event]] = []
        self.newest = float("-inf")
        self.count = 0

    def push(self, event: Event) -> None:
        ts = event["ts"]
        if ts > self.newest:
            self.newest = ts
        heapq.heappush(self.heap, (ts, self.count, event))
        self.count += 1
        heap, oldest = self.heap, self.newest - self.window_s
        while heap and heap[0][0] < oldest:
            self.emit(heapq.heappop(heap)[2])

    def flush(self) -> None:
        while self.heap:
            self.emit(heapq.heappop(self.heap)[2])


def read_events(path: Path) -> Iterator[Event]:
    """The events of an events.jsonl (one JSON object a line, as exports write them), streamed."""
    with open(path, encoding="utf-8") as f:
        for line in f:
            yield json.loads(line)
