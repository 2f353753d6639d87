"""The files through which an observed process talks to `dlscope run`: one JSON Lines file per
process, `<run dir>/<pid>.jsonl`, written one unbuffered line at a time (a SIGKILL loses only
what was not yet written) — never the command's stdout. Stdlib only.

Record kinds (`k`), every time a CLOCK_REALTIME float in seconds:
    process   pid, ppid, argv, rank, world_size, clocks (start)
    B / E     a phase begins / ends: name, ts, file (checkpoints)
    step      src (optimizer|backward), i, start, end, data, forward, backward, optimizer,
              data_source (loader|gap), backwards (backward() calls in the step), peak_rss,
              peak_cuda (null when not sampled), profiled (wait|warmup|active|null),
              profiler_step (N of the profiler's ProfilerStep#N), profiler_seconds (dlscope's
              own time after the step: prof.step(), trace export)
    E         of a checkpoint phase: files (every file written inside it)
    profile   trace, ops (key_averages rows), export_seconds
    observed  torch_attached, optimizer_steps, backward_steps, torch_optimizer (at exit)
    end       clocks (at exit)
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

CLOCK_NAMES = ("realtime", "boottime", "monotonic")


def clocks() -> dict[str, int]:
    """The clocks the tracers stamp with, read back to back (ns): their offsets map one onto another."""
    return {
        "realtime": time.clock_gettime_ns(time.CLOCK_REALTIME),
        "boottime": time.clock_gettime_ns(time.CLOCK_BOOTTIME),
        "monotonic": time.clock_gettime_ns(time.CLOCK_MONOTONIC),
    }


class RecordFile:
    """This process's record file; `reopen()` after a fork gives the child its own."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.lock = threading.Lock()
        self.reopen()

    def reopen(self) -> None:
        self.pid = os.getpid()
        path = os.path.join(self.directory, f"{self.pid}.jsonl")
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)

    def write(self, record: dict[str, Any]) -> None:
        line = (json.dumps(record, default=str) + "\n").encode()
        with self.lock:
            os.write(self.fd, line)

    def write_step(self, **fields: Any) -> None:
        """One finished step (the step machine's fields, see stepmachine.StepMachine.end_step)."""
        self.write({"k": "step", **fields})


def read_records(directory: Path) -> dict[int, list[dict[str, Any]]]:
    """pid → its records in the order written; a line cut by a kill is skipped."""
    processes: dict[int, list[dict[str, Any]]] = {}
    for path in sorted(directory.glob("*.jsonl")):
        if not path.stem.isdigit():
            continue
        processes[int(path.stem)] = list(_lines(path))
    return processes


def _lines(path: Path) -> Iterator[dict[str, Any]]:
    with open(path, encoding="utf-8", errors="backslashreplace") as f:
        for line in f:
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                continue
