"""torch.profiler over real training steps, and the top-10 operator table the lab asks for.

The reference profiled one forward pass of one sample before any warm-up, so the first call's
lazy initialisation dominated its table. Here the profiler follows a schedule — `wait` steps
ignored, `warmup` steps traced but discarded, `active` steps recorded — over whole training
steps (forward, backward, optimizer), on a copy of the model so training is left untouched.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile, schedule

from dlscope.analysis.optable import TopOpsTable, table_from_events
from dlscope.measure.native_stderr import quiet_native_stderr
from dlscope.train import train_step

STEP_PARTS = ("step/forward", "step/backward", "step/optimizer")


@dataclass
class ProfileResult:
    table: TopOpsTable
    step_parts_us: dict[str, float] = field(default_factory=dict)  # mean per step
    step_us: float = 0.0  # mean wall time of a profiled step
    batch_size: int = 0
    device: str = "cpu"
    schedule: dict[str, int] = field(default_factory=dict)
    trace_path: str | None = None


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
