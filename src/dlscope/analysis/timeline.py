"""One timeline: a single Chrome/Perfetto trace of a `dlscope run`, and our own loader that checks it.

A process per OS process; per process, tracks for its threads' profiler operators (Kineto's own
tids), a "steps" track, a "phases" track, a "profiler steps" track (ProfilerStep#N, over the
training step the profiler recorded as N), and with
--trace-io one "syscalls" track per thread (their own tracks, so µs clock skew cannot break
nesting with the operators). A long run's "steps" track holds TIMELINE_STEPS of its steps (the
first and last, the profiled and the slowest; steptable.timeline_positions): the step file holds
them all. Every time is mapped
to one clock, CLOCK_REALTIME, in µs from the run's start:
  - our records and strace -ttt / the proc backend stamp CLOCK_REALTIME seconds;
  - Kineto's `ts` is µs from `baseTimeNanoseconds` (CLOCK_REALTIME) when that key is there,
    else absolute Unix µs (older versions);
  - bpftrace's nsecs is CLOCK_BOOTTIME: shifted by REALTIME − BOOTTIME, the mean of the offsets
    sampled at the start and the end of the run (their difference is reported as drift).
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from dlscope.analysis import batchflow, kineto, steptable
from dlscope.analysis.observed import Observed, phase_slices
from dlscope.fsutil import atomic_write_bytes, json_text

STEPS_TID, PHASES_TID, PROFILER_STEPS_TID = 1_000_000_001, 1_000_000_002, 1_000_000_003
BUILT_TID, TAKEN_TID = 1_000_000_004, 1_000_000_005  # the batch x-ray (batchflow.py)
TIMELINE_BATCHES = 4000  # batches drawn: evenly over the run, plus the longest waits (batches.csv has all)
SYSCALL_TID_BASE = 1_100_000_000
KEPT_KINETO = ("cpu_op", "user_annotation", "python_function", "cuda_runtime", "kernel", "gpu_memcpy", "gpu_memset")


@dataclass
class ClockMap:
    """Times in seconds on the tracers' clocks → µs since `origin_ns` on CLOCK_REALTIME."""

    origin_ns: int
    boot_offset_ns: int  # REALTIME − BOOTTIME
    drift_ns: int = 0

    @classmethod
    def sampled(cls, start: dict[str, int], end: dict[str, int]) -> ClockMap:
        first = start["realtime"] - start["boottime"]
        last = end["realtime"] - end["boottime"]
        return cls(start["realtime"], (first + last) // 2, abs(last - first))

    def realtime_s(self, seconds: float) -> float:
        return (seconds * 1e9 - self.origin_ns) / 1e3

    def boottime_to_realtime(self, seconds: float) -> float:
        """A CLOCK_BOOTTIME time in seconds, on CLOCK_REALTIME."""
        return seconds + self.boot_offset_ns / 1e9

    def boottime_s(self, seconds: float) -> float:
        return (seconds * 1e9 + self.boot_offset_ns - self.origin_ns) / 1e3

    def kineto(self, trace: dict[str, Any]) -> float:
        """The offset (µs) to add to a Kineto trace's `ts` values."""
        base = trace.get("baseTimeNanoseconds")
        return (int(base) - self.origin_ns) / 1e3 if base is not None else -self.origin_ns / 1e3


class TimelineWriter:
    def __init__(self, clock: ClockMap) -> None:
        self.clock = clock
        self.events: list[dict[str, Any]] = []
        self.named: set[tuple[int, int]] = set()
        self.syscall_tids: dict[tuple[int, int], int] = {}

    def track(self, pid: int, tid: int, name: str, sort: int) -> None:
        if (pid, tid) in self.named:
            return
        self.named.add((pid, tid))
        self.events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}})
        self.events.append(
            {"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid, "args": {"sort_index": sort}}
        )

    def process(self, pid: int, info: dict[str, Any]) -> None:
        """A rank's process is named "rank k" and sorted by rank; its command line becomes a label."""
        argv = " ".join(info.get("argv") or [])[:80] or "python"
        rank = info.get("rank")
        name = argv if rank is None else f"rank {rank}"
        self.events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": name}})
        if rank is not None:
            self.events.append({"ph": "M", "name": "process_labels", "pid": pid, "tid": 0, "args": {"labels": argv}})
            sort = {"sort_index": rank}
            self.events.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": sort})

    def add_steps(self, pid: int, table: np.ndarray, codes: dict[str, list[str | None]]) -> None:
        if not len(table):
            return
        self.track(pid, STEPS_TID, "steps", 0)
        unprofiled = codes["profiled"].index(None)
        src, profiled = codes["src"], codes["profiled"]
        for k in steptable.timeline_positions(table, unprofiled):
            s = table[k]
            args = {p: round(float(s[p]) * 1e3, 3) for p in ("data", "forward", "backward", "optimizer")}
            args.update(source=src[int(s["src"])], profiled=profiled[int(s["profiled"])])
            start = self.clock.realtime_s(float(s["start"]))
            self.events.append(
                {
                    "ph": "X",
                    "cat": "step",
                    "name": f"step {int(s['i'])}",
                    "pid": pid,
                    "tid": STEPS_TID,
                    "ts": start,
                    "dur": self.clock.realtime_s(float(s["start"]) + float(s["seconds"])) - start,
                    "args": args,
                }
            )

    def add_phases(self, pid: int, records: list[dict[str, Any]], last_step: float) -> None:
        origin_s = self.clock.origin_ns / 1e9
        slices = phase_slices(pid, records, origin_s, last_step)
        if slices:
            self.track(pid, PHASES_TID, "phases", 1)
        for p in slices:
            args = {"file": p["file"]} if p["file"] else {}
            self.events.append(
                {
                    "ph": "X",
                    "cat": "phase",
                    "name": p["phase"],
                    "pid": pid,
                    "tid": PHASES_TID,
                    "ts": self.clock.realtime_s(p["begin_ts"]),
                    "dur": self.clock.realtime_s(p["end_ts"]) - self.clock.realtime_s(p["begin_ts"]),
                    "args": args,
                }
            )

    def add_kineto(self, path: Path, recorded: list[list[Any]]) -> None:
        """A profiler window's trace; `recorded`: the training steps it recorded (its profile
        record's), each drawn as its ProfilerStep#N over the step alone — torch's mark runs from one
        `prof.step()` to the next, over an evaluation or a checkpoint between two steps too — and
        a mark that holds no recorded step (the step the script ended in) left out."""
        trace = json.loads(path.read_text())
        shift = self.clock.kineto(trace)
        spans = {n: (start, end) for n, start, end in kineto.recorded_spans(trace, recorded)}
        for e in trace.get("traceEvents", []):
            if e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep#"):
                # prof.step() runs in the optimizer's post-hook, inside torch's Optimizer.step
                # annotation: on the operators' track the two would cross, so steps get their own
                span = spans.get(int(e["name"].split("#", 1)[1]))
                if span is None:
                    continue
                self.track(e["pid"], PROFILER_STEPS_TID, "profiler steps", 2)
                self.events.append({**e, "ts": span[0] + shift, "dur": span[1] - span[0], "tid": PROFILER_STEPS_TID})
            elif e.get("ph") == "X" and e.get("cat") in KEPT_KINETO:
                self.events.append({**e, "ts": e["ts"] + shift})
            elif e.get("ph") == "M" and e.get("name") in ("thread_name", "thread_sort_index"):
                if isinstance(e.get("tid"), int):
                    self.named.add((e["pid"], e["tid"]))
                self.events.append(e)

    def add_syscalls(self, events: Iterator[dict[str, Any]], backend: str) -> None:
        to_us = self.clock.boottime_s if backend == "ebpf" else self.clock.realtime_s
        for e in events:
            pid, tid = e["pid"], e["tid"]
            track = self.syscall_tids.setdefault((pid, tid), SYSCALL_TID_BASE + len(self.syscall_tids))
            self.track(pid, track, f"syscalls · thread {tid}", 10)
            if e["call"] == "phase":
                self.events.append(
                    {
                        "ph": "i",
                        "s": "t",
                        "cat": "phase_marker",
                        "name": f"{e['name']}/{e['edge']}",
                        "pid": pid,
                        "tid": track,
                        "ts": to_us(e["ts"]),
                        "args": {"phase": e["name"], "edge": e["edge"], "thread": tid},
                    }
                )
                continue
            args = {k: e[k] for k in ("path", "ret", "bytes", "err") if e.get(k) is not None}
            self.events.append(
                {
                    "ph": "X",
                    "cat": e.get("kind", "syscall"),
                    "name": e["call"],
                    "pid": pid,
                    "tid": track,
                    "ts": to_us(e["ts"]),
                    "dur": (e.get("dur") or 0.0) * 1e6,
                    "args": args,
                }
            )

    def add_batches(self, flow: batchflow.Flow) -> None:
        """A "batches built" track per worker (a slice per batch, from its fetch to its hand-off),
        a "batches taken" track in the training process (the `__next__` that waited for it), and
        a flow arrow from each batch to the `__next__` — and so the step — that used it."""
        keep = steptable.stride_positions(len(flow), TIMELINE_BATCHES).tolist()
        waited = flow.taken["next_end"] - flow.taken["next_start"]
        longest = np.argsort(-waited, kind="stable")[: steptable.SLOWEST].tolist()
        to_us = self.clock.realtime_s
        for n, k in enumerate(sorted(set(keep) | set(longest))):
            taken, built, step = flow.pair(k)
            name = batchflow.batch_name(taken.idx, taken.loader, taken.pass_)
            start, end = to_us(taken.next_start), to_us(taken.next_end)
            self.track(taken.pid, TAKEN_TID, "batches taken", 3)
            args = {"step": step, "worker": None if taken.worker_id < 0 else taken.worker_id}
            self.events.append(
                {
                    "ph": "X",
                    "cat": "batch_taken",
                    "name": name,
                    "pid": taken.pid,
                    "tid": TAKEN_TID,
                    "ts": start,
                    "dur": end - start,
                    "args": {**args, "waited_ms": round((end - start) / 1e3, 3)},
                }
            )
            if built is None:
                continue
            b0, b1 = to_us(built.start), to_us(built.ready)
            label = "batches built" if built.worker_id < 0 else f"batches built · worker {built.worker_id}"
            self.track(built.pid, BUILT_TID, label, 3)
            built_args = {
                "fetch_ms": round(built.fetched - built.start, 6) * 1e3,
                "collate_ms": round(built.collated - built.fetched, 6) * 1e3,
                "samples": built.samples,
                "step": step,
            }
            self.events.append(
                {
                    "ph": "X",
                    "cat": "batch_built",
                    "name": name,
                    "pid": built.pid,
                    "tid": BUILT_TID,
                    "ts": b0,
                    "dur": b1 - b0,
                    "args": built_args,
                }
            )
            # each end inside its own slice, so Perfetto binds the arrow to both
            arrow = {"cat": "batch", "name": "batch", "id": n + 1}
            self.events.append({**arrow, "ph": "s", "pid": built.pid, "tid": BUILT_TID, "ts": (b0 + b1) / 2})
            self.events.append(
                {**arrow, "ph": "f", "bp": "e", "pid": taken.pid, "tid": TAKEN_TID, "ts": (start + end) / 2}
            )

    def write(self, path: Path) -> Path:
        document = {
            "displayTimeUnit": "ms",
            "otherData": {
                "clock": "CLOCK_REALTIME, µs since the run's start",
                "origin_unix_ns": self.clock.origin_ns,
                "boottime_offset_ns": self.clock.boot_offset_ns,
                "boottime_offset_drift_ns": self.clock.drift_ns,
            },
            "traceEvents": self.events,
        }
        # a traced path's undecodable bytes (surrogateescape) as \udcXX escapes: UTF-8 always encodes
        return atomic_write_bytes(path, json_text(document).encode())


def build(
    observed: Observed,
    clock: ClockMap,
    out: Path,
    processes: list[dict[str, Any]],
    backend: str | None = None,
    batches: batchflow.Flow | None = None,
) -> Path:
    """One trace of every process: its steps, phases, profiler operators (the traces the records
    name), the --trace-io syscalls (`backend` names how they were taken) and the batches."""
    writer = TimelineWriter(clock)
    for info in processes:
        writer.process(info["pid"], info)
    for pid, rs in observed.records.items():
        if pid in observed.steps:
            writer.add_steps(pid, observed.stream(pid)[1], observed.steps[pid].codes)
        writer.add_phases(pid, rs, observed.last_step(pid))
    for path, recorded in observed.profile_traces():
        writer.add_kineto(path, recorded)
    syscalls = observed.syscalls()
    if syscalls is not None and backend is not None:
        writer.add_syscalls(iter(syscalls), backend)
    if batches is not None:
        writer.add_batches(batches)
    return writer.write(out)


# The loader: what the tests (and anyone) use to check a timeline ------------------------------

PHASES = {"X", "B", "E", "i", "I", "M", "s", "t", "f", "C"}


class TraceFormatError(ValueError):
    """Not valid Trace Event Format."""


@dataclass
class Slice:
    name: str
    cat: str
    start: float
    end: float
    args: dict[str, Any] = field(default_factory=dict)


@dataclass
class Trace:
    slices: dict[tuple[int, int], list[Slice]]  # (pid, tid) → slices sorted by start
    instants: dict[tuple[int, int], list[Slice]]
    track_names: dict[tuple[int, int], str]

    def tracks_named(self, pid: int, name: str) -> list[Slice]:
        return [
            s for key, n in self.track_names.items() if key[0] == pid and n == name for s in self.slices.get(key, [])
        ]

    def all_slices(self, cat: str) -> Iterator[tuple[tuple[int, int], Slice]]:
        for key, slices in self.slices.items():
            for s in slices:
                if s.cat == cat:
                    yield key, s


def load(path: Path) -> Trace:
    """Parse and check a Chrome/Perfetto JSON trace: required keys and types per event, B/E paired
    per track; raises TraceFormatError naming the first bad event."""
    try:
        document = json.loads(Path(path).read_text())
    except json.JSONDecodeError as e:
        raise TraceFormatError(f"{path}: not JSON ({e})") from None
    events = document.get("traceEvents") if isinstance(document, dict) else document
    if not isinstance(events, list):
        raise TraceFormatError(f"{path}: no traceEvents list")
    slices: dict[tuple[int, int], list[Slice]] = defaultdict(list)
    instants: dict[tuple[int, int], list[Slice]] = defaultdict(list)
    names: dict[tuple[int, int], str] = {}
    open_: dict[tuple[int, int], list[dict[str, Any]]] = defaultdict(list)
    for n, e in enumerate(events):
        ph = e.get("ph") if isinstance(e, dict) else None
        if ph not in PHASES:
            raise TraceFormatError(f"{path}: event {n} has no valid 'ph' ({ph!r})")
        if ph == "M":
            if e.get("name") == "thread_name":
                names[(e["pid"], e["tid"])] = e["args"]["name"]
            continue
        for key in ("name", "pid", "tid", "ts"):
            if key not in e:
                raise TraceFormatError(f"{path}: event {n} ({ph}) lacks {key!r}")
        if not isinstance(e["ts"], int | float):
            raise TraceFormatError(f"{path}: event {n} has a non-numeric ts")
        track = (e["pid"], e["tid"])
        if ph == "X":
            if not isinstance(e.get("dur"), int | float) or e["dur"] < 0:
                raise TraceFormatError(f"{path}: event {n} (X) needs a duration ≥ 0")
            slices[track].append(Slice(e["name"], e.get("cat", ""), e["ts"], e["ts"] + e["dur"], e.get("args", {})))
        elif ph == "B":
            open_[track].append(e)
        elif ph == "E":
            if not open_[track]:
                raise TraceFormatError(f"{path}: event {n} ends a slice that never began on its track")
            b = open_[track].pop()
            slices[track].append(Slice(b["name"], b.get("cat", ""), b["ts"], e["ts"], b.get("args", {})))
        elif ph in ("i", "I"):
            instants[track].append(Slice(e["name"], e.get("cat", ""), e["ts"], e["ts"], e.get("args", {})))
    for s in slices.values():
        s.sort(key=lambda x: (x.start, -x.end))
    return Trace(dict(slices), dict(instants), names)


def nesting_errors(trace: Trace, tolerance_us: float = 0.01) -> list[str]:
    """Slices on one track must nest (Perfetto's rule): each lies inside the enclosing one or
    after it. `tolerance_us` absorbs the rounding of µs timestamps with three decimals."""
    errors = []
    for track, slices in trace.slices.items():
        stack: list[Slice] = []
        for s in slices:
            while stack and s.start >= stack[-1].end - tolerance_us:
                stack.pop()
            if stack and s.end > stack[-1].end + tolerance_us:
                errors.append(f"track {track}: {s.name} [{s.start}, {s.end}] overlaps {stack[-1].name}")
            stack.append(s)
    return errors


def inside(t0: float, t1: float, slices: list[Slice], tolerance_us: float = 0.0) -> bool:
    return any(s.start - tolerance_us <= t0 and t1 <= s.end + tolerance_us for s in slices)
