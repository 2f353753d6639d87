"""The built-in job's one way to build and run its Trainer — its observers (phase markers, the
logged points, progress, TensorBoard, checkpoints), the live file's heartbeat, the tests' fault
hooks, its tuner, the state it resumes from — in dlscope's own process (stages/train.py) and in
each torchrun rank (distributed/worker.py) alike.

Test hooks (faults injected into the job), RANK:STEP in the environment (a job in one process is
rank 0), on the first attempt only: KILL_RANK_ENV (dlscope.contract.env) makes that rank SIGKILL
itself after that global step; HANG_RANK_ENV makes it sleep there for an hour (a hung rank).
"""

from __future__ import annotations

import dataclasses
import os
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dlscope.autotune import autotune
from dlscope.checkpoint import CheckpointObserver
from dlscope.contract.env import HANG_RANK_ENV, KILL_RANK_ENV
from dlscope.events import EpochResult, LogPoint, TrainingObserver
from dlscope.fsutil import make_dirs
from dlscope.injob import hangagent as agent
from dlscope.instruments.progress import ProgressObserver
from dlscope.instruments.tensorboard import TensorBoardObserver
from dlscope.options import RunOptions, StepOptions
from dlscope.phases import mark_begin, mark_end
from dlscope.restore import in_memory, load_checkpoint
from dlscope.rundir import last_checkpoint
from dlscope.train import DataParallel, StopAtAccuracy, TrainConfig, Trainer

if TYPE_CHECKING:
    from dlscope.data.mnist import MNIST
    from dlscope.dcp import DcpCheckpointObserver


class PhaseMarker(TrainingObserver):
    """Phase markers per epoch: train-epoch-N, then evaluate-epoch-N (see dlscope.phases)."""

    def on_epoch_begin(self, trainer: Trainer, epoch: int) -> None:
        mark_begin(f"train-epoch-{epoch}")

    def on_evaluate_begin(self, trainer: Trainer, epoch: int) -> None:
        mark_end(f"train-epoch-{epoch}")
        mark_begin(f"evaluate-epoch-{epoch}")

    def on_epoch_end(self, trainer: Trainer, epoch: EpochResult) -> None:
        mark_end(f"evaluate-epoch-{epoch.epoch}")


class LogRecorder(TrainingObserver):
    """Keeps the logged training points for results.json (the report's curves)."""

    def __init__(self) -> None:
        self.points: list[dict[str, float]] = []

    def on_log(self, trainer: Trainer, point: LogPoint) -> None:
        self.points.append(vars(point).copy())


def resumed_config(state: dict[str, Any], epochs: int | None, threads: int | None) -> TrainConfig:
    """The checkpoint's config (what the run computes), with --epochs as the new total when given,
    and this command's threads (a checkpoint of 2 ranks × 1 thread may resume on 1 × 2)."""
    config = dataclasses.replace(TrainConfig.from_dict(state["config"]), threads=threads)
    if epochs is not None:
        config = dataclasses.replace(config, epochs=epochs)
    return config


@dataclass
class Watchers:
    """What watches a training run, and the two whose findings go into the section."""

    observers: list[TrainingObserver]
    recorder: LogRecorder
    checkpoints: CheckpointObserver | DcpCheckpointObserver


def watchers(config: TrainConfig, run_path: Path, options: RunOptions, ckpt_format: str, writer: bool) -> Watchers:
    """The observers of one training process. Only the `writer` (the only process, or rank 0)
    shows progress and writes TensorBoard and torch checkpoints; a DCP save needs every rank."""
    recorder = LogRecorder()
    # PhaseMarker first (every rank: --trace-io shows each one's epochs): its evaluate phase ends
    # before other observers write checkpoints and logs
    observers: list[TrainingObserver] = [PhaseMarker()]
    if writer:
        observers += [recorder, ProgressObserver(options.progress)]
    if writer and options.tensorboard:
        observers.append(TensorBoardObserver(make_dirs(run_path / "tensorboard")))
    if config.target_acc is not None:
        observers.append(StopAtAccuracy(config.target_acc))
    if ckpt_format == "dcp":
        from dlscope.dcp import DcpCheckpointObserver

        checkpoints: CheckpointObserver | DcpCheckpointObserver = DcpCheckpointObserver(
            make_dirs(run_path / "checkpoints")
        )
        observers.append(checkpoints)
    else:
        checkpoints = CheckpointObserver(make_dirs(run_path / "checkpoints"))
        if writer:
            observers.append(checkpoints)
    return Watchers(observers, recorder, checkpoints)


class Heartbeat(TrainingObserver):
    """Each step end into this process's live file (the hang agent's, as in a `dlscope run`
    process): one pack_into; nothing when no agent is installed."""

    def on_step_end(self, trainer: Trainer, loss: Any, batch_size: int) -> None:
        agent.step_ended(trainer.global_step, time.time())


class FaultHook(TrainingObserver):
    """A test hook (the module's docstring): after global step `step`, die (KILL_RANK_ENV) or hang (HANG_RANK_ENV)."""

    def __init__(self, hook: str, step: int) -> None:
        self.hook, self.step = hook, step

    def on_step_end(self, trainer: Trainer, loss: Any, batch_size: int) -> None:
        if trainer.global_step == self.step:
            if self.hook == KILL_RANK_ENV:
                os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(3600)


def fault_hooks(rank: int, restart: int) -> list[TrainingObserver]:
    hooks: list[TrainingObserver] = []
    for hook in (KILL_RANK_ENV, HANG_RANK_ENV):
        where, _, step = os.environ.get(hook, "").partition(":")
        if where and restart == 0 and int(where) == rank:
            hooks.append(FaultHook(hook, int(step)))
    return hooks


def fit(
    config: TrainConfig,
    data: MNIST,
    run_path: Path,
    options: RunOptions,
    steps: StepOptions,
    state: dict[str, Any] | None,
    parallel: DataParallel | None = None,
    writer: bool = True,
    restart: int = 0,
    observers: Sequence[TrainingObserver] = (),
) -> tuple[Trainer, Watchers]:
    """Build the Trainer of the built-in job — its watchers, the caller's `observers`, the live
    file's heartbeat, the tests' fault hooks, its tuner, the `state` it resumes from — and train."""
    watched = watchers(config, run_path, options, steps.dist.ckpt_format, writer=writer)
    rank = parallel.rank if parallel else 0
    everyone = [*watched.observers, *observers, Heartbeat(), *fault_hooks(rank, restart)]
    tuner = autotune if config.autotune else None
    trainer = Trainer(config, data, everyone, parallel, tuner)
    if state is not None:
        trainer.load_state_dict(in_memory(state, trainer.model, trainer.optimizer))
    trainer.fit()
    return trainer, watched


def starting_state(steps: StepOptions, run_path: Path, restart: int = 0) -> dict[str, Any] | None:
    """What the training resumes from: after a torchrun restart, the run's own last checkpoint
    (when one was written); else --resume's; else nothing."""
    if restart > 0:
        last = last_checkpoint(run_path, steps.dist.ckpt_format)
        if last.exists():
            return load_checkpoint(last)
    return load_checkpoint(steps.train.resume) if steps.train.resume else None


def train_section(
    trainer: Trainer, watched: Watchers, resume_state: dict[str, Any] | None, run_path: Path, tensorboard: bool
) -> dict[str, Any]:
    config = trainer.config
    section = trainer.result.to_dict()
    section["log"] = watched.recorder.points
    section["steps_per_epoch"] = trainer.steps_per_epoch
    section["peak_lr"] = config.peak_lr
    section["train_samples"] = trainer.batches.num_samples
    section["test_samples"] = len(trainer.test_labels)
    section["checkpoint"] = str(watched.checkpoints.path.relative_to(run_path))
    section["tensorboard"] = "tensorboard" if tensorboard else None
    section["schedule_restarted"] = resume_state is not None and trainer.restarts_schedule(resume_state)
    section["already_finished"] = resume_state is not None and trainer.global_step == resume_state["global_step"]
    return section
