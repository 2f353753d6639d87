"""The files through which an observed process talks to `dlscope run` — never the command's
stdout: their names and layouts. Written by the observed process with the stdlib only
(dlscope.injob.recorder); read back by `dlscope run` (dlscope.analysis.stepfile).

`<run dir>/<pid>.steps`: every finished training step as one fixed-size binary row (60 bytes;
a row is never more than 64), packed straight into a small shared memory map of the file's end
(STEPS_WINDOW bytes, moved along as it fills): no system call per step, and a SIGKILL loses
nothing written (the rows are in the page cache). Until the process exits (when the file is cut
to its last row) the file ends with room not yet written: zero rows, whose `start` is 0; a reader
stops at the first of them (StepFile does). The file starts with a header that describes the
rows, so any reader (numpy, pandas, pyarrow) needs no dlscope code to decode it:

    b"DLSSTEPS"  uint32 little-endian n  n bytes of JSON {"version", "row_bytes", "fields": [[name,
    numpy dtype], ...], "codes": {field: [value of code 0, 1, ...]}, "none_u4"}  rows...

    fields  i uint32 (index in its stream), tid uint32, start float64 (CLOCK_REALTIME s),
            seconds float32 (end − start), data / forward / backward / optimizer float32 (s),
            profiler_seconds float32 (dlscope's own time after the step, outside it),
            peak_rss_kib / peak_cuda_kib uint32 (0xFFFFFFFF: not measured),
            profiler_step uint32 (N of the profiler's ProfilerStep#N; 0xFFFFFFFF: none),
            backwards uint16 (backward() calls in the step, and autograd.grad calls not kept
            differentiable), forwards uint16 (forwards timed as the step's: its outermost module
            calls), src uint8 (optimizer|backward),
            data_source uint8 (gap|loader), profiled uint8 (none|wait|warmup|active),
            flags uint8 (reserved, 0)

    import numpy as np, pandas as pd
    from dlscope.analysis.stepfile import StepFile
    frame = pd.DataFrame(StepFile("runs/run-x/processes/1234.steps").read())

`<run dir>/<pid>.collectives`: every collective the process launched through torch.distributed's
Python API (DDP's bucket all-reduces included: dlscope.injob.hangagent), as two 24-byte rows, one
when it is launched and one when it completes on this rank, packed into a memory map of the file's
end as the step rows are (a SIGKILL loses nothing written; until the process exits the file ends
with zero rows, seq 0, which a reader skips). A header as the step file's (b"DLSCOLLS", its JSON
describes the rows), then:

    fields  seq uint32 (the process's n-th collective, from 1), step uint32 (steps ended before
            it was launched: the index of the step it belongs to), t float64 (CLOCK_REALTIME s),
            event uint8 (launch|done), op uint8 (all_reduce, broadcast, ...: codes["op"]),
            flags uint16, reserved uint32 (0)

`<run dir>/<pid>.jsonl`: everything else, one JSON line per record (a handful per process):
    process   pid, ppid, argv, rank, world_size, clocks (start), host (the machine's name),
              launcher (torchrun's view of the process, from its environment: run_id, node,
              local_rank, master, restart; null outside torchrun)
    B / E     a phase begins / ends: name, ts, file (checkpoints)
    E         of a checkpoint phase: files (every file written inside it)
    profile   trace, ops (key_averages rows), export_seconds
    rank      rank, world_size (when the process joined a process group: init_process_group)
    framework name: transformers, lightning or accelerate (when the process imported its trainer)
    observed  torch_attached, optimizer_steps, backward_steps, torch_optimizer, batches_elsewhere
              (batches drawn in a thread other than the steps': a prefetcher's) (at exit)
    optimizers  stepped [{class, steps, first}] per optimizer instance stepped at top level, in the
              order they first stepped (first: the index of its first step), returns
              (how often one stepped again after another), scaler_skipped (GradScaler steps that
              did not call the optimizer's) and scaler_skipped_steps (the first 100 of their step
              numbers); at exit, when one stepped
    updates   places [{file, line, function, steps}]: the no_grad blocks counted as the process's
              own parameter updates (no torch optimizer: injob/updates.py), at exit, when any was
    error     where, error (an observer that could not attach, step fields it did not know)
    end       clocks (at exit)
"""

from __future__ import annotations

import json
import os
import struct
import time
from pathlib import Path
from typing import Any

# --- the files under <run dir>/processes/, one of each per observed process -------------------------
RECORDS_SUFFIX = ".jsonl"  # <pid>.jsonl: the JSON records
STEPS_SUFFIX = ".steps"  # <pid>.steps: the step rows
COLLECTIVES_SUFFIX = ".collectives"  # <pid>.collectives: launch and completion of each collective
BATCHES_SUFFIX = ".batches"  # <pid>.batches: the batch x-ray (dlscope.contract.batchfile)
PROFILE_PREFIX = "profile-"  # profile-<pid>.json: a profiler window's Chrome trace
STACKS_PREFIX = "stacks-"  # stacks-<pid>.txt: every thread's stack, dumped on the hang agent's signal
# the doctor's calibration writes its records to a scratch directory of this prefix: dlscope's own
# files, never the job's (a syscall trace names them so)
SCRATCH_PREFIX = "dlscope-calibrate-"
# begin/end records written per phase name: past them a phase is counted, not written (one that
# recurs every step, as an RL agent's rollouts in eval mode do, stays bounded at any length)
PHASE_RECORDS = 500
# --- written beside them by the supervising process (supervise/cpushare.py), read by analysis/machine.py ---
# {"cores": [...], "columns": MACHINE_COLUMNS, "rows": [...]}: one row a poll. JSON, but not named
# .json: tools given this folder of profiler traces (HTA, TensorBoard) take every .json in it for
# one, and HTA files one without a rank as rank 0's, in place of rank 0's own trace
MACHINE_FILE = "machine.polls"
# a row: its end (CLOCK_REALTIME s) and length, the CPU seconds the job's cores were busy, the job's
# processes ran, dlscope's own ran, the job's threads ran and waited for a core (run-queue delay),
# and how many of the job's threads ran at all
MACHINE_COLUMNS = ("end", "seconds", "busy_s", "job_s", "dlscope_s", "ran_s", "waited_s", "threads_ran")


def record_fields(record: dict[str, Any]) -> dict[str, Any]:
    """A JSON record's fields, its kind ("k") left out."""
    return {key: value for key, value in record.items() if key != "k"}


def records_path(directory: str | Path, pid: int) -> str:
    return os.path.join(directory, f"{pid}{RECORDS_SUFFIX}")


def steps_path(directory: str | Path, pid: int) -> str:
    return os.path.join(directory, f"{pid}{STEPS_SUFFIX}")


def batches_path(directory: str | Path, pid: int) -> str:
    return os.path.join(directory, f"{pid}{BATCHES_SUFFIX}")


def profile_trace_path(directory: str | Path, pid: int, delivered: int) -> str:
    """The profiler's trace of a process's window after `delivered` others: profile-<pid>.json,
    then profile-<pid>-2.json, ..."""
    return os.path.join(
        directory, f"{PROFILE_PREFIX}{pid}.json" if not delivered else f"{PROFILE_PREFIX}{pid}-{delivered + 1}.json"
    )


def collectives_path(directory: str | Path, pid: int) -> str:
    return os.path.join(directory, f"{pid}{COLLECTIVES_SUFFIX}")


def stacks_path(directory: str | Path, pid: int) -> str:
    return os.path.join(directory, f"{STACKS_PREFIX}{pid}.txt")


def per_process(directory: Path, suffix: str) -> dict[int, Path]:
    """pid → its file of this kind in a processes/ directory (other files beside them are not)."""
    return {int(p.stem): p for p in sorted(directory.glob(f"*{suffix}")) if p.stem.isdigit()}


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
    ("forwards", "H", "<u2"),
    ("src", "B", "u1"),
    ("data_source", "B", "u1"),
    ("profiled", "B", "u1"),
    ("flags", "B", "u1"),
)
STEP_STRUCT = struct.Struct("<" + "".join(code for _, code, _ in STEP_ROW))
ROW_BYTES = STEP_STRUCT.size
STEPS_WINDOW = 1 << 16  # bytes of the step file mapped at a time (~1,100 rows; its pages count in the RSS)
CODES: dict[str, tuple[str | None, ...]] = {
    "src": ("optimizer", "backward"),
    "data_source": ("gap", "loader"),
    "profiled": (None, "wait", "warmup", "active"),
}


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
    return _header(STEPS_MAGIC, description)


def _header(magic: bytes, description: dict) -> bytes:
    text = json.dumps(description).encode()
    text += b" " * (-(len(magic) + 4 + len(text)) % 8)  # rows start 8-byte aligned
    return magic + struct.pack("<I", len(text)) + text


COLLECTIVES_MAGIC = b"DLSCOLLS"
COLLECTIVES_VERSION = 1
# the collectives of torch.distributed's Python API that the hang agent wraps; a row's op is the
# index of its name here (append only: a file keeps the list it was written with in its header)
COLLECTIVE_OPS = (
    "all_reduce",
    "broadcast",
    "barrier",
    "monitored_barrier",
    "all_gather",
    "all_gather_into_tensor",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "reduce",
    "gather",
    "scatter",
    "all_to_all",
    "all_to_all_single",
    "send",
    "recv",
)
COLLECTIVE_EVENTS = ("launch", "done")
COLLECTIVE_ROW = (
    ("seq", "I", "<u4"),
    ("step", "I", "<u4"),
    ("t", "d", "<f8"),
    ("event", "B", "u1"),
    ("op", "B", "u1"),
    ("flags", "H", "<u2"),
    ("reserved", "I", "<u4"),
)
COLLECTIVE_STRUCT = struct.Struct("<" + "".join(code for _, code, _ in COLLECTIVE_ROW))


def collectives_header() -> bytes:
    description = {
        "version": COLLECTIVES_VERSION,
        "row_bytes": COLLECTIVE_STRUCT.size,
        "fields": [[name, dtype] for name, _, dtype in COLLECTIVE_ROW],
        "codes": {"event": COLLECTIVE_EVENTS, "op": COLLECTIVE_OPS},
    }
    return _header(COLLECTIVES_MAGIC, description)
