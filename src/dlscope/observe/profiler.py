"""torch.profiler over real training steps, and the top-10 operator table the lab asks for.

The reference profiled one forward pass of one sample before any warm-up, so the first call's
lazy initialisation dominated its table. Here the profiler follows a schedule — `wait` steps
ignored, `warmup` steps traced but discarded, `active` steps recorded — over whole training
steps (forward, backward, optimizer), on a copy of the model so training is left untouched.
"""

from __future__ import annotations

import contextlib
import copy
import csv
import io
import json
import os
import sys
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import nn
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, schedule

from dlscope.train import train_step

SORT_KEYS = {
    "self_cpu": "self_cpu_us",
    "cpu_total": "cpu_total_us",
    "self_device": "self_device_us",
    "device_total": "device_total_us",
    "calls": "calls",
    "flops": "flops",
}
STEP_PARTS = ("step/forward", "step/backward", "step/optimizer")


@dataclass
class OpRow:
    """One operator, summed over the active steps (times in µs)."""

    name: str
    calls: int
    self_cpu_us: float
    cpu_total_us: float
    self_device_us: float
    device_total_us: float
    self_cpu_memory_bytes: int
    flops: int

    @property
    def us_per_call(self) -> float:
        return self.cpu_total_us / self.calls if self.calls else 0.0


@dataclass
class TopOpsTable:
    """Operators from a profile, sortable; `top(n)` is the lab's top-10 table."""

    rows: list[OpRow]
    steps: int
    sort_by: str = "self_cpu"
    self_cpu_total_us: float = 0.0
    self_device_total_us: float = 0.0

    def sorted(self, sort_by: str | None = None) -> list[OpRow]:
        key = SORT_KEYS[sort_by or self.sort_by]
        return sorted(self.rows, key=lambda r: getattr(r, key), reverse=True)

    def top(self, n: int = 10, sort_by: str | None = None) -> list[OpRow]:
        return self.sorted(sort_by)[:n]

    def share(self, row: OpRow) -> float:
        return 100.0 * row.self_cpu_us / self.self_cpu_total_us if self.self_cpu_total_us else 0.0

    def to_records(self, n: int | None = None, sort_by: str | None = None) -> list[dict]:
        rows = self.sorted(sort_by) if n is None else self.top(n, sort_by)
        return [
            {**asdict(r), "self_cpu_pct": round(self.share(r), 2), "us_per_call": round(r.us_per_call, 3)} for r in rows
        ]

    def to_csv(self, n: int | None = None, sort_by: str | None = None) -> str:
        records = self.to_records(n, sort_by)
        out = io.StringIO()
        if records:
            writer = csv.DictWriter(out, fieldnames=list(records[0]))
            writer.writeheader()
            writer.writerows(records)
        return out.getvalue()


@dataclass
class ProfileResult:
    table: TopOpsTable
    step_parts_us: dict[str, float] = field(default_factory=dict)  # mean per step
    step_us: float = 0.0  # mean wall time of a profiled step
    batch_size: int = 0
    device: str = "cpu"
    schedule: dict[str, int] = field(default_factory=dict)
    trace_path: str | None = None


NATIVE_NOISE = ("USDT:", "profiler results will not include", "Memory block of unknown size")


@contextlib.contextmanager
def quiet_native_stderr(drop: tuple[str, ...] = NATIVE_NOISE) -> Iterator[None]:
    """Hide the profiler's C++ chatter (USDT markers, allocator notes); pass other lines on."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            for line in captured.read().decode(errors="replace").splitlines():
                if line.strip() and not any(d in line for d in drop):
                    print(line, file=sys.stderr)


def is_operator(name: str) -> bool:
    """Framework operators (aten::conv2d …), not annotations, step markers or autograd plumbing."""
    return "::" in name and not name.startswith(("autograd::", "ProfilerStep", "Optimizer."))


def table_from_events(events: Iterable, steps: int, sort_by: str = "self_cpu") -> TopOpsTable:
    events = list(events)
    rows = [
        OpRow(
            name=e.key,
            calls=int(e.count),
            self_cpu_us=float(e.self_cpu_time_total),
            cpu_total_us=float(e.cpu_time_total),
            self_device_us=float(getattr(e, "self_device_time_total", 0.0) or 0.0),
            device_total_us=float(getattr(e, "device_time_total", 0.0) or 0.0),
            self_cpu_memory_bytes=int(e.self_cpu_memory_usage or 0),
            flops=int(e.flops or 0),
        )
        for e in events
        # with CUDA activity the GPU kernels are events too; they are counted in their operator's device time
        if is_operator(e.key) and getattr(e, "device_type", DeviceType.CPU) == DeviceType.CPU
    ]
    return TopOpsTable(
        rows=rows,
        steps=steps,
        sort_by=sort_by,
        self_cpu_total_us=sum(r.self_cpu_us for r in rows),
        self_device_total_us=sum(r.self_device_us for r in rows),
    )


def clone_for_profiling(model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[nn.Module, torch.optim.Optimizer]:
    """An independent copy of model and optimizer state, so profiling never alters training."""
    model_copy = copy.deepcopy(model)
    optimizer_copy = type(optimizer)(model_copy.parameters(), **optimizer.defaults)
    # load_state_dict alone keeps the state tensors it is given (its .to() returns the same tensor),
    # so the copy's steps would move the real exp_avg, exp_avg_sq and step: hand it copies
    optimizer_copy.load_state_dict(copy.deepcopy(optimizer.state_dict()))
    return model_copy, optimizer_copy


def cycle(batches: Iterable) -> Iterator:
    while True:
        yield from batches


def profile_training(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    batches: Iterable,
    wait: int = 1,
    warmup: int = 2,
    active: int = 5,
    trace_path: str | Path | None = None,
    sort_by: str = "self_cpu",
) -> ProfileResult:
    """Profile `active` real training steps after `wait` + `warmup` steps of the given batches."""
    model, optimizer = clone_for_profiling(model, optimizer)
    model.train()
    device = next(model.parameters()).device
    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    total = wait + warmup + active
    source = cycle(batches)
    batch_size = 0
    with (
        torch.random.fork_rng(),  # dropout and shuffling draw here, not from the trainer's random stream
        quiet_native_stderr(),
        profile(
            activities=activities,
            schedule=schedule(wait=wait, warmup=warmup, active=active, repeat=1),
            record_shapes=True,
            profile_memory=True,
            with_flops=True,
        ) as prof,
    ):
        for _ in range(total):
            x, y = next(source)
            batch_size = len(y)
            train_step(model, optimizer, x, y)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            prof.step()
    events = prof.key_averages()
    table = table_from_events(events, active, sort_by)
    by_name = {e.key: e for e in events}
    parts = {p: by_name[p].cpu_time_total / active for p in STEP_PARTS if p in by_name}
    step_events = [e for e in events if e.key.startswith("ProfilerStep")]
    step_us = sum(e.cpu_time_total for e in step_events) / max(sum(e.count for e in step_events), 1)
    if trace_path is not None:
        trace_path = Path(trace_path)
        trace_path.parent.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(trace_path))
    return ProfileResult(
        table=table,
        step_parts_us=parts,
        step_us=step_us,
        batch_size=batch_size,
        device=str(device),
        schedule={"wait": wait, "warmup": warmup, "active": active},
        trace_path=str(trace_path) if trace_path else None,
    )


def write_tables(result: ProfileResult, directory: str | Path, n: int = 10) -> dict[str, str]:
    """The top-n table as CSV and JSON, and the full operator list as CSV."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    paths = {
        "top_csv": directory / f"top{n}_ops.csv",
        "top_json": directory / f"top{n}_ops.json",
        "all_csv": directory / "all_ops.csv",
    }
    paths["top_csv"].write_text(result.table.to_csv(n))
    paths["top_json"].write_text(json.dumps(result.table.to_records(n), indent=2))
    paths["all_csv"].write_text(result.table.to_csv())
    return {k: str(v) for k, v in paths.items()}
