"""The unprivileged backend: for Python commands, a PEP 578 audit hook injected through
dlscope's bootstrap (injob/bootstrap), plus /proc/self/io sampled at every phase boundary.

It sees: opens (path, mode), renames, removes, mkdir, directory listings, mmap — and, per
phase, exact bytes and syscall counts from /proc/self/io. It does NOT see individual reads,
writes, seeks, closes, stats, fsyncs, their latencies, nor anything a non-Python process does
(a C extension's own open() bypasses the hook too).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from dlscope.contract.env import PROC_TRACE_ENV
from dlscope.contract.ioevents import Event, make_event
from dlscope.contract.records import RECORDS_SUFFIX, per_process
from dlscope.supervise.bootstrap_env import with_bootstrap


def available() -> str | None:
    return None if Path("/proc/self/io").exists() else "/proc/self/io is missing (not Linux, or no procfs)"


def environment(events_dir: Path, env: dict[str, str] | None = None) -> dict[str, str]:
    return with_bootstrap(env, **{PROC_TRACE_ENV: str(events_dir)})


def read_events(events_dir: Path) -> Iterator[Event]:
    """Every process's records, as events (procio samples pass through as they are)."""
    for path in per_process(events_dir, RECORDS_SUFFIX).values():
        with open(path, encoding="utf-8", errors="backslashreplace") as f:
            for line in f:
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    continue  # the last line of a killed process may be cut
                if record["call"] == "procio":
                    yield record
                    continue
                yield make_event(
                    record["ts"],
                    record["pid"],
                    record["tid"],
                    record["call"],
                    0,
                    path=record.get("path"),
                    target=record.get("target"),
                )
