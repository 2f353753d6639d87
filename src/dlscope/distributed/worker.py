"""One rank of the built-in job: `python -m dlscope.runner --rank PLAN_JSON`, started by torchrun.

Every rank trains its shard under DistributedDataParallel — its Trainer built and run by the train
step's own `fit`, as the job in one process is — and writes its folder (dlscope.rundir.rank_dir):
rank.json (its pid, threads, step times, samples) and trace.json (a Kineto trace of a few real steps, with torch's
distributedInfo). Local rank 0 of each node also writes TensorBoard, the torch checkpoint and
ranks/train.json, the train section the launcher records. On a torchrun restart
(TORCHELASTIC_RESTART_COUNT > 0) the ranks resume from the run's last checkpoint. Each rank keeps
its live file for the hang watchdog of the launcher (runner.child_main installs the agent before
torch loads, so its collectives are counted). The tests' fault hooks: dlscope.fit.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from dlscope.data.mnist import load_mnist
from dlscope.distributed.iorank import PID_FILE
from dlscope.events import EpochResult, TrainingObserver, TrainResult
from dlscope.fit import fit, resumed_config, starting_state, train_section
from dlscope.fsutil import atomic_write_bytes, json_text, make_dirs
from dlscope.plan import Plan
from dlscope.rundir import rank_dir, ranks_section, to_jsonable
from dlscope.train import DataParallel, Trainer, resolve_device

PROFILE_SCHEDULE = {"wait": 1, "warmup": 1, "active": 3}  # steps 2–4 of the run: past start-up, real steps


def profile_schedule(steps: int) -> dict[str, int]:
    """The ranks' profiler schedule; a run too short for it profiles every step it has (the
    analysis needs a trace from every rank)."""
    if steps >= sum(PROFILE_SCHEDULE.values()):
        return PROFILE_SCHEDULE
    return {"wait": 0, "warmup": 0, "active": max(steps, 1)}


class RankRecorder(TrainingObserver):
    """What one rank did: each step's time and samples, and a profiler trace of a few steps."""

    def __init__(self, directory: Path, info: dict[str, Any]) -> None:
        self.directory = directory
        self.info = info
        self.step_seconds: list[float] = []
        self.samples = 0
        self.last = 0.0
        self.profiler: torch.profiler.profile | None = None
        self.profiled_steps: list[int] = []  # their step times are left out of the statistics
        self.trace: str | None = None

    def on_train_begin(self, trainer: Trainer) -> None:
        activities = [torch.profiler.ProfilerActivity.CPU]
        if trainer.device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        schedule = profile_schedule(trainer.steps_per_epoch * (trainer.config.epochs - trainer.start_epoch))
        skipped = schedule["wait"] + schedule["warmup"]
        self.profiled_steps = list(range(skipped, skipped + schedule["active"]))
        self.profiler = torch.profiler.profile(
            activities=activities,
            schedule=torch.profiler.schedule(**schedule, repeat=1),
            on_trace_ready=self.export,
            record_shapes=True,  # the all-reduce message sizes (record_param_comms) against the gradients
        )
        self.profiler.start()
        self.last = time.perf_counter()

    def export(self, profiler: torch.profiler.profile) -> None:
        profiler.export_chrome_trace(str(self.directory / "trace.json"))
        self.trace = "trace.json"

    def on_epoch_begin(self, trainer: Trainer, epoch: int) -> None:
        self.last = time.perf_counter()  # the evaluation before it is no step's time

    def on_eval(self, trainer: Trainer, evaluation: Any) -> None:
        self.last = time.perf_counter()

    def on_step_end(self, trainer: Trainer, loss: torch.Tensor, batch_size: int) -> None:
        now = time.perf_counter()
        self.step_seconds.append(now - self.last)
        self.last = now
        self.samples += batch_size
        assert self.profiler is not None
        self.profiler.step()

    def on_train_end(self, trainer: Trainer, result: TrainResult) -> None:
        if self.profiler is not None:
            self.profiler.stop()  # a run shorter than the schedule leaves no trace
        train_seconds = sum(self.step_seconds)
        record = {
            **self.info,
            "status": "interrupted" if result.interrupted else "ok",
            "steps": len(self.step_seconds),
            "samples": self.samples,
            "train_seconds": train_seconds,
            "samples_per_s": self.samples / train_seconds if train_seconds else None,
            "profiled_steps": self.profiled_steps,
            "trace": self.trace,
            "step_seconds": self.step_seconds,
        }
        atomic_write_bytes(self.directory / "rank.json", json_text(record, indent=1).encode())


class EpochLine(TrainingObserver):
    """One line per epoch on stderr, which the launcher shows (the ranks have no progress bar)."""

    def on_epoch_end(self, trainer: Trainer, epoch: EpochResult) -> None:
        print(
            f"dlscope: epoch {epoch.epoch}/{trainer.config.epochs}: loss {epoch.train_loss:.4f}, "
            f"test {epoch.test_acc:.2f}%, {epoch.samples_per_s:,.0f} samples/s (all ranks)",
            file=sys.stderr,
            flush=True,
        )


def train_rank(plan: Plan) -> None:
    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    world_size, restart = int(os.environ["WORLD_SIZE"]), int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0))
    run = Path(plan.options.out or ".")
    with open(make_dirs(rank_dir(run, rank)) / PID_FILE, "a") as pids:  # first: the launcher ends it if left
        pids.write(f"{os.getpid()}\n")
    config = plan.config
    if resolve_device(config.device).type == "cuda":  # one GPU per rank, NCCL between them
        config.device = f"cuda:{local_rank}"
        torch.cuda.set_device(local_rank)
    backend = "nccl" if config.device.startswith("cuda") else "gloo"
    dist.init_process_group(backend)
    try:
        state = starting_state(plan.step_options, run, restart)
        if state is not None:
            # what the checkpoint computes, on this job's device and threads per rank
            saved = resumed_config(state, plan.step_options.train.epochs, config.threads)
            config = dataclasses.replace(saved, device=config.device)
        writer = local_rank == 0
        if writer and restart > 0:
            where = f"epoch {state['epoch']}" if state is not None else "the start: no checkpoint yet"
            print(f"dlscope: torchrun restart {restart}: the ranks resume from {where}", file=sys.stderr, flush=True)
        info = {
            "rank": rank,
            "local_rank": local_rank,
            "world_size": world_size,
            "node_rank": int(os.environ.get("GROUP_RANK", 0)),
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "restart": restart,
            "threads": config.threads,  # the launcher always sets it
            "backend": backend,
            "device": config.device,
        }
        observers = [RankRecorder(rank_dir(run, rank), info), *([EpochLine()] if writer else [])]
        data = load_mnist(plan.options.data_dir)
        parallel = DataParallel(rank, world_size, plan.step_options.dist.bucket_cap_mb)
        trainer, watched = fit(
            config, data, run, plan.options, plan.step_options, state, parallel, writer, restart, observers
        )
        if writer:
            section = to_jsonable(train_section(trainer, watched, state, run, plan.options.tensorboard))
            atomic_write_bytes(ranks_section(run), json_text(section, indent=1).encode())
    finally:
        dist.destroy_process_group()
