"""The step anatomy on the GPU's own clock, for a script that trains on CUDA.

On a GPU, forward and backward return once their kernels are queued: the host's clock puts the
GPU's time wherever the script next waits for it (a `loss.item()`, a copy from unpinned memory,
the optimizer when the launch queue is full). So every event the step machine receives (a batch
drawn, a forward, a backward, an optimizer step, a closure, a checkpoint, `train()`) also records
a CUDA event on the current stream, and the same event sequence is replayed, with each host time
replaced by its CUDA event's time, into a second step machine: the same rules (nesting, closures,
evaluations, the two step streams) give each part's time on the GPU's clock. The events of a step
are read once its last event has completed (`Event.query`, no synchronisation inside the step),
at a later step end; a GPU more than MAX_PENDING steps behind is waited for (counted).

Also here, once CUDA is in use:
  - every host-device synchronisation, through `torch.cuda.set_sync_debug_mode("warn")`: torch
    warns at each synchronising call with the Python line that made it (+~4 µs a sync, measured
    on an H100); the warnings are counted per step and per line, never printed;
  - the FLOPs of one step by dtype (flops.py) and, at exit, this GPU's matmul peak per dtype
    measured in the same process (measure/peaks.py): model-FLOPs utilisation;
  - the memory reserved by torch's caching allocator at each step end;
  - during the profiler's window, torch's memory history: a snapshot file and its top
    allocation sites (`memory_sites`).
"""

from __future__ import annotations

import os
import pickle
import sys
import time
import warnings
from collections import deque
from typing import Any

from dlscope.contract.owncode import is_dlscope_code
from dlscope.injob.stepmachine import StepMachine

# machine event -> positions of its host-time arguments
TAPPED: dict[str, tuple[int, ...]] = {
    "loader_next": (0, 1),
    "loader_waited": (0, 1),
    "forward_begin": (0,),
    "forward_end": (0,),
    "backward_begin": (0,),
    "backward_end": (0,),
    "optimizer_begin": (0,),
    "optimizer_end": (0,),
    "closure_begin": (0,),
    "closure_end": (0,),
    "train_mode": (0,),
    "checkpoint_begin": (0,),
    "checkpoint_end": (0,),
    "optimizer_created": (),
}
MAX_PENDING = 64  # steps recorded and not yet read: past this the oldest is waited for
ROWS_PER_RECORD = 256  # GPU step rows per record written
FLOPS_AT_STEP = 3  # the step (counted from when CUDA is first seen) whose FLOPs are counted
SYNC_MESSAGE = "called a synchronizing CUDA operation"
SYNC_LINES = 20  # lines kept (the most syncs)
MEMORY_ENTRIES = 100_000  # torch's memory history, entries kept during a profiled window
MEMORY_SITES = 10
# frames not the script's: a sync or an allocation is charged to the first frame outside them
TORCH = os.sep + "torch" + os.sep


def script_frame(frames: list[tuple[str, int, str]]) -> tuple[str, int, str] | None:
    """The first (file, line, function), innermost first, that is neither torch's nor dlscope's
    nor the warnings module's."""
    for file, line, function in frames:
        if not is_dlscope_code(file) and TORCH not in file and not file.endswith("warnings.py"):
            return file, line, function
    return None


class GpuSteps:
    """The replayed machine's sink: one row per primary step (the optimizer's, or backward()'s in a
    loop with no torch optimizer, as the host machine's), [index, step µs, data µs, data from a
    loader (1) or the gap (0), forward µs, backward µs, optimizer µs, syncs, reserved MiB, excluded
    (1: a step whose FLOPs were counted)], written ROWS_PER_RECORD at a time."""

    def __init__(self, records: Any, host: StepMachine) -> None:
        self.records, self.host = records, host
        self.rows: list[list[float]] = []
        self.offset = {"optimizer": 0, "backward": 0}  # host steps counted before the replay began
        self.syncs = 0  # of the step being replayed
        self.reserved_mib = 0
        self.excluded = 0

    def write(self, record: dict[str, Any]) -> None:
        pass  # the replay's phases: the host machine's are the run's

    def write_step(self, i, src, start, end, data, data_source, forward, backward, optimizer, *_: Any) -> None:
        if src != "optimizer" and self.host.has_optimizer:  # the backward stream, while the replay has both
            return
        us = 1e6
        self.rows.append(
            [
                i + self.offset[src],
                round((end - start) * us),
                round(data * us),
                int(data_source == "loader"),
                round(forward * us),
                round(backward * us),
                round(optimizer * us),
                self.syncs,
                self.reserved_mib,
                self.excluded,
            ]
        )
        if len(self.rows) >= ROWS_PER_RECORD:
            self.flush()

    def flush(self) -> None:
        if self.rows:
            self.records.write({"k": "gpu_steps", "rows": self.rows})
            self.rows = []


class GpuClock:
    """Taps the host step machine's events (see the module's text). Off until CUDA is initialised
    (checked at each host step end until it is)."""

    def __init__(self, torch: Any, machine: StepMachine, records: Any) -> None:
        self.torch, self.cuda, self.machine, self.records = torch, torch.cuda, machine, records
        self.sink = GpuSteps(records, machine)
        self.replay_now = 0.0
        self.replay_tid = 0
        self.replay = StepMachine(
            self.sink, fast=False, clock=lambda: self.replay_now, thread_id=lambda: self.replay_tid
        )
        self.on = False
        self.depth = 0  # inside a tapped call: the machine's calls to itself are not events
        self.log: list[tuple[str, tuple, dict, int]] = []  # the step being recorded
        self.pending: deque = deque()  # (log, its last event, syncs, reserved MiB, excluded) of ended steps
        self.free: list[Any] = []  # completed events, reused
        self.stream: Any = None
        self.start_mark: Any = None  # recorded when a DataLoader call starts
        self.anchor: Any = None  # (event, host time): GPU times are host seconds from here
        self.steps_seen = 0
        self.waited = 0  # times the GPU was MAX_PENDING steps behind and was waited for
        self.syncs = 0
        self.sync_lines: dict[tuple, int] = {}
        self.showwarning: Any = None
        self.forked = False
        self.failed = False  # an error of the GPU clock's own: off for good (see `guarded`)
        self.reserved_peak = 0  # bytes: torch's peak counters are reset at each memory sample (hooks.py)
        self.flop_counter: Any = None
        self.flops: dict[str, Any] | None = None
        self.counting = False
        for name, stamps in TAPPED.items():
            setattr(machine, name, self._tap(name, stamps))

    # events ------------------------------------------------------------------------------------
    def _event(self) -> Any:
        event = self.free.pop() if self.free else self.cuda.Event(enable_timing=True)
        event.record(self.stream)
        return event

    def mark_start(self) -> None:
        """A DataLoader call starts: its GPU time, for the batch's (or the wait's) start."""
        if self.on and not self.depth:
            self.start_mark = self.guarded(self._event)

    def _logged(self, name: str, args: tuple, kwargs: dict, stamps: tuple[int, ...], loader: bool) -> Any:
        """The event for this call, logged with its arguments (its host times replaced by it)."""
        values = list(args)
        event = self._event() if stamps else None
        for position in stamps:
            values[position] = event
        if loader and self.start_mark is not None:
            values[0], self.start_mark = self.start_mark, None
        self.log.append((name, tuple(values), kwargs, self.machine.thread_id()))
        return event

    def startable(self) -> bool:
        return not self.forked and not self.failed and self.cuda.is_initialized()

    def guarded(self, work: Any, *args: Any) -> Any:
        """`work(*args)`; an error in it turns the GPU clock off for the rest of the run (written as
        a record; the run keeps the host's clock) and never reaches the script."""
        try:
            return work(*args)
        except Exception as error:
            self.fail(error)
            return None

    def fail(self, error: Exception) -> None:
        self.on, self.failed = False, True
        self.log, self.pending = [], deque()
        self.records.write({"k": "gpu_error", "error": f"{type(error).__name__}: {error}"})
        try:
            self.torch.cuda.set_sync_debug_mode(0)
        finally:
            if self.showwarning is not None:
                warnings.showwarning = self.showwarning

    def _tap(self, name: str, stamps: tuple[int, ...]) -> Any:
        original = getattr(StepMachine, name).__get__(self.machine)
        ends_steps = name in ("optimizer_end", "backward_end")  # the two events that can end a step
        loader = name in ("loader_next", "loader_waited")

        def tapped(*args: Any, **kwargs: Any) -> Any:
            if self.depth:
                return original(*args, **kwargs)
            if not self.on:
                if not ends_steps:
                    return original(*args, **kwargs)
                stream = "optimizer" if self.machine.has_optimizer else "backward"
                before = self.machine.counts[stream]
                result = original(*args, **kwargs)
                # at a primary step end, once CUDA is in use: the GPU's clock from the next step on
                if self.machine.counts[stream] != before and self.startable():
                    self.guarded(self.start)
                return result
            self.depth = 1
            try:
                event = self.guarded(self._logged, name, args, kwargs, stamps, loader)
                before = sum(self.machine.counts.values()) if ends_steps else 0
                result = original(*args, **kwargs)  # the script's own errors pass through as they are
                if ends_steps and sum(self.machine.counts.values()) != before and self.on:
                    self.guarded(self._step_ended, event)
                return result
            finally:
                self.depth = 0

        return tapped

    # step ends -----------------------------------------------------------------------------------
    def start(self) -> None:
        """CUDA is in use (seen at a host step end): events from now on."""
        torch = self.torch
        self.stream = self.cuda.current_stream()
        anchor = self.cuda.Event(enable_timing=True)
        anchor.record(self.stream)
        self.anchor = (anchor, time.time())
        host, replay = self.machine, self.replay
        self.sink.offset = dict(host.counts)  # the replay counts its steps from 0
        # where the host stands: its optimizer (and whether it stepped: one stream of steps, not
        # two), the thread that ends its steps
        replay.has_optimizer, replay.optimizer_stepped = host.has_optimizer, host.optimizer_stepped
        replay.step_thread = self.replay_tid = host.step_thread
        with warnings.catch_warnings():  # its own warning that the mode is a prototype
            warnings.simplefilter("ignore")
            torch.cuda.set_sync_debug_mode("warn")
        warnings.filterwarnings("always", message=SYNC_MESSAGE)  # each one, not once per line
        self.showwarning, warnings.showwarning = warnings.showwarning, self._warning
        self.on = True

    def after_fork(self) -> None:
        """A forked child (a DataLoader worker) cannot use CUDA: never on there."""
        self.on, self.forked = False, True
        self.log, self.pending = [], deque()

    def _warning(self, message: Any, category: Any, filename: str, lineno: int, file: Any = None, line: Any = None):
        if SYNC_MESSAGE not in str(message):
            return self.showwarning(message, category, filename, lineno, file, line)
        self.syncs += 1
        frames, frame = [], sys._getframe(1)
        while frame is not None and len(frames) < 32:
            frames.append((frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name))
            frame = frame.f_back
        script = script_frame(frames)
        key = (filename, lineno, *(script or ("", 0, "")))
        self.sync_lines[key] = self.sync_lines.get(key, 0) + 1
        return None

    def _step_ended(self, last: Any) -> None:
        self.steps_seen += 1
        excluded = int(self.counting)
        if self.counting:
            self._count_flops_end()
        elif self.steps_seen == FLOPS_AT_STEP:
            self._count_flops_begin()
        elif self.flop_counter is not None and self.flop_counter.stuck:  # under a mode of the script's
            self.flop_counter.release()
        reserved = self.cuda.memory_reserved() >> 20
        self.pending.append((self.log, last, self.syncs, reserved, excluded))
        self.log, self.syncs = [], 0
        self.stream = self.cuda.current_stream()
        pending = self.pending
        while pending and pending[0][1].query():
            self._replay(pending.popleft())
        if len(pending) > MAX_PENDING:
            self.waited += 1
            pending[0][1].synchronize()
            self._replay(pending.popleft())

    def _replay(self, step: tuple) -> None:
        log, _, syncs, reserved, excluded = step
        anchor, anchor_host = self.anchor
        sink = self.sink
        sink.syncs, sink.reserved_mib, sink.excluded = syncs, reserved, excluded
        replay = self.replay
        for name, values, kwargs, tid in log:
            args = list(values)
            for i in TAPPED[name]:
                args[i] = anchor_host + anchor.elapsed_time(values[i]) / 1e3
            if TAPPED[name]:
                self.replay_now = args[TAPPED[name][-1]]
            self.replay_tid = tid
            getattr(replay, name)(*args, **kwargs)
        # every event of the step has completed: each can be recorded again (a loader's start and
        # end can be one event)
        events = {id(values[i]): values[i] for name, values, _, _ in log for i in TAPPED[name]}
        self.free.extend(events.values())

    # FLOPs ---------------------------------------------------------------------------------------
    def _count_flops_begin(self) -> None:
        from dlscope.injob import flops

        self.flop_counter = flops.StepFlops()
        self.counting = self.flop_counter.start()

    def _count_flops_end(self) -> None:
        self.counting = False
        self.flops = self.flop_counter.stop()

    # exit ----------------------------------------------------------------------------------------
    def finish(self) -> None:
        """At exit: the steps still pending (the GPU is waited for once), the sync lines, the FLOPs
        and this GPU's matmul peaks."""
        if not self.on:
            return
        self.on = False
        from dlscope.measure import peaks  # imports torch: only at the exit of a CUDA job

        try:
            self.torch.cuda.set_sync_debug_mode(0)
            warnings.showwarning = self.showwarning
            if self.counting:
                self._count_flops_end()
            if self.pending:
                self.pending[-1][1].synchronize()
                while self.pending:
                    self._replay(self.pending.popleft())
            self.sink.flush()
            lines = sorted(self.sync_lines.items(), key=lambda kv: -kv[1])[:SYNC_LINES]
            self.records.write(
                {
                    "k": "gpu",
                    "device": self.cuda.get_device_name(),
                    "waited": self.waited,
                    "sync_lines": [
                        {
                            "file": k[0],
                            "line": k[1],
                            "script_file": k[2],
                            "script_line": k[3],
                            "function": k[4],
                            "count": n,
                        }
                        for k, n in lines
                    ],
                    "sync_lines_total": len(self.sync_lines),
                    "peak_reserved_bytes": max(self.reserved_peak, int(self.cuda.max_memory_reserved())),
                    "tf32": peaks.tf32_enabled("matmul"),
                }
            )
            if self.flops is not None:
                self.records.write({"k": "gpu_flops", **self.flops})
                if self.flops.get("by_dtype"):  # the peaks of the dtypes counted, measured now
                    device = self.torch.device("cuda", self.cuda.current_device())
                    measured = peaks.matmul_peaks(device, dtypes=tuple(self.flops["by_dtype"]))
                    self.records.write({"k": "gpu_peaks", "flops_per_s": measured})
        except Exception as error:  # the script's own exit must not fail for this
            self.records.write({"k": "gpu_error", "error": f"{type(error).__name__}: {error}"})


# memory history during a profiled window -------------------------------------------------------
def memory_history_start(torch: Any) -> bool:
    try:
        torch.cuda.memory._record_memory_history(max_entries=MEMORY_ENTRIES, stacks="python")
        return True
    except Exception:  # an older torch, or no CUDA: the window goes without it
        return False


def memory_history_stop(torch: Any, path: str) -> dict[str, Any]:
    """The snapshot of the window, written to `path` (pickle: pytorch.org/memory_viz opens it),
    and its top allocation sites; an error is said instead (the profiler's window is kept)."""
    try:
        snapshot = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
        with open(path, "wb") as f:
            pickle.dump(snapshot, f)
        return {"snapshot": path, "sites": memory_sites(snapshot)}
    except Exception as error:
        return {"snapshot": None, "sites": [], "error": f"{type(error).__name__}: {error}"}


def memory_sites(snapshot: dict[str, Any], top: int = MEMORY_SITES) -> list[dict[str, Any]]:
    """Allocations in the snapshot's trace grouped by the script's line that made them (the first
    frame outside torch and dlscope, else the innermost Python frame): count, bytes allocated in
    all, the largest; most bytes first."""
    sites: dict[tuple, dict[str, Any]] = {}
    for trace in snapshot.get("device_traces", []):
        for entry in trace:
            if entry.get("action") != "alloc":
                continue
            frames = [(f.get("filename", ""), f.get("line", 0), f.get("name", "")) for f in entry.get("frames", [])]
            python = [f for f in frames if f[0].endswith(".py")]
            where = script_frame(python) or (python[0] if python else ("?", 0, "?"))
            site = sites.setdefault(
                where, {"file": where[0], "line": where[1], "function": where[2], "count": 0, "bytes": 0, "largest": 0}
            )
            size = int(entry.get("size", 0))
            site["count"] += 1
            site["bytes"] += size
            site["largest"] = max(site["largest"], size)
    return sorted(sites.values(), key=lambda s: -s["bytes"])[:top]
