"""The reader of an observed process's record files (their layout: dlscope.contract.records):
`<pid>.steps` in chunks of numpy rows, `<pid>.jsonl` as dicts. Documented for users:

    import pandas as pd
    from dlscope.analysis.stepfile import StepFile
    frame = pd.DataFrame(StepFile("runs/run-x/processes/1234.steps").read())
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from dlscope.contract.records import (
    COLLECTIVES_MAGIC,
    COLLECTIVES_SUFFIX,
    RECORDS_SUFFIX,
    STEPS_MAGIC,
    STEPS_SUFFIX,
    STEPS_WINDOW,
    per_process,
)


def _read_header(path: Path, magic: bytes, what: str) -> tuple[dict[str, Any], int]:
    """A record file's JSON description and where its rows start."""
    with open(path, "rb") as f:
        head = f.read(len(magic) + 4)
        if len(head) < len(magic) + 4 or head[: len(magic)] != magic:
            raise ValueError(f"{path}: not a dlscope {what} file")
        (length,) = struct.unpack("<I", head[len(magic) :])
        return json.loads(f.read(length)), len(magic) + 4 + length


class StepFile:
    """A `<pid>.steps` file read back in chunks of rows (numpy structured arrays: no Python object
    per step). Not counted: the room a running (or killed) process has not written yet at the
    end (zero rows), and a row cut short."""

    def __init__(self, path: Path) -> None:
        import numpy as np

        self.path = Path(path)
        self.description, self.offset = _read_header(self.path, STEPS_MAGIC, "step")
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


class CollectiveFile:
    """A `<pid>.collectives` file read back: one row per collective launched, its completion
    joined on (NaN: it never completed here — the rank was stopped inside it)."""

    def __init__(self, path: Path) -> None:
        import numpy as np

        self.path = Path(path)
        self.description, self.offset = _read_header(self.path, COLLECTIVES_MAGIC, "collectives")
        self.dtype = np.dtype([(name, dtype) for name, dtype in self.description["fields"]])
        self.ops: list[str] = self.description["codes"]["op"]
        self.count = max(self.path.stat().st_size - self.offset, 0) // self.dtype.itemsize

    def read(self) -> Any:
        """seq, step, op (code into `ops`), launch, done (float64 s; NaN: not done), in launch order."""
        import numpy as np

        rows = np.fromfile(self.path, self.dtype, self.count, offset=self.offset)
        rows = rows[rows["seq"] != 0]  # room not written yet (a process killed before its exit)
        launch_code = self.description["codes"]["event"].index("launch")
        launches, dones = rows[rows["event"] == launch_code], rows[rows["event"] != launch_code]
        launches = launches[np.argsort(launches["seq"], kind="stable")]
        done = np.full(len(launches), np.nan)
        if len(launches):
            where = np.searchsorted(launches["seq"], dones["seq"])
            known = (where < len(launches)) & (launches["seq"][np.minimum(where, len(launches) - 1)] == dones["seq"])
            done[where[known]] = dones["t"][known]
        out = np.empty(
            len(launches), [("seq", "<u4"), ("step", "<u4"), ("op", "u1"), ("launch", "<f8"), ("done", "<f8")]
        )
        out["seq"], out["step"], out["op"], out["launch"], out["done"] = (
            launches["seq"],
            launches["step"],
            launches["op"],
            launches["t"],
            done,
        )
        return out


def collective_files(directory: Path) -> dict[int, CollectiveFile]:
    """pid → its collectives file, for the processes that launched a collective."""
    return {pid: CollectiveFile(path) for pid, path in per_process(directory, COLLECTIVES_SUFFIX).items()}


def read_records(directory: Path) -> dict[int, list[dict[str, Any]]]:
    """pid → its JSON records (not its steps) in the order written; a line cut by a kill is skipped."""
    return {pid: list(_lines(path)) for pid, path in per_process(directory, RECORDS_SUFFIX).items()}


def step_files(directory: Path) -> dict[int, StepFile]:
    """pid → its step file, for the processes that finished a step."""
    return {pid: StepFile(path) for pid, path in per_process(directory, STEPS_SUFFIX).items()}


def _lines(path: Path) -> Iterator[dict[str, Any]]:
    with open(path, encoding="utf-8", errors="backslashreplace") as f:
        for line in f:
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                continue
