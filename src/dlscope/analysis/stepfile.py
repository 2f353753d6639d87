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

from dlscope.contract.records import RECORDS_SUFFIX, STEPS_MAGIC, STEPS_SUFFIX, STEPS_WINDOW, per_process


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
