"""The live status file of one observed process: `<run dir>/processes/live-<pid>.bin`, a small
fixed-layout file mapped in memory and rewritten in place, so a reader (the watchdog, `dlscope
stacks`, a future `dlscope watch`) sees the process's state at any moment without asking it —
also when it is stuck, killed or blocked in C. Stdlib only; little-endian; CLOCK_REALTIME seconds.

    offset  format  field
    0       8s      magic b"DLSLIVE1" (written last, so a half-written file reads as absent)
    8       i       pid
    12      i       rank (-1: none)
    16      i       state: 0 running, 1 exited through Python (atexit)
    20      i       role: 0 the command's process, 1 a forked child, 2 a forked child that is a
                    DataLoader worker (known once its worker loop starts)
    24      q       steps ended
    32      d       time of the last step end (0: none yet)
    40      d       time the current phase began
    48      24s     current phase (NUL-padded; empty: none)
    72      q       collectives entered (per-rank sequence: #n is the n-th entered)
    80      q       collectives finished
    88      d       time the last collective was entered
    96      24s     name of the last collective entered
    120     d       process start time
    128     q       the main thread's `threading.get_ident()` (names it in faulthandler's dump)
    136             size

A step end costs one `struct.pack_into` (the hot path); phases and collectives are rarer.
"""

from __future__ import annotations

import mmap
import os
import struct
import threading
import time
from dataclasses import dataclass
from pathlib import Path

MAGIC = b"DLSLIVE1"
SIZE = 136
PREFIX = "live-"
_HEAD = struct.Struct("<8siiii")  # magic, pid, rank, state, role
_STEP = struct.Struct("<qd")  # at 24
_STEP_COUNT = struct.Struct("<q")  # at 24
_PHASE = struct.Struct("<d24s")  # at 40
_ENTER = struct.Struct("<qqd24s")  # at 72: entered, finished, entered at, name
_FINISH = struct.Struct("<q")  # at 80
_STARTED = struct.Struct("<dq")  # at 120: start time, main thread ident
_ALL = struct.Struct("<8siiiiqdd24sqqd24sdq")
assert _ALL.size == SIZE


def live_path(directory: str | Path, pid: int) -> Path:
    return Path(directory) / f"{PREFIX}{pid}.bin"


class LiveStatus:
    """This process's live file; `reopen()` in a forked child gives the child its own."""

    def __init__(self, directory: str, rank: int | None) -> None:
        self.directory = directory
        self.rank = -1 if rank is None else rank
        self.entered = self.finished = 0
        self.map: mmap.mmap | None = None
        self._open(role=0)

    def _open(self, role: int) -> None:
        path = live_path(self.directory, os.getpid())
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            os.ftruncate(fd, SIZE)
            self.map = mmap.mmap(fd, SIZE)
        finally:
            os.close(fd)  # the mapping keeps the file
        _STARTED.pack_into(self.map, 120, time.time(), threading.main_thread().ident or 0)
        _HEAD.pack_into(self.map, 0, MAGIC, os.getpid(), self.rank, 0, role)

    def reopen(self) -> None:
        """After a fork: the child's own file, its counters from zero."""
        self.entered = self.finished = 0
        self._open(role=1)

    def loader_worker(self) -> None:
        """This forked child is a DataLoader worker (a forked child may train too: hogwild, A3C)."""
        struct.pack_into("<i", self.map, 20, 2)

    def step_ended(self, count: int, now: float) -> None:
        """`count` steps have ended, the last at `now`."""
        _STEP.pack_into(self.map, 24, count, now)

    # the step machine's C path packs the same into `map` there itself (injob/_fastpath.c)
    step_ended.packs_step_at = 24  # type: ignore[attr-defined]

    def steps(self) -> int:
        """Steps ended so far: the index of the step now running."""
        return _STEP_COUNT.unpack_from(self.map, 24)[0]

    def phase(self, name: str) -> None:
        _PHASE.pack_into(self.map, 40, time.time(), name.encode()[:24])

    def collective_entered(self, name: str) -> int:
        """The entered collective's sequence number (1-based, per process)."""
        self.entered += 1
        _ENTER.pack_into(self.map, 72, self.entered, self.finished, time.time(), name.encode()[:24])
        return self.entered

    def collective_finished(self) -> None:
        self.finished += 1
        _FINISH.pack_into(self.map, 80, self.finished)

    def exited(self) -> None:
        struct.pack_into("<i", self.map, 16, 1)


@dataclass
class LiveView:
    """One live file as read back."""

    pid: int
    rank: int | None
    exited: bool
    forked: bool  # a forked child, or a DataLoader worker (a spawned one too): no process of its own command
    loader_worker: bool
    steps: int
    last_step_end: float | None
    phase: str | None
    phase_since: float
    collectives_entered: int
    collectives_finished: int
    last_collective: str | None
    last_collective_at: float | None
    started: float
    main_thread: int


def read_live(path: Path) -> LiveView | None:
    """The file's state, or None when it is not (yet) a complete live file."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    if len(data) < SIZE or data[:8] != MAGIC:
        return None
    (_, pid, rank, state, role, steps, last, since, phase, entered, finished, at, name, started, main) = (
        _ALL.unpack_from(data)
    )
    return LiveView(
        pid=pid,
        rank=None if rank < 0 else rank,
        exited=state == 1,
        forked=role in (1, 2),
        loader_worker=role == 2,
        steps=steps,
        last_step_end=last or None,
        phase=phase.rstrip(b"\0").decode(errors="replace") or None,
        phase_since=since,
        collectives_entered=entered,
        collectives_finished=finished,
        last_collective=name.rstrip(b"\0").decode(errors="replace") or None,
        last_collective_at=at or None,
        started=started,
        main_thread=main,
    )


def read_all(directory: Path) -> list[LiveView]:
    views = (read_live(p) for p in sorted(directory.glob(f"{PREFIX}*.bin")))
    return [v for v in views if v is not None]
