"""The batch x-ray's analysis: the `<pid>.batches` records (batches.py) of every process joined
into one row per batch the training process took — the worker that built it, its samples, fetch,
collate, queue and wait times, the step that consumed it — and, with --trace-io, the system calls
of the thread that built it inside the batch's window (and inside its slowest sample's). Facts
only: the words are in report/sections/batches.py. No torch import.

Joins: a taken batch to the batch built on (worker pid, generation, idx), DataLoader's own
numbering; a taken batch to the step whose interval holds the start of its `__next__` (the same
thread's clock, so the step is exact); a batch to its worker's system calls by time, inside the
thread that fetched it only (a worker builds one batch at a time; its other threads — the data
queue's feeder, a dataset's own — are counted apart).
"""

from __future__ import annotations

import bisect
import csv
import ctypes
import functools
import itertools
import json
import math
import struct
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from dlscope.contract.batchfile import (
    BATCHES_MAGIC,
    BATCHES_VERSION,
    BUILT,
    BUILT_TIMES,
    ITERABLE,
    KIND_BUILT,
    KIND_COST,
    KIND_TAKEN,
    LOADER,
    SAMPLE_TIMES,
    TAKEN,
    UNKNOWN,
    WHOLE,
)
from dlscope.contract.owncode import is_dlscope_code
from dlscope.contract.records import BATCHES_SUFFIX, per_process

SLOWEST = 10  # rows kept in results.json per list: the full table is batches.csv
OUTLIER_FACTOR = 10.0  # a sample or a file at ≥ 10× the median is named
OUTLIER_MIN_S = 1e-3  # and a sample only when it took ≥ 1 ms: a 30 µs sample makes no step wait
AS_SLOW = 0.5  # another fetch of an outlier's sample is as slow at this fraction of its time (and an outlier)
CSV_COLUMNS = (
    "step",
    "loader",
    "pass",
    "worker_first",
    "batch",
    "worker",
    "worker_pid",
    "generation",
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
    "other_threads_reads",
    "other_threads_bytes",
)


# The records as numpy rows: a million batches are ~130 MB of arrays, not a Python object each.
BUILT_RECORD = np.dtype(
    {
        "names": ["length", "flags", "worker_id", "generation", "idx", "samples", "tid", *BUILT_TIMES],
        "formats": ["<u4", "u1", "<i2", "<u4", "<u4", "<u4", "<u4", "<f8", "<f8", "<f8", "<f8"],
        "offsets": [0, 5, 6, 8, 12, 16, 20, 24, 32, 40, 48],
        "itemsize": BUILT.size,
    }
)
TAKEN_RECORD = np.dtype(
    {
        "names": [
            "worker_id",
            "worker_pid",
            "generation",
            "idx",
            "loader",
            "pass",
            "tid",
            "next_start",
            "next_end",
            "taken",
            "pin",
        ],
        "formats": ["<i2", "<u4", "<u4", "<u4", "<u4", "<u4", "<u4", "<f8", "<f8", "<f8", "<f4"],
        "offsets": [6, 8, 12, 16, 20, 24, 28, 32, 40, 48, 56],
        "itemsize": TAKEN.size,
    }
)
# a built batch, with its slowest sample (slowest_at -1: its samples were not timed one by one)
BUILT_ROW = np.dtype(
    [
        ("pid", "<i4"),
        ("worker_id", "<i2"),
        ("generation", "<u4"),
        ("idx", "<u4"),
        ("samples", "<u4"),
        ("flags", "u1"),
        ("tid", "<u4"),
        *[(name, "<f8") for name in BUILT_TIMES],
        ("slowest_at", "<i4"),
        ("slowest_sample", "<i8"),
        ("slowest_begin", "<f8"),  # seconds from the batch's start
        ("slowest_end", "<f8"),
    ]
)
TAKEN_ROW = np.dtype([("pid", "<i4"), *[(n, TAKEN_RECORD.fields[n][0]) for n in TAKEN_RECORD.names]])
READ_BYTES = 1 << 20  # a file is read in blocks: a week's records never sit in memory whole
GATHER_ROWS = 2048
SAMPLES_KEPT = 1 << 21  # per-sample times kept for the median and p99; beyond, a uniform reservoir


@dataclass
class Built:
    """One built batch, for the few rows a report or a timeline names."""

    pid: int
    worker_id: int
    generation: int
    idx: int
    samples: int
    flags: int
    tid: int
    start: float
    fetched: float
    collated: float
    ready: float


@dataclass
class Taken:
    pid: int
    worker_id: int
    worker_pid: int
    generation: int
    idx: int
    loader: int
    pass_: int
    tid: int
    next_start: float
    next_end: float
    taken: float
    pin: float


class SampleTimes:
    """Every timed sample's fetch time, bounded: all of them up to SAMPLES_KEPT, then a uniform
    reservoir of that many (the median and p99 estimated from it, the count above a bar scaled);
    the slowest SLOWEST samples and the maximum exact whatever the length."""

    def __init__(self) -> None:
        self.kept = np.empty(SAMPLES_KEPT)  # its pages are taken as they are written
        self.count = 0
        self.rng = np.random.default_rng(23)
        # (seconds, built row, position in its batch, sample index) of the slowest samples
        self.top = np.zeros(0, dtype=[("s", "<f8"), ("row", "<i8"), ("at", "<i4"), ("sample", "<i8")])

    def add(self, seconds: np.ndarray, rows: np.ndarray, indices: np.ndarray) -> None:
        """`seconds`, `indices`: (batches, samples) of batches built at global `rows`."""
        flat = seconds.ravel()
        m = len(flat)
        best = np.argpartition(-flat, SLOWEST)[:SLOWEST] if m > SLOWEST else np.arange(m)
        width = seconds.shape[1]
        found = np.empty(len(best), dtype=self.top.dtype)
        found["s"], found["row"] = flat[best], rows[best // width]
        found["at"], found["sample"] = best % width, indices.ravel()[best]
        merged = np.concatenate([self.top, found])
        self.top = merged[np.argsort(-merged["s"], kind="stable")[:SLOWEST]]
        room = max(min(SAMPLES_KEPT - self.count, m), 0)
        self.kept[self.count : self.count + room] = flat[:room]
        if room < m:  # reservoir sampling (algorithm R), a chunk at a time
            slot = self.rng.integers(0, np.arange(self.count + room, self.count + m) + 1)
            keep = slot < SAMPLES_KEPT
            self.kept[slot[keep]] = flat[room:][keep]
        self.count += m

    def values(self) -> np.ndarray:
        return self.kept[: min(self.count, SAMPLES_KEPT)]


def _skip_header(f: Any) -> bool:
    """Past a `<pid>.batches` file's header; False: not one, or another version's (left out)."""
    head = f.read(len(BATCHES_MAGIC) + 4)
    if len(head) < len(BATCHES_MAGIC) + 4 or head[: len(BATCHES_MAGIC)] != BATCHES_MAGIC:
        return False
    (length,) = struct.unpack_from("<I", head, len(BATCHES_MAGIC))
    try:
        version = json.loads(f.read(length)).get("version")
    except ValueError:
        return False
    return version == BATCHES_VERSION


def _records(path: Path) -> Iterable[tuple[bytes, list[int], list[int], list[int], list[int]]]:
    """A `<pid>.batches` file block by block: (block, offsets of built records, of taken ones, of
    loader ones, of cost ones); a record a kill cut short at the end is left out, and so is all
    after a corrupt length."""
    with open(path, "rb") as f:
        if not _skip_header(f):
            return
        data, at = b"", 0
        while True:
            block = f.read(READ_BYTES)
            if not block:
                return
            data = data[at:] + block
            at, end = 0, len(data)
            found: tuple[list[int], ...] = ([], [], [], [])  # by kind
            unpack = struct.Struct("<IB").unpack_from
            while at + 5 <= end:
                size, kind = unpack(data, at)
                if size < 5:
                    if any(found):
                        yield data, *found
                    return
                if at + size > end:
                    break
                if kind <= KIND_COST:
                    found[kind].append(at)
                at += size
            if any(found):
                yield data, *found


def sample_indices(path: Path) -> Iterator[tuple[int, int, np.ndarray]]:
    """The batches one `<pid>.batches` file recorded as built, in order: (generation, batch idx,
    its sample indices as int64, repeats included) — what each batch of batches.csv held (its
    worker_pid's file, `batch`; generation: a persistent worker's epoch, or the training process's
    iterator count with num_workers=0)."""
    for block, built_at, *_ in _records(path):
        for at in built_at:
            _, _, _, _, generation, idx, n, *_ = BUILT.unpack_from(block, at)
            yield generation, idx, np.frombuffer(block, "<i8", n, at + BUILT.size)


def _gather(data: np.ndarray, offsets: np.ndarray, record: np.dtype) -> np.ndarray:
    return data[offsets[:, None] + np.arange(record.itemsize)].view(record).reshape(-1)


def _whole_built(data: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The built records at `offsets` whose length is right for their samples (a corrupt one is
    left out): (their heads, offsets, sample counts, whether their samples were timed)."""
    heads = _gather(data, offsets, BUILT_RECORD)
    n = heads["samples"].astype(np.int64)
    timed = (heads["flags"] & SAMPLE_TIMES) != 0
    whole = heads["length"] == BUILT.size + 8 * n * (1 + timed)
    return heads[whole], offsets[whole], n[whole], timed[whole]


def _built_rows(pid: int, data: np.ndarray, offsets: np.ndarray, first_row: int, samples: SampleTimes) -> np.ndarray:
    heads, offsets, n, timed = _whole_built(data, offsets)
    rows = np.zeros(len(heads), dtype=BUILT_ROW)
    rows["pid"] = pid
    for name in ("flags", "worker_id", "generation", "idx", "samples", "tid", *BUILT_TIMES):
        rows[name] = heads[name]
    rows["slowest_at"] = -1
    rows["slowest_sample"] = -1
    for width in np.unique(n[timed]).tolist():
        if width == 0:
            continue
        for first in range(0, len(offsets), GATHER_ROWS):  # the byte gathers' indices stay small
            part = slice(first, first + GATHER_ROWS)
            group = first + np.flatnonzero(timed[part] & (n[part] == width))
            if len(group):
                _slowest_samples(rows, group, data, offsets, heads, width, first_row, samples)
    return rows


def _sample_times(
    data: np.ndarray, offsets: np.ndarray, starts: np.ndarray, width: int
) -> tuple[np.ndarray, np.ndarray]:
    """Timed built records of `width` samples at `offsets`: (their sample indices, when each
    sample ended in seconds from its batch's start), both (records, width)."""
    at = offsets[:, None] + BUILT.size
    columns = np.arange(8 * width)
    return data[at + columns].view("<i8"), data[at + 8 * width + columns].view("<f8") - starts[:, None]


def _slowest_samples(
    rows: np.ndarray,
    group: np.ndarray,
    data: np.ndarray,
    offsets: np.ndarray,
    heads: np.ndarray,
    width: int,
    first_row: int,
    samples: SampleTimes,
) -> None:
    """The timed batches `group` of `width` samples: each one's slowest sample, all into `samples`."""
    indices, ends = _sample_times(data, offsets[group], heads["start"][group], width)
    seconds = np.diff(ends, axis=1, prepend=0.0)
    k = np.argmax(seconds, axis=1)
    line = np.arange(len(group))
    rows["slowest_at"][group] = k
    rows["slowest_sample"][group] = indices[line, k]
    rows["slowest_end"][group] = ends[line, k]
    rows["slowest_begin"][group] = ends[line, k] - seconds[line, k]
    samples.add(seconds, first_row + group, indices)


class Rows:
    """Rows appended into one array reserved ahead: its pages are taken only as rows are written,
    so an over-estimate costs nothing, and the rows are never held twice (as chunks, then joined)."""

    def __init__(self, dtype: np.dtype) -> None:
        self.array = np.empty(0, dtype)
        self.count = 0

    def reserve(self, extra: int) -> None:
        if self.count + extra > len(self.array):  # an under-estimate: grown geometrically
            grown = np.empty(max(self.count + extra, 2 * len(self.array)), self.array.dtype)
            grown[: self.count] = self.array[: self.count]
            self.array = grown

    def add(self, rows: np.ndarray) -> None:
        self.reserve(len(rows))
        self.array[self.count : self.count + len(rows)] = rows
        self.count += len(rows)

    def rows(self) -> np.ndarray:
        return self.array[: self.count]


def _first_record(path: Path) -> tuple[int, int]:
    """The size and kind of a `<pid>.batches` file's first record ((0, -1): none)."""
    with open(path, "rb") as f:
        first = f.read(5) if _skip_header(f) else b""
    return struct.unpack("<IB", first) if len(first) == 5 else (0, -1)


def read_all(directory: Path) -> tuple[np.ndarray, np.ndarray, SampleTimes, dict[tuple[int, int], dict[str, Any]]]:
    """Every `<pid>.batches` file of a run's processes/ directory: its built batches (BUILT_ROW),
    the batches taken (TAKEN_ROW), the timed samples' fetch times and the JSON records: loaders
    by (pid, loader number), the x-ray's own cost by (pid, -1)."""
    built, taken = Rows(BUILT_ROW), Rows(TAKEN_ROW)
    samples = SampleTimes()
    loaders: dict[tuple[int, int], dict[str, Any]] = {}
    for path in per_process(directory, BATCHES_SUFFIX).values():
        pid = int(path.stem)
        # as many rows as the file holds records like its first (a worker's are all built batches
        # of one size, the training process's all taken; with num_workers=0 the two alternate)
        size = path.stat().st_size
        length, kind = _first_record(path)
        if kind == KIND_TAKEN:
            taken.reserve(size // TAKEN.size)
        elif kind == KIND_BUILT:
            built.reserve(size // max(length, BUILT.size))
            taken.reserve(size // (max(length, BUILT.size) + TAKEN.size))
        for block, built_at, taken_at, loader_at, cost_at in _records(path):
            data = np.frombuffer(block, np.uint8)
            if built_at:
                built.add(_built_rows(pid, data, np.array(built_at, np.int64), built.count, samples))
            if taken_at:
                heads = _gather(data, np.array(taken_at, np.int64), TAKEN_RECORD)
                t = np.zeros(len(heads), dtype=TAKEN_ROW)
                t["pid"] = pid
                for name in TAKEN_RECORD.names:
                    t[name] = heads[name]
                taken.add(t)
            for at in (*loader_at, *cost_at):
                size, kind, number = LOADER.unpack_from(block, at)
                try:
                    loaders[pid, -1 if kind == KIND_COST else number] = json.loads(block[at + LOADER.size : at + size])
                except ValueError:
                    continue
    return built.rows(), taken.rows(), samples, loaders


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
    """Reads, bytes read and time in system calls of a window, and its files (regular paths), the
    most bytes read first. dlscope's own files are none of them: its wrappers are in the stack a
    sample is fetched in, and a walk of that stack (torch.manual_seed's) stats and reads them."""
    events = [e for e in events if not (isinstance(e.get("path"), str) and is_dlscope_code(e["path"]))]
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


def attach_io(
    built: np.ndarray, syscalls: Iterable[dict[str, Any]], to_realtime: Callable[[float], float]
) -> dict[int, dict[str, Any]]:
    """Each batch's (and its slowest sample's) system calls, from the events of the thread that
    fetched it, by built row (only batches whose process made system calls); the file reads of its
    process's other threads in the same window (a dataset's own reader threads; not the feeder's
    and resource sharer's pipes and sockets) are summed apart, as `others`. A trace without thread ids
    (all 0) is attributed to the process."""
    pids = set(np.unique(built["pid"]).tolist())
    per_thread: dict[tuple[int, int], list[dict[str, Any]]] = defaultdict(list)
    for e in syscalls:
        if e.get("pid") in pids and e.get("call") != "phase":
            per_thread[e["pid"], e.get("tid") or 0].append({**e, "ts": to_realtime(float(e["ts"]))})
    calls = {key: WorkerCalls(events) for key, events in per_thread.items()}
    threads: dict[int, list[int]] = defaultdict(list)
    for pid, tid in calls:
        threads[pid].append(tid)
    io: dict[int, dict[str, Any]] = {}
    for row in np.flatnonzero(np.isin(built["pid"], list(threads))).tolist():
        b = built[row]
        pid, start, end = int(b["pid"]), float(b["start"]), float(b["collated"])
        tid = int(b["tid"]) if threads[pid] != [0] else 0
        own = calls.get((pid, tid))
        io[row] = summary = io_summary(own.window(start, end) if own else [])
        summary["per_thread"] = tid != 0
        others = [e for t in threads[pid] if t != tid for e in calls[pid, t].window(start, end)]
        files = io_summary(others)["files"]  # files only: not the pipes and sockets torch passes batches by
        summary["others"] = {"reads": sum(f["reads"] for f in files), "bytes_read": sum(f["bytes"] for f in files)}
        if b["slowest_at"] >= 0 and own:
            summary["slowest"] = io_summary(
                own.window(start + float(b["slowest_begin"]), start + float(b["slowest_end"]))
            )
    return io


# the join ---------------------------------------------------------------------------------------
NONE = -1  # no built batch / no step


def step_of(
    next_start: np.ndarray, starts: np.ndarray, ends: np.ndarray, numbers: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The step whose interval holds each batch's `__next__` start, whether there is one (not:
    an evaluation loader, or a batch drawn after the last step), and that step's row (`starts`:
    one step at least)."""
    k = np.maximum(np.searchsorted(starts, next_start, side="right") - 1, 0)
    inside = (next_start >= starts[0]) & (next_start <= ends[k])
    return np.where(inside, numbers[k].astype(np.int64), 0), inside, k


def _inside_any(at: np.ndarray, spans: list[tuple[float, float]]) -> np.ndarray:
    out = np.zeros(len(at), dtype=bool)
    for begin, end in spans:  # an eval phase each: a handful
        out |= (begin <= at) & (at < end)  # (one known afterwards ends where the next step's batch starts)
    return out


def _match(built: np.ndarray, taken: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each taken batch's built row on (worker pid, generation, idx) (NONE: not recorded), and which
    built batches were their worker process's first of an epoch, both by one sort."""
    pid = np.concatenate([built["pid"], taken["worker_pid"]], dtype=np.uint32, casting="unsafe")
    generation = np.concatenate([built["generation"], taken["generation"]])
    idx = np.concatenate([built["idx"], taken["idx"]])
    is_taken = np.concatenate([np.zeros(len(built), bool), np.ones(len(taken), bool)])
    order = np.lexsort((is_taken, idx, generation, pid)).astype(np.int32)  # rows < 2**31
    same = np.ones(len(order), dtype=bool)  # each row's key equals the row before it
    same[:1] = False
    for key in (pid, generation, idx):
        column = key[order]
        same[1:] &= column[1:] == column[:-1]
        del column
    del pid, generation, idx
    is_taken = is_taken[order]
    # the last built row at or before each sorted position (the dict kept the last one), and the
    # first position of each key
    at = np.arange(len(order), dtype=np.int32)
    last_built = np.maximum.accumulate(np.where(is_taken, -1, at).astype(np.int32)) if len(order) else at
    key_start = np.maximum.accumulate(np.where(same, 0, at).astype(np.int32)) if len(order) else at
    del at, same
    sorted_taken = np.flatnonzero(is_taken)
    hit = sorted_taken[last_built[sorted_taken] >= key_start[sorted_taken]]
    del key_start
    match = np.full(len(taken), NONE, dtype=np.int32)
    match[order[hit] - len(built)] = order[last_built[hit]]
    del order, last_built, sorted_taken, hit
    # a worker process's first batch of an epoch: the lowest idx of its (pid, generation)
    b = np.lexsort((built["idx"], built["generation"], built["pid"]))
    first = np.ones(len(b), dtype=bool)
    first[1:] = (built["pid"][b][1:] != built["pid"][b][:-1]) | (
        built["generation"][b][1:] != built["generation"][b][:-1]
    )
    firsts = np.zeros(len(built), dtype=bool)
    firsts[b[first]] = True
    return match, firsts


@dataclass
class Flow:
    """What the processes recorded, joined: the batches the training process took, in the order it
    took them, each with its built row (`match`, NONE: not recorded) and step (`step` where
    `in_step`)."""

    built: np.ndarray  # BUILT_ROW
    taken: np.ndarray  # TAKEN_ROW
    match: np.ndarray
    step: np.ndarray
    in_step: np.ndarray
    worker_first: np.ndarray  # its worker's first batch of the epoch: the wait holds the worker's start
    samples: SampleTimes = field(default_factory=SampleTimes)
    io: dict[int, dict[str, Any]] = field(default_factory=dict)  # built row -> its system calls
    loaders: dict[tuple[int, int], dict[str, Any]] = field(default_factory=dict)  # (pid, number) -> what
    taken_elsewhere: int = 0  # batches taken during a step by a thread other than the step's (a prefetcher)
    # (loader, sample index) of each outlier sample -> every timed fetch of it in the run (seconds)
    refetched: dict[tuple[int, int], np.ndarray] = field(default_factory=dict)
    # (seconds, built row, position in its batch, sample index, loader or -1) of the outlier samples
    outliers: list[tuple[float, int, int, int, int]] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.taken)

    def pair(self, k: int) -> tuple[Taken, Built | None, int | None]:
        """Taken batch k, the batch built for it and its step."""
        t = self.taken[k]
        taken = Taken(*(v.item() for v in (t[n] for n in TAKEN_ROW.names)))
        row = int(self.match[k])
        built = None
        if row != NONE:
            b = self.built[row]
            built = Built(*(b[n].item() for n in Built.__dataclass_fields__))
        return taken, built, int(self.step[k]) if self.in_step[k] else None


def join(
    built: np.ndarray,
    taken: np.ndarray,
    main: int | None,
    steps: np.ndarray,
    evals: list[tuple[float, float]],
    samples: SampleTimes | None = None,
) -> Flow:
    """`evals`: the training process's eval phases (begin, end): a batch drawn inside one fed an
    evaluation, not the step whose interval happens to hold it."""
    mine = taken[taken["pid"] == main] if main is not None and np.any(taken["pid"] != main) else taken
    if np.any(np.diff(mine["next_start"]) < 0):  # written in order: sorted already, no copy
        mine = mine[np.argsort(mine["next_start"], kind="stable")]
    elsewhere = np.zeros(len(mine), bool)
    if len(steps):
        starts = steps["start"].astype(np.float64)
        ends = starts + steps["seconds"].astype(np.float64)
        step, in_step, row = step_of(mine["next_start"], starts, ends, steps["i"])
        if "tid" in (steps.dtype.names or ()):
            elsewhere = in_step & _other_thread(mine["tid"], steps["tid"][row])
            in_step &= ~elsewhere
    else:
        step, in_step = np.zeros(len(mine), np.int64), np.zeros(len(mine), bool)
    in_step &= ~_inside_any(mine["next_start"], evals)
    match, firsts = _match(built, mine)
    worker_first = np.zeros(len(mine), dtype=bool)
    matched = match != NONE
    # (a worker's: the training process's own first batch of a pass waits for no process to start)
    worker_first[matched] = firsts[match[matched]] & (built["worker_id"][match[matched]] >= 0)
    flow = Flow(built, mine, match, step, in_step, worker_first, samples or SampleTimes())
    flow.taken_elsewhere = int(np.count_nonzero(elsewhere))
    _return_freed_memory()
    return flow


def _other_thread(taken_tid: np.ndarray, step_tid: np.ndarray) -> np.ndarray:
    """Which batches a thread other than the one running the step around them (`step_tid`) took
    (a prefetching thread's `BackgroundGenerator`): the wait is that thread's, not the step's (0:
    not recorded)."""
    return (taken_tid != 0) & (step_tid != 0) & (taken_tid != step_tid)


def _return_freed_memory() -> None:
    """glibc keeps freed temporaries (arrays of a few MB: the join's, the CSV chunks') in its heap,
    ~60 MB at a million batches: handed back to the system (nothing to do on another libc)."""
    trim = getattr(ctypes.CDLL(None), "malloc_trim", None)
    if trim is not None:
        trim(0)


def read_flow(
    directory: Path,
    main: int | None,
    steps: np.ndarray,
    evals: list[tuple[float, float]],
    syscalls: Iterable[dict[str, Any]] | None = None,
    to_realtime: Callable[[float], float] = float,
) -> Flow | None:
    """The batches of a run's processes/ directory joined; None when no DataLoader batch was seen."""
    built, taken, samples, loaders = read_all(directory)
    if not len(built) and not len(taken):
        return None
    flow = join(built, taken, main, steps, evals, samples)
    flow.loaders = loaders
    built_loader = _built_loaders(flow)
    flow.outliers = _outliers(flow, built_loader)
    flow.refetched = refetches(directory, flow, built_loader)
    if syscalls is not None:
        flow.io = attach_io(built, syscalls, to_realtime)
    return flow


# the section ------------------------------------------------------------------------------------
CSV_ROWS = 1 << 13  # batches.csv is written this many rows at a time


def _ms(seconds: Any) -> Any:
    """Milliseconds rounded to the µs: a float, or an array of them."""
    if not isinstance(seconds, np.ndarray):  # a number (an empty window's syscall time is int 0)
        return round(seconds * 1e3, 3)
    ms = seconds * 1e3
    return np.round(ms, 3, out=ms)  # in place: a million-row column is not made twice


class Columns:
    """The per-batch facts of taken batches `rows` (positions in flow.taken), as arrays computed
    when first asked (a million-batch run's section makes only the few it needs); a fact unknown
    for a batch (not built where recorded, not timed) is masked by `joined`/`timed`."""

    def __init__(self, flow: Flow, rows: np.ndarray | slice) -> None:
        self.flow = flow
        self.taken = flow.taken[rows]
        self.match = flow.match[rows]
        self.joined = self.match != NONE
        self.at = np.where(self.joined, self.match, 0)  # built rows (0 where not joined: masked)
        self.step, self.in_step = flow.step[rows], flow.in_step[rows]
        self.worker_first = flow.worker_first[rows]

    def built(self, name: str) -> np.ndarray:
        column = self.flow.built[name]
        return column[self.at] if len(column) else np.zeros(len(self.at), column.dtype)

    @functools.cached_property
    def waited_ms(self) -> np.ndarray:
        return _ms(self.taken["next_end"] - self.taken["next_start"])

    @functools.cached_property
    def fetch_ms(self) -> np.ndarray:
        return _ms(self.built("fetched") - self.built("start"))

    @functools.cached_property
    def collate_ms(self) -> np.ndarray:
        return _ms(self.built("collated") - self.built("fetched"))

    @functools.cached_property
    def ready_before_asked(self) -> np.ndarray:
        return self.built("ready") <= self.taken["next_start"]


def batch_name(idx: int, loader: int, passes: int) -> str:
    """ "batch 3", "batch 3 (loader 1, pass 2)": loader 0 and pass 0 (the first) go unsaid."""
    where = [f"{word} {n}" for word, n in (("loader", loader), ("pass", passes)) if n not in (0, UNKNOWN)]
    return f"batch {idx}" + (f" ({', '.join(where)})" if where else "")


def batch_row(flow: Flow, k: int) -> dict[str, Any]:
    """Taken batch k as one row (results.json's lists, batches.csv)."""
    c = Columns(flow, np.array([k]))
    return next(_rows(flow, c))


def _rows(flow: Flow, c: Columns) -> Iterator[dict[str, Any]]:
    t = c.taken
    columns = {
        "step": c.step.tolist(),
        "in_step": c.in_step.tolist(),
        "loader": t["loader"].tolist(),
        "pass": t["pass"].tolist(),
        "generation": t["generation"].tolist(),
        "batch": t["idx"].tolist(),
        "worker": t["worker_id"].tolist(),
        "worker_pid": t["worker_pid"].tolist(),
        "waited_ms": c.waited_ms.tolist(),
        "pin_ms": _ms(t["pin"].astype(np.float64)).tolist(),
        "worker_first": c.worker_first.tolist(),
        "match": c.match.tolist(),
        "samples": c.built("samples").tolist(),
        "fetch_ms": c.fetch_ms.tolist(),
        "collate_ms": c.collate_ms.tolist(),
        "queued_ms": _ms(np.maximum(t["taken"] - c.built("ready"), 0.0)).tolist(),
        "ready_before_asked": c.ready_before_asked.tolist(),
        "timed": (c.built("slowest_at") >= 0).tolist(),
        "whole": (c.built("flags") & WHOLE != 0).tolist(),
        "slowest_sample": c.built("slowest_sample").tolist(),
        "slowest_sample_ms": _ms(c.built("slowest_end") - c.built("slowest_begin")).tolist(),
    }
    for v in zip(*columns.values(), strict=True):
        r = dict(zip(columns, v, strict=True))
        row: dict[str, Any] = {
            "step": r["step"] if r["in_step"] else None,
            "loader": None if r["loader"] == UNKNOWN else r["loader"],
            "pass": None if r["pass"] == UNKNOWN else r["pass"],
            "batch": r["batch"],
            "worker": None if r["worker"] < 0 else r["worker"],
            "worker_pid": r["worker_pid"],
            "generation": r["generation"],  # with worker_pid and batch: its record (sample_indices)
            "waited_ms": r["waited_ms"],
            "pin_ms": None if math.isnan(r["pin_ms"]) else r["pin_ms"],
            "worker_first": r["worker_first"],
        }
        if r["match"] == NONE:
            yield row
            continue
        row.update(
            samples=r["samples"],
            fetch_ms=r["fetch_ms"],
            collate_ms=r["collate_ms"],
            queued_ms=r["queued_ms"],
            ready_before_asked=r["ready_before_asked"],
        )
        if r["timed"]:
            row.update(slowest_sample=r["slowest_sample"], slowest_sample_ms=r["slowest_sample_ms"])
        elif r["whole"]:
            row["fetched_whole"] = True  # by the dataset's __getitems__: no sample timed alone
        io = flow.io.get(r["match"])
        if io:
            _io_cells(row, io)
        yield row


def _io_cells(row: dict[str, Any], io: dict[str, Any]) -> None:
    row.update(reads=io["reads"], bytes_read=io["bytes_read"], syscall_ms=_ms(io["syscall_s"]))
    if not io.get("per_thread", True):
        row["io_of_process"] = True  # a trace without thread ids: all the process's threads
    others = io.get("others") or {}
    row.update(other_threads_reads=others.get("reads", 0), other_threads_bytes=others.get("bytes_read", 0))
    row["files"] = [f["path"] for f in io["files"]]
    top = _read_most(io)
    if top:  # the file the batch read most from
        row.update(top_file=top["path"], top_file_reads=top["reads"], top_file_bytes=top["bytes"])
    top = _read_most(io.get("slowest") or {})
    if top:
        row.update(
            slowest_sample_file=top["path"],
            slowest_sample_reads=top["reads"],
            slowest_sample_bytes=top["bytes"],
        )


def _read_most(io: dict[str, Any]) -> dict[str, Any] | None:
    """The file a window read most from (io_summary's files are sorted by bytes); None when it read
    none: a file only stat()ed or opened (a module a stack walk looked at) is not what it read."""
    return next((f for f in io.get("files") or [] if f["reads"]), None)


def _top(keys: np.ndarray, positions: np.ndarray, n: int = SLOWEST) -> np.ndarray:
    """The positions of the n largest keys, in descending order, ties in their order."""
    return positions[np.argsort(-keys[positions], kind="stable")[:n]]


def section(flow: Flow, steps: np.ndarray, out_csv: Path, trace_io: bool) -> dict[str, Any]:
    """The "batches" section; the full per-batch table is written to `out_csv`."""
    write_csv(out_csv, flow)
    _return_freed_memory()
    c = Columns(flow, slice(None))
    workers = worker_table(flow, c)  # first: its temporaries freed before the columns below are made
    in_steps = np.flatnonzero(c.in_step)
    steady = in_steps[~c.worker_first[in_steps]]
    longest_steady = _top(c.waited_ms, steady, 1)
    joined = np.flatnonzero(c.joined)
    return {
        "batches_taken": len(flow),
        "batches_built": len(flow.built),
        "joined": len(joined),
        "in_steps": len(in_steps),
        "taken_elsewhere": flow.taken_elsewhere,
        "trace_io": trace_io,
        "loaders": loader_table(flow, c),
        "own_cost": own_cost(flow),
        "fetched_whole": int(np.count_nonzero(c.joined & (c.built("flags") & WHOLE != 0))),
        # the training process times batches, never samples one by one (batches.py)
        "built_in_main_untimed": int(
            np.count_nonzero(c.joined & (c.built("worker_id") < 0) & (c.built("flags") & (SAMPLE_TIMES | WHOLE) == 0))
        ),
        "shares": shares(c, in_steps, steps),
        "workers": workers,
        "keeping_ahead": keeping_ahead(c, in_steps),
        "longest_waits": [batch_row(flow, k) for k in _top(c.waited_ms, in_steps).tolist()],
        # a worker's first batch of an epoch also waits for the worker to start: the longest wait apart
        "longest_steady_wait": batch_row(flow, int(longest_steady[0])) if len(longest_steady) else None,
        "first_batches": first_batches(c, in_steps),
        "slowest_batches": [batch_row(flow, k) for k in _top(c.fetch_ms + c.collate_ms, joined).tolist()],
        "samples": sample_outliers(flow),
        "files": file_outliers(flow.io) if trace_io else None,
    }


def own_cost(flow: Flow) -> dict[str, Any] | None:
    """The x-ray's own CPU cost as the training process measured it at exit (batchcost.py), per
    batch of this run: its part per batch plus its part per timed sample times the timed samples
    a batch had on average, against the mean time a batch took to build."""
    main = int(flow.taken["pid"][0]) if len(flow.taken) else None
    measured = flow.loaders.get((main, -1)) if main is not None else None  # type: ignore[arg-type]
    if measured is None or "batch_us" not in measured or not len(flow.built):
        return measured
    built = flow.built
    build_us = float(np.mean(built["collated"] - built["start"])) * 1e6
    per_batch = measured["batch_us"] + measured["sample_ns"] / 1e3 * flow.samples.count / len(built)
    return {
        **measured,
        "per_batch_us": round(per_batch, 2),
        "build_us": round(build_us, 2),
        "pct_of_build": round(100.0 * per_batch / build_us, 2) if build_us > 0 else None,
    }


def loader_table(flow: Flow, c: Columns) -> list[dict[str, Any]]:
    """Per DataLoader of the training process, in the order first iterated: what it is, its passes,
    the batches taken from it and how many fed a step. Loaders alike (the same description, and
    feeding steps or not) are one row, `loaders` of them numbered `loader` to `last_loader`: a
    trainer that makes a new DataLoader every epoch (Keras) has two rows whatever its epochs."""
    main = int(c.taken["pid"][0]) if len(c.taken) else None
    # each loader's batches, batches in steps and passes, by one sort (never a pass over all batches a loader)
    numbers, which = np.unique(c.taken["loader"], return_inverse=True)  # (the cost record, -1, is none of them)
    batches = np.bincount(which, minlength=len(numbers))
    in_steps = np.bincount(which, weights=c.in_step, minlength=len(numbers))
    passes = np.bincount(
        np.unique(np.stack([which, c.taken["pass"].astype(np.int64)]), axis=1)[0], minlength=len(numbers)
    )
    rows: dict[tuple[str, bool], dict[str, Any]] = {}
    for k, number in enumerate(numbers.tolist()):
        described = flow.loaders.get((main, number), {})  # type: ignore[arg-type]
        key = (json.dumps(described, sort_keys=True) if number != UNKNOWN else "?", in_steps[k] > 0)
        found = rows.setdefault(
            key,
            {
                "loader": None if number == UNKNOWN else number,
                **described,
                "loaders": 0,
                "passes": 0,
                "batches_taken": 0,
                "in_steps": 0,
            },
        )
        found["loaders"] += 1
        found["last_loader"] = None if number == UNKNOWN else number
        found["passes"] += int(passes[k])
        found["batches_taken"] += int(batches[k])
        found["in_steps"] += int(in_steps[k])
    return list(rows.values())


def shares(c: Columns, rows: np.ndarray, steps: np.ndarray) -> dict[str, Any]:
    """Over the steps that drew a batch: the share of their time spent waiting for one; and of the
    build time of those batches, the share in fetch and in collate."""
    used = np.unique(c.step[rows])
    if not len(used) or not len(steps):
        return {}
    mask = np.isin(steps["i"], used.astype(steps["i"].dtype))
    step_s = float(steps["seconds"][mask].astype(np.float64).sum())
    waited = float(c.waited_ms[rows].sum()) / 1e3
    joined = rows[c.joined[rows]]
    fetch = float(c.fetch_ms[joined].sum())
    collate = float(c.collate_ms[joined].sum())
    build = fetch + collate
    return {
        "steps": len(used),
        "step_s": round(step_s, 6),
        "waited_s": round(waited, 6),
        "wait_pct": round(100.0 * waited / step_s, 2) if step_s > 0 else None,
        "fetch_pct_of_build": round(100.0 * fetch / build, 2) if build > 0 else None,
        "collate_pct_of_build": round(100.0 * collate / build, 2) if build > 0 else None,
    }


def first_batches(c: Columns, rows: np.ndarray) -> dict[str, Any]:
    """Each worker's first batch of an epoch: its wait holds the worker's start (non-persistent
    workers start at every epoch) and the first fetches."""
    firsts = c.waited_ms[rows[c.worker_first[rows]]]
    return {
        "count": len(firsts),
        "waited_ms": round(float(firsts.sum()), 3),
        "max_ms": float(firsts.max()) if len(firsts) else 0.0,
    }


def worker_table(flow: Flow, c: Columns) -> list[dict[str, Any]]:
    """Per worker (its id: non-persistent workers are new processes every epoch, so the table stays
    as long as num_workers): batches built, time building them (busy) against the time from each
    process's first batch's start to its last batch's hand-off (busy + idle)."""
    built = flow.built
    if not len(built):
        return []
    pids, process = np.unique(built["pid"], return_inverse=True)
    first = np.full(len(pids), np.inf)
    last = np.full(len(pids), -np.inf)
    np.minimum.at(first, process, built["start"])
    np.maximum.at(last, process, built["ready"])
    waited = np.zeros(len(pids))
    known = np.isin(c.taken["worker_pid"], pids)
    np.add.at(waited, np.searchsorted(pids, c.taken["worker_pid"][known]), c.waited_ms[known])
    worker_of = np.zeros(len(pids), dtype=np.int64)
    worker_of[process] = built["worker_id"]
    busy = built["ready"] - built["start"]
    table = []
    for worker in np.unique(built["worker_id"]).tolist():
        mine = built["worker_id"] == worker
        processes = worker_of == worker
        count = int(mine.sum())
        busy_s = float(busy[mine].sum())
        span = float((last[processes] - first[processes]).sum())
        table.append(
            {
                "worker": None if worker < 0 else worker,
                "pid": int(pids[processes].min()),
                "processes": int(processes.sum()),
                "batches": count,
                "busy_s": round(busy_s, 6),
                "span_s": round(span, 6),
                "busy_pct": round(100.0 * busy_s / span, 2) if span > 0 else 100.0,
                "mean_build_ms": _ms(busy_s / count),
                "waited_ms": round(float(waited[processes].sum()), 3),
            }
        )
    return table


def keeping_ahead(c: Columns, rows: np.ndarray) -> dict[str, Any]:
    """Whether the workers keep ahead: the share of batches ready before the loop asked, overall
    and in each tenth of the run (batches ready over time)."""
    known = rows[c.joined[rows] & (c.taken["worker_id"][rows] >= 0)]
    n = len(known)
    if not n:
        return {}
    ready = c.ready_before_asked[known]
    parts = min(10, n)
    bounds = [k * n // parts for k in range(parts + 1)]
    tenths = [round(100.0 * float(ready[a:b].mean()), 1) for a, b in itertools.pairwise(bounds)]
    return {
        "batches": n,
        "ready_pct": round(100.0 * int(ready.sum()) / n, 2),
        "ready_pct_by_tenth": tenths,
    }


def outlier_bar(times: SampleTimes) -> tuple[float, float]:
    """(the median sample fetch, the time from which a sample is an outlier)."""
    median = float(np.median(times.values()))
    return median, max(OUTLIER_FACTOR * median, OUTLIER_MIN_S)


def _outliers(flow: Flow, built_loader: np.ndarray) -> list[tuple[float, int, int, int, int]]:
    """Flow.outliers, from the slowest samples kept (`built_loader`: _built_loaders')."""
    times = flow.samples
    if not times.count:
        return []
    _, bar = outlier_bar(times)
    return [(s, row, at, sample, int(built_loader[row])) for s, row, at, sample in times.top.tolist() if s >= bar]


def _built_loaders(flow: Flow) -> np.ndarray:
    """Each built batch's loader number (-1: not taken, or taken from a loader not numbered)."""
    loaders = np.full(len(flow.built), -1, np.int64)
    joined = flow.match != NONE
    numbered = flow.taken["loader"][joined].astype(np.int64)
    loaders[flow.match[joined]] = np.where(numbered == UNKNOWN, -1, numbered)
    return loaders


def refetches(directory: Path, flow: Flow, built_loader: np.ndarray) -> dict[tuple[int, int], np.ndarray]:
    """Every timed fetch of each outlier sample of a map-style dataset, by (loader, sample index):
    a second pass over the built records, only where there are outliers, keeping only theirs. A
    sample slow each time it is fetched is the data's; one slow once and fast again is the
    moment's (a worker waiting for a core, a cold cache). An iterable's positions are no samples."""
    wanted = {
        (loader, sample) for _, row, _, sample, loader in flow.outliers if not flow.built["flags"][row] & ITERABLE
    }
    if not wanted:
        return {}
    indices_wanted = np.array(sorted({sample for _, sample in wanted}), np.int64)
    found: dict[tuple[int, int], list[np.ndarray]] = {key: [] for key in wanted}
    first_row = 0  # built rows are numbered as read_all numbers them: files sorted, whole records in order
    for path in per_process(directory, BATCHES_SUFFIX).values():
        for block, built_at, _, _, _ in _records(path):
            if not built_at:
                continue
            data = np.frombuffer(block, np.uint8)
            heads, offsets, n, timed = _whole_built(data, np.array(built_at, np.int64))
            mapped = timed & ((heads["flags"] & ITERABLE) == 0)
            for width in np.unique(n[mapped]).tolist():
                group = np.flatnonzero(mapped & (n == width))
                if not width or not len(group):
                    continue
                indices, ends = _sample_times(data, offsets[group], heads["start"][group], width)
                hit = np.isin(indices, indices_wanted)
                if not hit.any():
                    continue
                seconds = np.diff(ends, axis=1, prepend=0.0)
                line, k = np.nonzero(hit)
                loaders = built_loader[first_row + group[line]]
                for loader, sample, spent in zip(
                    loaders.tolist(), indices[line, k].tolist(), seconds[line, k], strict=True
                ):
                    if (loader, sample) in found:
                        found[loader, sample].append(spent)
            first_row += len(heads)
    return {key: np.array(times) for key, times in found.items() if times}


def sample_outliers(flow: Flow) -> dict[str, Any]:
    """Per-sample fetch time: its distribution and the samples at ≥ OUTLIER_FACTOR × the median
    (from a uniform reservoir past SAMPLES_KEPT samples: then `estimated_from` says how many), each
    with its other timed fetches in the run (`refetched`)."""
    times = flow.samples
    values = times.values()
    if not times.count:
        return {"count": 0}
    median, bar = outlier_bar(times)
    outliers = []
    for seconds, row, at, sample, loader in flow.outliers:
        b = flow.built[row]
        taken = np.flatnonzero(flow.match == row)  # the batch's pass, where the loop took it
        t = flow.taken[taken[0]] if len(taken) else None
        outliers.append(
            {
                "sample": sample,
                "ms": _ms(seconds),
                "times_median": round(seconds / median, 1) if median > 0 else None,
                "worker": None if b["worker_id"] < 0 else int(b["worker_id"]),
                "loader": None if loader < 0 else loader,
                "pass": None if t is None or t["pass"] == UNKNOWN else int(t["pass"]),
                "batch": int(b["idx"]),
                "file": _sample_file(flow, row, at),
                **_other_fetches(flow.refetched.get((loader, sample)), seconds, bar),
            }
        )
    above = int(np.count_nonzero(values >= bar))
    out = {
        "count": times.count,
        "median_ms": _ms(median),
        "p99_ms": _ms(float(np.percentile(values, 99))),
        "max_ms": _ms(float(times.top["s"][0])),
        "outliers": outliers,
        "outlier_ms": _ms(bar),
        "outliers_total": above if len(values) == times.count else round(above * times.count / len(values)),
    }
    if len(values) < times.count:
        out["estimated_from"] = len(values)
    return out


def _other_fetches(fetches: np.ndarray | None, seconds: float, bar: float) -> dict[str, Any]:
    """The sample's other timed fetches (this one taken out once): how many, their median, and
    how many were as slow (outliers, and at least AS_SLOW of this fetch's time: a 1 ms hiccup
    beside a 200 ms fetch does not make the sample slow). None where not looked up (an
    iterable's position)."""
    if fetches is None:
        return {"other_fetches": None}
    others = np.delete(fetches, int(np.argmin(np.abs(fetches - seconds))))
    if not len(others):
        return {"other_fetches": 0}
    return {
        "other_fetches": len(others),
        "other_median_ms": _ms(float(np.median(others))),
        "other_slow": int(np.count_nonzero(others >= max(bar, AS_SLOW * seconds))),
    }


def _sample_file(flow: Flow, row: int, at: int) -> str | None:
    """The file its batch's slowest sample read most from, when it is that sample."""
    if flow.built["slowest_at"][row] != at:
        return None
    top = _read_most(flow.io.get(row, {}).get("slowest") or {})
    return top["path"] if top else None


def file_outliers(io: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """Per file read while building batches: reads, bytes, time in system calls; the files at
    ≥ OUTLIER_FACTOR × the median bytes or time named."""
    files: dict[str, dict[str, Any]] = {}
    for summary in io.values():
        for f in summary.get("files", []):
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


def write_csv(path: Path, flow: Flow) -> None:
    """batches.csv, CSV_ROWS batches at a time (a week's batches never held as rows at once)."""
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(CSV_COLUMNS)
        for first in range(0, len(flow), CSV_ROWS):
            rows = _rows(flow, Columns(flow, slice(first, first + CSV_ROWS)))
            writer.writerows([_cell(r.get(c)) for c in CSV_COLUMNS] for r in rows)


def _cell(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, list):
        return json.dumps(value)
    return value
