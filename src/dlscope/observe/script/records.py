"""The files through which an observed process talks to `dlscope run` — never the command's
stdout. Written by the observed process with the stdlib only; read back by `dlscope run`.

`<run dir>/<pid>.steps`: every finished training step as one fixed-size binary row (58 bytes;
a row is never more than 64), appended with one unbuffered write (a SIGKILL loses at most the
step being written; a row cut short is ignored when read). The file starts with a header that
describes the rows, so any reader (numpy, pandas, pyarrow) needs no dlscope code to decode it:

    b"DLSSTEPS"  uint32 little-endian n  n bytes of JSON {"version", "row_bytes", "fields": [[name,
    numpy dtype], ...], "codes": {field: [value of code 0, 1, ...]}, "none_u4"}  rows...

    fields  i uint32 (index in its stream), tid uint32, start float64 (CLOCK_REALTIME s),
            seconds float32 (end − start), data / forward / backward / optimizer float32 (s),
            profiler_seconds float32 (dlscope's own time after the step, outside it),
            peak_rss_kib / peak_cuda_kib uint32 (0xFFFFFFFF: not measured),
            profiler_step uint32 (N of the profiler's ProfilerStep#N; 0xFFFFFFFF: none),
            backwards uint16 (backward() calls in the step), src uint8 (optimizer|backward),
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
    observed  torch_attached, optimizer_steps, backward_steps, torch_optimizer (at exit)
    error     where, error (an observer that could not attach, step fields it did not know)
    end       clocks (at exit)
"""

from __future__ import annotations

import json
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
    ("src", "B", "u1"),
    ("data_source", "B", "u1"),
    ("profiled", "B", "u1"),
    ("flags", "B", "u1"),
)
STEP_STRUCT = struct.Struct("<" + "".join(code for _, code, _ in STEP_ROW))
CODES: dict[str, tuple[str | None, ...]] = {
    "src": ("optimizer", "backward"),
    "data_source": ("gap", "loader"),
    "profiled": (None, "wait", "warmup", "active"),
}
_CODE_OF = {name: {value: n for n, value in enumerate(values)} for name, values in CODES.items()}
# what the hooks hand to write_step (keyword names), beside the row's own names
STEP_FIELDS = frozenset(
    (
        "i",
        "src",
        "start",
        "end",
        "data",
        "data_source",
        "forward",
        "backward",
        "optimizer",
        "peak_rss",
        "peak_cuda",
        "profiled",
        "profiler_seconds",
        "profiler_step",
        "backwards",
        "tid",
    )
)
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


def _kib(value: int | None) -> int:
    return NONE_U4 if value is None else min(int(value) >> 10, NONE_U4 - 1)


def pack_step(fields: dict[str, Any]) -> bytes:
    """One step's row. KeyError on a missing field; a code not in CODES raises KeyError too."""
    get = fields.get
    start = fields["start"]
    return STEP_STRUCT.pack(
        fields["i"],
        get("tid") or 0,
        start,
        fields["end"] - start,
        fields["data"],
        fields["forward"],
        fields["backward"],
        fields["optimizer"],
        get("profiler_seconds") or 0.0,
        _kib(get("peak_rss")),
        _kib(get("peak_cuda")),
        NONE_U4 if get("profiler_step") is None else fields["profiler_step"],
        min(get("backwards") or 0, 0xFFFF),
        _CODE_OF["src"][fields["src"]],
        _CODE_OF["data_source"][fields["data_source"]],
        _CODE_OF["profiled"][get("profiled")],
        0,
    )


class RecordFile:
    """This process's record files; `reopen()` after a fork gives the child its own."""

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
        self.unknown_noted = False

    def write(self, record: dict[str, Any]) -> None:
        line = (json.dumps(record, default=str) + "\n").encode()
        with self.lock:
            os.write(self.fd, line)

    def write_step(self, **fields: Any) -> None:
        """A finished step, as one row of `<pid>.steps` (one write(2): O_APPEND keeps rows whole)."""
        if len(fields) > len(STEP_FIELDS) or not fields.keys() <= STEP_FIELDS:
            self._unknown(fields)
        row = pack_step(fields)
        if self.steps_fd is None:
            self._open_steps()
        os.write(self.steps_fd, row)  # type: ignore[arg-type]

    def _open_steps(self) -> None:
        path = os.path.join(self.directory, f"{self.pid}.steps")
        with self.lock:
            self.steps_fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
            if os.fstat(self.steps_fd).st_size == 0:
                os.write(self.steps_fd, steps_header())

    def _unknown(self, fields: dict[str, Any]) -> None:
        unknown = sorted(fields.keys() - STEP_FIELDS)
        if self.strict:
            raise TypeError(f"write_step: fields the step row does not hold: {', '.join(unknown)}")
        if not self.unknown_noted:
            self.unknown_noted = True
            self.write({"k": "error", "where": "step record", "error": f"fields not kept: {', '.join(unknown)}"})


class StepFile:
    """A `<pid>.steps` file read back in chunks of rows (numpy structured arrays: no Python object
    per step). The rows a kill cut short at the end are not counted."""

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
        size = self.path.stat().st_size
        self.count = max(size - self.offset, 0) // self.dtype.itemsize

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
