"""The writer of an observed process's record files (their layout: dlscope.contract.records):
`<pid>.jsonl`, one JSON line per record, and `<pid>.steps`, one packed row per finished step, into
a small shared memory map of the file's end; `<pid>.collectives`, two rows per collective. Stdlib
only; a forked child calls `reopen()`."""

from __future__ import annotations

import json
import mmap
import os
import struct
import threading
from typing import Any

from dlscope.contract.env import STRICT_ENV
from dlscope.contract.records import (
    CODES,
    COLLECTIVE_STRUCT,
    NONE_U4,
    ROW_BYTES,
    STEP_STRUCT,
    STEPS_MAGIC,
    STEPS_WINDOW,
    collectives_header,
    collectives_path,
    records_path,
    steps_header,
    steps_path,
)

_pack_step = STEP_STRUCT.pack_into  # bound once: the hot path's row
_pack_collective_into = COLLECTIVE_STRUCT.pack_into
_COLLECTIVE_BYTES = COLLECTIVE_STRUCT.size
_LAST_ROW_AT = STEPS_WINDOW - COLLECTIVE_STRUCT.size  # a row placed past it would not fit the window
_CODE_OF = {name: {value: n for n, value in enumerate(values)} for name, values in CODES.items()}
_SRC, _DATA_SOURCE, _PROFILED = _CODE_OF["src"], _CODE_OF["data_source"], _CODE_OF["profiled"]


def _kib(value: int) -> int:
    return min(int(value) >> 10, NONE_U4 - 1)


class RecordFile:
    """This process's record files; `reopen()` after a fork gives the child its own."""

    row_format = STEP_STRUCT.format  # the step machine's C path packs rows of this format into the window itself

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.lock = threading.Lock()
        self.strict = os.environ.get(STRICT_ENV) == "1"
        self.reopen()

    def reopen(self) -> None:
        self.pid = os.getpid()
        path = records_path(self.directory, self.pid)
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
        self.steps_fd: int | None = None  # opened at the first step: DataLoader workers have none
        self.steps_map: mmap.mmap | None = None  # a forked child drops its parent's (never written to)
        self.steps_base = 0  # the map's offset in the file (a multiple of mmap.ALLOCATIONGRANULARITY)
        self.steps_pos, self.steps_room = 0, -1  # where the next row goes in the map; past `room` it does not fit
        self.unknown_noted = False

    def write(self, record: dict[str, Any]) -> None:
        line = (json.dumps(record, default=str) + "\n").encode()
        with self.lock:
            os.write(self.fd, line)

    def write_step(
        self,
        i: int,
        src: str,
        start: float,
        end: float,
        data: float,
        data_source: str,
        forward: float,
        backward: float,
        optimizer: float,
        backwards: int = 0,
        forwards: int = 0,
        peak_rss: int | None = None,
        peak_cuda: int | None = None,
        profiled: str | None = None,
        profiler_step: int | None = None,
        profiler_seconds: float = 0.0,
        tid: int = 0,
        **unknown: Any,
    ) -> None:
        """A finished step, as one row of `<pid>.steps` (one pack_into the mapped window).
        Called positionally on the hot path (stepmachine.STEP_ARGS, the same names in this order)."""
        if unknown:
            self._unknown(unknown)
        pos = self.steps_pos
        if pos > self.steps_room:  # the window is full, or no step file yet
            pos = self._next_window()
        _pack_step(
            self.steps_map,  # type: ignore[arg-type]
            pos,
            i,
            tid,
            start,
            end - start,
            data,
            forward,
            backward,
            optimizer,
            profiler_seconds,
            NONE_U4 if peak_rss is None else _kib(peak_rss),
            NONE_U4 if peak_cuda is None else _kib(peak_cuda),
            NONE_U4 if profiler_step is None else profiler_step,
            backwards if backwards < 0xFFFF else 0xFFFF,
            forwards if forwards < 0xFFFF else 0xFFFF,
            _SRC[src],
            _DATA_SOURCE[data_source],
            _PROFILED[profiled],
            0,
        )
        self.steps_pos = pos + ROW_BYTES

    def _next_window(self) -> int:
        """Map the STEPS_WINDOW bytes from the page holding the file's logical end (the step file
        is opened, with its header, at the first step); the next row's position in the map."""
        with self.lock:
            if self.steps_fd is None:
                path = steps_path(self.directory, self.pid)
                self.steps_fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
                if os.fstat(self.steps_fd).st_size == 0:
                    os.write(self.steps_fd, steps_header())
                end = _written_end(self.steps_fd)
            else:
                end = self.steps_base + self.steps_pos
            if self.steps_map is not None:
                self.steps_map.close()
            base = end - end % mmap.ALLOCATIONGRANULARITY
            if os.fstat(self.steps_fd).st_size < base + STEPS_WINDOW:
                os.ftruncate(self.steps_fd, base + STEPS_WINDOW)
            self.steps_map = mmap.mmap(self.steps_fd, STEPS_WINDOW, offset=base)
            self.steps_base, self.steps_pos = base, end - base
            self.steps_room = STEPS_WINDOW - STEP_STRUCT.size
            return self.steps_pos

    def close_steps(self) -> None:
        """At exit: the step file cut to its last row (the window's room not yet written goes)."""
        with self.lock:
            if self.steps_map is not None:
                self.steps_map.close()
                os.ftruncate(self.steps_fd, self.steps_base + self.steps_pos)  # type: ignore[arg-type]
            if self.steps_fd is not None:
                os.close(self.steps_fd)
            self.steps_fd, self.steps_map = None, None
            self.steps_base, self.steps_pos, self.steps_room = 0, 0, -1

    def _unknown(self, fields: dict[str, Any]) -> None:
        unknown = sorted(fields)
        if self.strict:
            raise TypeError(f"write_step: fields the step row does not hold: {', '.join(unknown)}")
        if not self.unknown_noted:
            self.unknown_noted = True
            self.write({"k": "error", "where": "step record", "error": f"fields not kept: {', '.join(unknown)}"})


def _written_end(fd: int) -> int:
    """The byte after a step file's last written row (a file a process of the same pid left)."""
    size = os.fstat(fd).st_size
    length = struct.unpack("<I", os.pread(fd, 4, len(STEPS_MAGIC)))[0]
    offset = len(STEPS_MAGIC) + 4 + length
    rows = max(size - offset, 0) // STEP_STRUCT.size
    # zero rows at the end are room; a row's start is at byte 8 of the row
    while rows and os.pread(fd, 8, offset + (rows - 1) * STEP_STRUCT.size + 8) == bytes(8):
        rows -= 1
    return offset + rows * STEP_STRUCT.size


class CollectiveFile:
    """This process's `<pid>.collectives`: a row when a collective is launched, one when it
    completes here (from the thread its Work's future completes on), packed under a lock into a
    small shared memory map of the file's end, as the step rows are (no system call a row; a
    SIGKILL loses nothing written). Room not yet written reads as zero rows (seq 0), which the
    reader skips. Opened at the first collective (most processes launch none); a forked child
    calls `after_fork()` and opens its own at its first; `close()` at exit cuts the file to its
    last row."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.lock = threading.Lock()
        self.fd = -1
        self.map: mmap.mmap | None = None
        self.base = self.pos = 0  # the map's offset in the file; the next row's place in the map

    def write(self, seq: int, step: int, event: int, op: int, t: float) -> None:
        """A row: the collective `seq` of step `step`, launched or done (`event`) at `t` (time.time())."""
        with self.lock:
            if self.map is None or self.pos > _LAST_ROW_AT:
                self._next_window()
            _pack_collective_into(self.map, self.pos, seq, step, t, event, op, 0, 0)
            self.pos += _COLLECTIVE_BYTES

    def _next_window(self) -> None:
        if self.fd < 0:  # the first row of this process
            path = collectives_path(self.directory, os.getpid())
            self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
            os.write(self.fd, collectives_header())
            end = os.fstat(self.fd).st_size
        else:
            end = self.base + self.pos
            self.map.close()  # type: ignore[union-attr]
        self.base = end - end % mmap.ALLOCATIONGRANULARITY
        os.ftruncate(self.fd, self.base + STEPS_WINDOW)
        self.map = mmap.mmap(self.fd, STEPS_WINDOW, offset=self.base)
        self.pos = end - self.base

    def after_fork(self) -> None:
        """In a forked child: its rows go to a file of its own (the parent's map is left alone)."""
        self.lock = threading.Lock()
        self.fd, self.map, self.base, self.pos = -1, None, 0, 0

    def close(self) -> None:
        """At exit: the file cut to its last row."""
        with self.lock:
            if self.map is not None:
                self.map.close()
                os.ftruncate(self.fd, self.base + self.pos)
                os.close(self.fd)
            self.fd, self.map = -1, None
