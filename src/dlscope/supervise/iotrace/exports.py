"""Exports written while events stream past: events.jsonl, a Perfetto/Chrome trace JSON (one
track per thread, syscall slices, phase slices), and the tables as CSV."""

from __future__ import annotations

import csv
import dataclasses
import json
from pathlib import Path
from typing import IO, Any

from dlscope.analysis.syscalls import FileStats
from dlscope.contract.ioevents import Event
from dlscope.fsutil import json_text


class EventWriters:
    """events.jsonl and trace.json, appended to per event (nothing accumulates in memory)."""

    def __init__(self, directory: Path) -> None:
        self.events_path = directory / "events.jsonl"
        self.trace_path = directory / "trace.json"
        self._events: IO[str] = open(self.events_path, "w", encoding="utf-8")  # noqa: SIM115 — closed in close()
        self._trace: IO[str] = open(self.trace_path, "w", encoding="utf-8")  # noqa: SIM115
        self._trace.write('{"displayTimeUnit": "ms", "traceEvents": [\n')
        self._first = True
        self._origin: float | None = None
        self._threads: set[tuple[int, int]] = set()

    def _slice(self, record: dict[str, Any]) -> None:
        self._trace.write(("" if self._first else ",\n") + json_text(record))
        self._first = False

    def add(self, event: Event) -> None:
        if event["call"] in ("procio", "fork", "exit"):
            return
        self._events.write(json_text(event) + "\n")
        if self._origin is None:
            self._origin = event["ts"]
        pid, tid = event["pid"], event["tid"]
        if (pid, tid) not in self._threads:
            self._threads.add((pid, tid))
            self._slice({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": f"thread {tid}"}})
        ts = (event["ts"] - self._origin) * 1e6
        if event["call"] == "phase":
            self._slice(
                {
                    "ph": "B" if event["edge"] == "begin" else "E",
                    "name": event["name"],
                    "cat": "phase",
                    "ts": ts,
                    "pid": pid,
                    "tid": tid,
                }
            )
            return
        args = {k: event[k] for k in ("path", "ret", "bytes", "err") if event.get(k) is not None}
        self._slice(
            {
                "ph": "X",
                "name": event["call"],
                "cat": event["kind"],
                "ts": ts,
                "dur": (event["dur"] or 0) * 1e6,
                "pid": pid,
                "tid": tid,
                "args": args,
            }
        )

    def close(self) -> None:
        self._events.close()
        self._trace.write("\n]}\n")
        self._trace.close()


def write_csv(path: Path, rows: list[dict[str, Any]], columns: list[str]) -> Path:
    # a path's undecodable bytes are written back as they were (surrogateescape): exact in the CSV
    with open(path, "w", newline="", encoding="utf-8", errors="surrogateescape") as f:
        writer = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: json.dumps(v) if isinstance(v, dict) else v for k, v in row.items()})
    return path


PHASE_COLUMNS = ["phase", "seconds", "calls", "errors", "bytes_read", "bytes_written", "syscall_seconds", "by_kind"]
FILE_COLUMNS = [f.name for f in dataclasses.fields(FileStats)]  # a row of files.csv: one file's FileStats
