"""The batch x-ray's analysis: the `<pid>.batches` records (batches.py) of every process joined
into one row per batch the training process took — the worker that built it, its samples, fetch,
collate, queue and wait times, the step that consumed it — and, with --trace-io, the system calls
of that worker inside the batch's window (and inside its slowest sample's). Facts only: the words
are in report/sections/batches.py. No torch import.

Joins: a taken batch to the batch built on (worker pid, generation, idx), DataLoader's own
numbering; a taken batch to the step whose interval holds the start of its `__next__` (the same
thread's clock, so the step is exact); a batch to its worker's system calls by time, inside that
worker process only (a worker builds one batch at a time).
"""

from __future__ import annotations

import bisect
import csv
import json
import math
import struct
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from dlscope.observe.script.batches import BATCHES_MAGIC, BUILT, KIND_BUILT, KIND_TAKEN, SAMPLE_TIMES, TAKEN

SLOWEST = 10  # rows kept in results.json per list: the full table is batches.csv
OUTLIER_FACTOR = 10.0  # a sample or a file at ≥ 10× the median is named
OUTLIER_MIN_S = 1e-3  # and a sample only when it took ≥ 1 ms: a 30 µs sample makes no step wait
CSV_COLUMNS = (
    "step",
    "epoch",
    "worker_first",
    "batch",
    "worker",
    "worker_pid",
    "samples",
    "waited_ms",
    "fetch_ms",
    "collate_ms",
    "queued_ms",
    "pin_ms",
    "ready_before_asked",
    "slowest_sample",
    "slowest_sample_ms",
    "slowest_sample_file",
    "slowest_sample_reads",
    "slowest_sample_bytes",
    "reads",
    "bytes_read",
    "syscall_ms",
    "top_file",
    "top_file_reads",
    "top_file_bytes",
    "files",
)


@dataclass
class Built:
    pid: int
    worker_id: int
    generation: int
    idx: int
    flags: int
    start: float
    fetched: float
    collated: float
    ready: float
    indices: list[int]
    ends: list[float] | None  # seconds from start to the end of each sample
    io: dict[str, Any] = field(default_factory=dict)


@dataclass
class Taken:
    pid: int
    worker_id: int
    worker_pid: int
    generation: int
    idx: int
    next_start: float
    next_end: float
    taken: float
    pin: float


def read_file(path: Path) -> tuple[list[Built], list[Taken]]:
    """One `<pid>.batches` file; a record a kill cut short at the end is left out."""
    pid = int(path.stem)
    data = path.read_bytes()
    if data[: len(BATCHES_MAGIC)] != BATCHES_MAGIC:
        return [], []
    (length,) = struct.unpack_from("<I", data, len(BATCHES_MAGIC))
    at = len(BATCHES_MAGIC) + 4 + length
    built, taken = [], []
    while at + 5 <= len(data):
        size, kind = struct.unpack_from("<IB", data, at)
        if size < 5 or at + size > len(data):
            break
        if kind == KIND_BUILT:
            _, _, flags, worker, generation, idx, n, start, fetched, collated, ready = BUILT.unpack_from(data, at)
            tail = at + BUILT.size
            indices = list(np.frombuffer(data, "<i8", n, tail).tolist())
            ends = (np.frombuffer(data, "<f8", n, tail + 8 * n) - start).tolist() if flags & SAMPLE_TIMES else None
            built.append(Built(pid, worker, generation, idx, flags, start, fetched, collated, ready, indices, ends))
        elif kind == KIND_TAKEN:
            _, _, worker, worker_pid, generation, idx, next_start, next_end, when, pin = TAKEN.unpack_from(data, at)
            taken.append(Taken(pid, worker, worker_pid, generation, idx, next_start, next_end, when, pin))
        at += size
    return built, taken


def read_all(directory: Path) -> tuple[list[Built], list[Taken]]:
    built: list[Built] = []
    taken: list[Taken] = []
    for path in sorted(directory.glob("*.batches")):
        if path.stem.isdigit():
            b, t = read_file(path)
            built += b
            taken += t
    return built, taken


# system calls -----------------------------------------------------------------------------------
class WorkerCalls:
    """One process's system calls sorted by start time, summed over any window."""

    def __init__(self, events: list[dict[str, Any]]) -> None:
        events.sort(key=lambda e: e["ts"])
        self.events = events
        self.starts = [e["ts"] for e in events]

    def window(self, start: float, end: float) -> list[dict[str, Any]]:
        return self.events[bisect.bisect_left(self.starts, start) : bisect.bisect_right(self.starts, end)]


def io_summary(events: list[dict[str, Any]]) -> dict[str, Any]:
    """Reads, bytes read and time in system calls of a window, and its files (regular paths)."""
    reads = [e for e in events if e.get("kind") == "read"]
    files: dict[str, dict[str, Any]] = {}
    for e in events:
        path = e.get("path")
        if not isinstance(path, str) or not path.startswith("/"):
            continue
        f = files.setdefault(path, {"path": path, "reads": 0, "bytes": 0, "seconds": 0.0})
        f["seconds"] += e.get("dur") or 0.0
        if e.get("kind") == "read":
            f["reads"] += 1
            f["bytes"] += e.get("bytes") or 0
    return {
        "reads": len(reads),
        "bytes_read": sum(e.get("bytes") or 0 for e in reads),
        "syscall_s": sum(e.get("dur") or 0.0 for e in events),
        "files": sorted(files.values(), key=lambda f: (-f["bytes"], -f["seconds"], f["path"])),
    }


def attach_io(built: list[Built], syscalls: Iterable[dict[str, Any]], to_realtime: Callable[[float], float]) -> None:
    """Each batch's (and its slowest sample's) system calls, from its worker's own events."""
    pids = {b.pid for b in built}
    per_pid: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for e in syscalls:
        if e.get("pid") in pids and e.get("call") != "phase":
            per_pid[e["pid"]].append({**e, "ts": to_realtime(float(e["ts"]))})
    calls = {pid: WorkerCalls(events) for pid, events in per_pid.items()}
    for b in built:
        found = calls.get(b.pid)
        if found is None:
            continue
        b.io = io_summary(found.window(b.start, b.collated))
        slowest = _slowest(b)
        if slowest is not None:
            _, begin, end = slowest
            b.io["slowest"] = io_summary(found.window(b.start + begin, b.start + end))


def _slowest(b: Built) -> tuple[int, float, float] | None:
    """(position, start offset, end offset) of the batch's slowest sample."""
    if not b.ends:
        return None
    begins = [0.0, *b.ends[:-1]]
    k = max(range(len(b.ends)), key=lambda j: b.ends[j] - begins[j])
    return k, begins[k], b.ends[k]


# the join ---------------------------------------------------------------------------------------
def step_of(taken: list[Taken], starts: np.ndarray, ends: np.ndarray, numbers: np.ndarray) -> list[int | None]:
    """The step whose interval holds each batch's `__next__` start (None: outside every step, an
    evaluation loader or a batch drawn after the last step)."""
    at = np.array([t.next_start for t in taken], dtype=np.float64)
    k = np.searchsorted(starts, at, side="right") - 1
    out: list[int | None] = []
    for j, pos in enumerate(k.tolist()):
        inside = pos >= 0 and at[j] <= ends[pos]
        out.append(int(numbers[pos]) if inside else None)
    return out


def batch_row(t: Taken, b: Built | None, step: int | None, firsts: set[tuple[int, int, int]]) -> dict[str, Any]:
    row: dict[str, Any] = {
        "step": step,
        "epoch": t.generation,
        "batch": t.idx,
        "worker": None if t.worker_id < 0 else t.worker_id,
        "worker_pid": t.worker_pid,
        "waited_ms": _ms(t.next_end - t.next_start),
        "pin_ms": None if math.isnan(t.pin) else _ms(t.pin),
        # its worker's first batch of the epoch: the wait for it holds the worker's start
        "worker_first": (t.worker_pid, t.generation, t.idx) in firsts,
    }
    if b is None:
        return row
    slowest = _slowest(b)
    row.update(
        samples=len(b.indices),
        fetch_ms=_ms(b.fetched - b.start),
        collate_ms=_ms(b.collated - b.fetched),
        queued_ms=_ms(max(t.taken - b.ready, 0.0)),
        ready_before_asked=b.ready <= t.next_start,
    )
    if slowest is not None:
        k, begin, end = slowest
        row.update(slowest_sample=b.indices[k], slowest_sample_ms=_ms(end - begin))
    if b.io:
        row.update(reads=b.io["reads"], bytes_read=b.io["bytes_read"], syscall_ms=_ms(b.io["syscall_s"]))
        row["files"] = [f["path"] for f in b.io["files"]]
        if b.io["files"]:  # the file the batch read most from (files are sorted by bytes)
            top = b.io["files"][0]
            row.update(top_file=top["path"], top_file_reads=top["reads"], top_file_bytes=top["bytes"])
        top = (b.io.get("slowest") or {}).get("files") or []
        if top:
            row.update(
                slowest_sample_file=top[0]["path"],
                slowest_sample_reads=top[0]["reads"],
                slowest_sample_bytes=top[0]["bytes"],
            )
    return row


def _ms(seconds: float) -> float:
    return round(seconds * 1e3, 3)


@dataclass
class Flow:
    """What the processes recorded, joined: (taken, built or None, step or None) per batch the
    training process took, in the order it took them."""

    built: list[Built]
    pairs: list[tuple[Taken, Built | None, int | None]]
    firsts: set[tuple[int, int, int]] = field(default_factory=set)  # each worker's first batch of an epoch


def join(
    built: list[Built], taken: list[Taken], main: int | None, steps: np.ndarray, evals: list[tuple[float, float]]
) -> Flow:
    """`evals`: the training process's eval phases (begin, end): a batch drawn inside one fed an
    evaluation, not the step whose interval happens to hold it."""
    by_key = {(b.pid, b.generation, b.idx): b for b in built}
    mine = [t for t in taken if t.pid == main] if main is not None else taken
    mine.sort(key=lambda t: t.next_start)
    if len(steps):
        starts = steps["start"].astype(np.float64)
        ends = starts + steps["seconds"].astype(np.float64)
        consumed = step_of(mine, starts, ends, steps["i"])
    else:
        consumed = [None] * len(mine)
    consumed = [
        None if any(a <= t.next_start <= b for a, b in evals) else s for t, s in zip(mine, consumed, strict=True)
    ]
    pairs = [(t, by_key.get((t.worker_pid, t.generation, t.idx)), s) for t, s in zip(mine, consumed, strict=True)]
    first: dict[tuple[int, int], int] = {}
    for b in built:
        key = (b.pid, b.generation)
        first[key] = min(first.get(key, b.idx), b.idx)
    return Flow(built, pairs, {(pid, generation, idx) for (pid, generation), idx in first.items()})


def read_flow(
    directory: Path,
    main: int | None,
    steps: np.ndarray,
    evals: list[tuple[float, float]],
    syscalls: Iterable[dict[str, Any]] | None = None,
    to_realtime: Callable[[float], float] = float,
) -> Flow | None:
    """The batches of a run's processes/ directory joined; None when no DataLoader batch was seen."""
    built, taken = read_all(directory)
    if not built and not taken:
        return None
    if syscalls is not None:
        attach_io(built, syscalls, to_realtime)
    return join(built, taken, main, steps, evals)


# the section ------------------------------------------------------------------------------------
def section(flow: Flow, steps: np.ndarray, out_csv: Path, trace_io: bool) -> dict[str, Any]:
    """The "batches" section; the full per-batch table is written to `out_csv`."""
    built = flow.built
    rows = [batch_row(*pair, flow.firsts) for pair in flow.pairs]
    write_csv(out_csv, rows)
    in_steps = [r for r in rows if r["step"] is not None]
    return {
        "batches_taken": len(rows),
        "batches_built": len(built),
        "joined": sum(1 for r in rows if "fetch_ms" in r),
        "in_steps": len(in_steps),
        "trace_io": trace_io,
        "shares": shares(in_steps, steps),
        "workers": worker_table(built, rows),
        "keeping_ahead": keeping_ahead(in_steps),
        "longest_waits": sorted(in_steps, key=lambda r: -r["waited_ms"])[:SLOWEST],
        # a worker's first batch of an epoch also waits for the worker to start: the longest wait apart
        "longest_steady_wait": max(
            (r for r in in_steps if not r["worker_first"]), key=lambda r: r["waited_ms"], default=None
        ),
        "first_batches": first_batches(in_steps),
        "slowest_batches": sorted(
            (r for r in rows if "fetch_ms" in r), key=lambda r: -(r["fetch_ms"] + r["collate_ms"])
        )[:SLOWEST],
        "samples": sample_outliers(built),
        "files": file_outliers(built) if trace_io else None,
    }


def shares(rows: list[dict[str, Any]], steps: np.ndarray) -> dict[str, Any]:
    """Over the steps that drew a batch: the share of their time spent waiting for one; and of the
    build time of those batches, the share in fetch and in collate."""
    used = {r["step"] for r in rows}
    if not used or not len(steps):
        return {}
    mask = np.isin(steps["i"], np.array(sorted(used), dtype=steps["i"].dtype))
    step_s = float(steps["seconds"][mask].astype(np.float64).sum())
    waited = sum(r["waited_ms"] for r in rows) / 1e3
    fetch = sum(r.get("fetch_ms") or 0.0 for r in rows)
    collate = sum(r.get("collate_ms") or 0.0 for r in rows)
    build = fetch + collate
    return {
        "steps": len(used),
        "step_s": round(step_s, 6),
        "waited_s": round(waited, 6),
        "wait_pct": round(100.0 * waited / step_s, 2) if step_s > 0 else None,
        "fetch_pct_of_build": round(100.0 * fetch / build, 2) if build > 0 else None,
        "collate_pct_of_build": round(100.0 * collate / build, 2) if build > 0 else None,
    }


def first_batches(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Each worker's first batch of an epoch: its wait holds the worker's start (non-persistent
    workers start at every epoch) and the first fetches."""
    firsts = [r["waited_ms"] for r in rows if r["worker_first"]]
    return {"count": len(firsts), "waited_ms": round(sum(firsts), 3), "max_ms": max(firsts, default=0.0)}


def worker_table(built: list[Built], rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per worker (its id: non-persistent workers are new processes every epoch, so the table stays
    as long as num_workers): batches built, time building them (busy) against the time from each
    process's first batch's start to its last batch's hand-off (busy + idle)."""
    waits: dict[int, float] = defaultdict(float)
    for r in rows:
        waits[r["worker_pid"]] += r["waited_ms"]
    per: dict[int, dict[int, list[Built]]] = defaultdict(lambda: defaultdict(list))
    for b in built:
        per[b.worker_id][b.pid].append(b)
    table = []
    for worker, processes in sorted(per.items()):
        busy = sum(b.ready - b.start for bs in processes.values() for b in bs)
        span = sum(max(b.ready for b in bs) - min(b.start for b in bs) for bs in processes.values())
        count = sum(len(bs) for bs in processes.values())
        table.append(
            {
                "worker": None if worker < 0 else worker,
                "pid": min(processes),
                "processes": len(processes),
                "batches": count,
                "busy_s": round(busy, 6),
                "span_s": round(span, 6),
                "busy_pct": round(100.0 * busy / span, 2) if span > 0 else 100.0,
                "mean_build_ms": _ms(busy / count),
                "waited_ms": round(sum(waits.get(pid, 0.0) for pid in processes), 3),
            }
        )
    return table


def keeping_ahead(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Whether the workers keep ahead: the share of batches ready before the loop asked, overall
    and in each tenth of the run (batches ready over time)."""
    known = [r for r in rows if "ready_before_asked" in r and r["worker"] is not None]
    if not known:
        return {}
    tenths = []
    n = len(known)
    for k in range(min(10, n)):
        part = known[k * n // min(10, n) : (k + 1) * n // min(10, n)]
        tenths.append(round(100.0 * sum(r["ready_before_asked"] for r in part) / len(part), 1))
    return {
        "batches": n,
        "ready_pct": round(100.0 * sum(r["ready_before_asked"] for r in known) / n, 2),
        "ready_pct_by_tenth": tenths,
    }


def sample_outliers(built: list[Built]) -> dict[str, Any]:
    """Per-sample fetch time: its distribution and the samples at ≥ OUTLIER_FACTOR × the median."""
    seconds, where = [], []
    for b in built:
        if not b.ends:
            continue
        begin = 0.0
        for k, end in enumerate(b.ends):
            seconds.append(end - begin)
            where.append((b, k))
            begin = end
    if not seconds:
        return {"count": 0}
    values = np.array(seconds)
    median = float(np.median(values))
    order = np.argsort(-values)
    bar = max(OUTLIER_FACTOR * median, OUTLIER_MIN_S)
    outliers = []
    for j in order[:SLOWEST].tolist():
        if values[j] < bar:
            break
        b, k = where[j]
        outliers.append(
            {
                "sample": b.indices[k],
                "ms": _ms(float(values[j])),
                "times_median": round(float(values[j]) / median, 1) if median > 0 else None,
                "worker": None if b.worker_id < 0 else b.worker_id,
                "epoch": b.generation,
                "batch": b.idx,
                "file": _sample_file(b, k),
            }
        )
    return {
        "count": len(values),
        "median_ms": _ms(median),
        "p99_ms": _ms(float(np.percentile(values, 99))),
        "max_ms": _ms(float(values.max())),
        "outliers": outliers,
        "outlier_ms": _ms(bar),
        "outliers_total": int(np.count_nonzero(values >= bar)),
    }


def _sample_file(b: Built, k: int) -> str | None:
    slowest = _slowest(b)
    if slowest is None or slowest[0] != k:
        return None
    files = (b.io.get("slowest") or {}).get("files") or []
    return files[0]["path"] if files else None


def file_outliers(built: list[Built]) -> dict[str, Any]:
    """Per file read while building batches: reads, bytes, time in system calls; the files at
    ≥ OUTLIER_FACTOR × the median bytes or time named."""
    files: dict[str, dict[str, Any]] = {}
    for b in built:
        for f in b.io.get("files", []):
            t = files.setdefault(f["path"], {"path": f["path"], "reads": 0, "bytes": 0, "seconds": 0.0, "batches": 0})
            t["reads"] += f["reads"]
            t["bytes"] += f["bytes"]
            t["seconds"] += f["seconds"]
            t["batches"] += 1
    if not files:
        return {"count": 0}
    rows = [f for f in files.values() if f["reads"]]  # files read, not shared memory merely mapped
    if not rows:
        return {"count": 0}
    median_bytes = float(np.median([f["bytes"] for f in rows]))
    median_s = float(np.median([f["seconds"] for f in rows]))
    outliers = [
        {**f, "ms": _ms(f["seconds"])}
        for f in rows
        if (median_bytes > 0 and f["bytes"] >= OUTLIER_FACTOR * median_bytes)
        or (median_s > 0 and f["seconds"] >= max(OUTLIER_FACTOR * median_s, OUTLIER_MIN_S))
    ]
    outliers.sort(key=lambda f: (-f["bytes"], -f["seconds"]))
    for f in outliers:
        del f["seconds"]
    return {
        "count": len(rows),
        "median_bytes": int(median_bytes),
        "median_ms": _ms(median_s),
        "outliers": outliers[:SLOWEST],
        "outliers_total": len(outliers),
    }


def write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(CSV_COLUMNS)
        for r in rows:
            writer.writerow([_cell(r.get(c)) for c in CSV_COLUMNS])


def _cell(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, list):
        return json.dumps(value)
    return value
