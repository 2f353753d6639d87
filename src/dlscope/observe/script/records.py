"""The files through which an observed process talks to `dlscope run` — never the command's
stdout. Written by the observed process with the stdlib only; read back by `dlscope run`.

`<run dir>/<pid>.steps`: every finished training step as one fixed-size binary row (60 bytes;
a row is never more than 64), packed straight into a small shared memory map of the file's end
(STEPS_WINDOW bytes, moved along as it fills): no system call per step, and a SIGKILL loses
nothing written (the rows are in the page cache). Until the process exits (when the file is cut
to its last row) the file ends with room not yet written: zero rows, whose `start` is 0; a reader
stops at the first of them (StepFile does). The file starts with a header that describes the
rows, so any reader (numpy, pandas, pyarrow) needs no dlscope code to decode it:

    b"DLSSTEPS"  uint32 little-endian n  n bytes of JSON {"version", "row_bytes", "fields": [[name,
    numpy dtype], ...], "codes": {field: [value of code 0, 1, ...]}, "none_u4"}  rows...

    fields  i uint32 (index in its stream), tid uint32, start float64 (CLOCK_REALTIME s),
            seconds float32 (end − start), data / forward / backward / optimizer float32 (s),
            profiler_seconds float32 (dlscope's own time after the step, outside it),
            peak_rss_kib / peak_cuda_kib uint32 (0xFFFFFFFF: not measured),
            profiler_step uint32 (N of the profiler's ProfilerStep#N; 0xFFFFFFFF: none),
            backwards uint16 (backward() calls in the step, and autograd.grad calls not kept
            differentiable), forwards uint16 (forwards timed as the step's: its outermost module
            calls), src uint8 (optimizer|backward),
            data_source uint8 (gap|loader), profiled uint8 (none|wait|warmup|active),
            flags uint8 (reserved, 0)

    import numpy as np, pandas as pd
    from dlscope.observe.script.records import StepFile
    frame = pd.DataFrame(StepFile("runs/run-x/processes/1234.steps").read())

`<run dir>/<pid>.jsonl`: everything else, one JSON line per record (a handful per process):
    process   pid, ppid, argv, rank, world_size, clocks (start)
    B / E     a phase begins / ends: name, ts, file (checkpoints)
    E         of a checkpoint phase: files (every file written inside it)
    profile   trace, ops (key_averages rows), export_seconds
    rank      rank, world_size (when the process joined a process group: init_process_group)
    observed  torch_attached, optimizer_steps, backward_steps, torch_optimizer, batches_elsewhere
              (batches drawn in a thread other than the steps': a prefetcher's) (at exit)
    optimizers  stepped [{class, steps, first}] per optimizer instance stepped at top level, in the
              order they first stepped (first: the index of its first step), returns
              (how often one stepped again after another), scaler_skipped (GradScaler steps that
              did not call the optimizer's) and scaler_skipped_steps (the first 100 of their step
              numbers); at exit, when one stepped
    error     where, error (an observer that could not attach, step fields it did not know)
    end       clocks (at exit)
"""

from __future__ import annotations

import json
import mmap
import os
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

CLOCK_NAMES = ("realtime", "boottime", "monotonic")
STEPS_MAGIC = b"DLSSTEPS"
STEPS_VERSION = 1
NONE_U4 = 0xFFFFFFFF
# (field, struct code, numpy dtype): the row, in order. A field added here is read by every reader
# from the header; keep the row ≤ 64 bytes.
STEP_ROW = (
    ("i", "I", "<u4"),
    ("tid", "I", "<u4"),
    ("start", "d", "<f8"),
    ("seconds", "f", "<f4"),
    ("data", "f", "<f4"),
    ("forward", "f", "<f4"),
    ("backward", "f", "<f4"),
    ("optimizer", "f", "<f4"),
    ("profiler_seconds", "f", "<f4"),
    ("peak_rss_kib", "I", "<u4"),
    ("peak_cuda_kib", "I", "<u4"),
    ("profiler_step", "I", "<u4"),
    ("backwards", "H", "<u2"),
    ("forwards", "H", "<u2"),
    ("src", "B", "u1"),
    ("data_source", "B", "u1"),
    ("profiled", "B", "u1"),
    ("flags", "B", "u1"),
)
STEP_STRUCT = struct.Struct("<" + "".join(code for _, code, _ in STEP_ROW))
ROW_BYTES = STEP_STRUCT.size
_pack_step = STEP_STRUCT.pack_into  # bound once: the hot path's row
STEPS_WINDOW = 1 << 16  # bytes of the step file mapped at a time (~1,100 rows; its pages count in the RSS)
CODES: dict[str, tuple[str | None, ...]] = {
    "src": ("optimizer", "backward"),
    "data_source": ("gap", "loader"),
    "profiled": (None, "wait", "warmup", "active"),
}
_CODE_OF = {name: {value: n for n, value in enumerate(values)} for name, values in CODES.items()}
_SRC, _DATA_SOURCE, _PROFILED = _CODE_OF["src"], _CODE_OF["data_source"], _CODE_OF["profiled"]
# tests set it (tests/conftest.py): a step field the packing does not know fails loudly there;
# in a user's job it is noted once in the records and the step is kept
STRICT_ENV = "DLSCOPE_STRICT_RECORDS"


def clocks() -> dict[str, int]:
    """The clocks the tracers stamp with, read back to back (ns): their offsets map one onto another."""
    return {
        "realtime": time.clock_gettime_ns(time.CLOCK_REALTIME),
        "boottime": time.clock_gettime_ns(time.CLOCK_BOOTTIME),
        "monotonic": time.clock_gettime_ns(time.CLOCK_MONOTONIC),
    }


def steps_header() -> bytes:
    description = {
        "version": STEPS_VERSION,
        "row_bytes": STEP_STRUCT.size,
        "fields": [[name, dtype] for name, _, dtype in STEP_ROW],
        "codes": CODES,
        "none_u4": NONE_U4,
    }
    text = json.dumps(description).encode()
    text += b" " * (-(len(STEPS_MAGIC) + 4 + len(text)) % 8)  # rows start 8-byte aligned
    return STEPS_MAGIC + struct.pack("<I", len(text)) + text


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
        path = os.path.join(self.directory, f"{self.pid}.jsonl")
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
                path = os.path.join(self.directory, f"{self.pid}.steps")
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


class StepFile:
    """A `<pid>.steps` file read back in chunks of rows (numpy structured arrays: no Python object
    per step). Not counted: the room a running (or killed) process has not written yet at the
    end (zero rows), and a row cut short."""

    def __init__(self, path: Path) -> None:
        import numpy as np

        self.path = Path(path)
        with open(self.path, "rb") as f:
            head = f.read(len(STEPS_MAGIC) + 4)
            if len(head) < len(STEPS_MAGIC) + 4 or head[: len(STEPS_MAGIC)] != STEPS_MAGIC:
                raise ValueError(f"{self.path}: not a dlscope step file")
            (length,) = struct.unpack("<I", head[len(STEPS_MAGIC) :])
            self.description = json.loads(f.read(length))
        self.offset = len(STEPS_MAGIC) + 4 + length
        self.dtype = np.dtype([(name, dtype) for name, dtype in self.description["fields"]])
        self.codes: dict[str, list[str | None]] = self.description["codes"]
        whole = max(self.path.stat().st_size - self.offset, 0) // self.dtype.itemsize
        self.count = _rows_written(self.path, self.offset, self.dtype, whole)

    def chunks(self, rows: int = 1 << 16) -> Iterator[Any]:
        import numpy as np

        with open(self.path, "rb") as f:
            f.seek(self.offset)
            left = self.count
            while left > 0:
                chunk = np.fromfile(f, self.dtype, min(rows, left))
                if not len(chunk):
                    return
                left -= len(chunk)
                yield chunk

    def read(self) -> Any:
        """Every row, as one structured array (itemsize bytes per step)."""
        import numpy as np

        return np.fromfile(self.path, self.dtype, self.count, offset=self.offset)


def _rows_written(path: Path, offset: int, dtype: Any, rows: int) -> int:
    """How many of the file's `rows` were written: the room at the end (at most a window, zero
    rows: `start` is 0) is not. Rows are written in order, so only the last window is looked at."""
    import numpy as np

    tail = min(rows, STEPS_WINDOW // dtype.itemsize + 1)
    starts = np.fromfile(path, dtype, tail, offset=offset + (rows - tail) * dtype.itemsize)["start"]
    written = np.flatnonzero(starts != 0.0)
    return rows - tail + (int(written[-1]) + 1 if len(written) else 0)


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


def read_records(directory: Path) -> dict[int, list[dict[str, Any]]]:
    """pid → its JSON records (not its steps) in the order written; a line cut by a kill is skipped."""
    processes: dict[int, list[dict[str, Any]]] = {}
    for path in sorted(directory.glob("*.jsonl")):
        if not path.stem.isdigit():
            continue
        processes[int(path.stem)] = list(_lines(path))
    return processes


def step_files(directory: Path) -> dict[int, StepFile]:
    """pid → its step file, for the processes that finished a step."""
    return {int(p.stem): StepFile(p) for p in sorted(directory.glob("*.steps")) if p.stem.isdigit()}


def _lines(path: Path) -> Iterator[dict[str, Any]]:
    with open(path, encoding="utf-8", errors="backslashreplace") as f:
        for line in f:
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                continue
