"""Step: train to the target accuracy, with progress, TensorBoard and per-epoch checkpoints —
in this process, or in torchrun's ranks (each rank: dlscope.distributed.worker) — under the hang
watchdog (dlscope.observe.hang): every training process keeps its live file (the Trainer's step
ends, the phase markers), and the watchdog, here, captures them all when steps stop.

`fit` is the one way the built-in job builds and runs its Trainer, in this process and in a rank.

Test hooks (faults injected into the job), RANK:STEP in the environment (a job in one process is
rank 0), on the first attempt only: DLSCOPE_TEST_KILL_RANK makes that rank SIGKILL itself after
that global step; DLSCOPE_TEST_HANG_RANK makes it sleep there for an hour (a hung rank).
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dlscope.autotune import autotune
from dlscope.checkpoint import CheckpointObserver
from dlscope.distributed.launch import LOG, failure_line, run_torchrun, threads_per_rank, torchrun_command
from dlscope.errors import DlscopeError, HungJobError
from dlscope.events import EpochResult, LogPoint, TrainingObserver
from dlscope.fsutil import make_dirs
from dlscope.observe.hang import agent
from dlscope.observe.hang.watchdog import Watchdog
from dlscope.observe.progress import ProgressObserver
from dlscope.observe.tensorboard import TensorBoardObserver
from dlscope.options import RunOptions, StepOptions
from dlscope.phases import mark_begin, mark_end
from dlscope.plan import Plan
from dlscope.restore import in_memory, load_checkpoint, resume
from dlscope.rundir import PROCESSES, last_checkpoint, processes_dir, ranks_dir, ranks_section
from dlscope.steps.base import Context, Step
from dlscope.train import DataParallel, StopAtAccuracy, TrainConfig, Trainer, evaluate

if TYPE_CHECKING:
    from dlscope.data.mnist import MNIST
    from dlscope.distributed.dcp import DcpCheckpointObserver

KILL_HOOK = "DLSCOPE_TEST_KILL_RANK"
HANG_HOOK = "DLSCOPE_TEST_HANG_RANK"


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
        from dlscope.distributed.dcp import DcpCheckpointObserver

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
    """A test hook (the module's docstring): after global step `step`, die (KILL_HOOK) or hang (HANG_HOOK)."""

    def __init__(self, hook: str, step: int) -> None:
        self.hook, self.step = hook, step

    def on_step_end(self, trainer: Trainer, loss: Any, batch_size: int) -> None:
        if trainer.global_step == self.step:
            if self.hook == KILL_HOOK:
                os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(3600)


def fault_hooks(rank: int, restart: int) -> list[TrainingObserver]:
    hooks: list[TrainingObserver] = []
    for hook in (KILL_HOOK, HANG_HOOK):
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


def record_hang(ctx: Context, watchdog: Watchdog) -> None:
    """The hang section, when the watchdog captured the job (also when the training then failed)."""
    section = watchdog.section()
    if section is not None:
        ctx.run.record("hang", section)


def end_if_hung(ctx: Context, watchdog: Watchdog) -> None:
    """HungJobError when the watchdog ended the job (--on-hang end)."""
    if watchdog.ended:
        last = watchdog.captures[-1]
        raise HungJobError(
            f"the training hung: no step ended for {last['verdict']['idle_seconds']:.0f} s (threshold "
            f"{last['threshold_seconds']:.0f} s); every process captured in {last['file']}, then the job was "
            "ended (--on-hang end)",
            ctx.run.path,
        )


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


def run(ctx: Context) -> dict[str, Any]:
    if ctx.steps.dist.launched:
        return train_in_ranks(ctx)
    assert ctx.data is not None
    config = ctx.config
    resume_state = starting_state(ctx.steps, ctx.run.path)
    if resume_state is not None:
        config = ctx.config = resumed_config(resume_state, ctx.steps.train.epochs, ctx.config.threads)
    watchdog = Watchdog(ctx.run.fresh_sub(PROCESSES), ctx.run.path, ctx.steps.train.hang, ctx.say)
    agent.install(str(processes_dir(ctx.run.path)), follow_markers=True)
    try:
        with watchdog.in_this_process():
            trainer, watched = fit(config, ctx.data, ctx.run.path, ctx.options, ctx.steps, resume_state)
    finally:
        agent.uninstall()
        record_hang(ctx, watchdog)
    end_if_hung(ctx, watchdog)
    ctx.trainer = trainer
    section = train_section(trainer, watched, resume_state, ctx.run.path, ctx.options.tensorboard)
    if section["already_finished"]:
        # nothing left to train: the later steps verify and report the state as it was saved
        test = evaluate(trainer.model, trainer.test_images, trainer.test_labels, config.test_batch_size)
        trainer.last_predictions = test["predictions"]
        ctx.say(
            f"the checkpoint is already at epoch {resume_state['epoch']} of {config.epochs}: recorded test "
            f"accuracy {section['final_test_acc']:.2f}%; nothing to train (raise --epochs to train more)"
        )
    return section


def launch(ctx: Context) -> int:
    """Run the train step in the ranks, under the watchdog; torchrun's exit status."""
    threads = threads_per_rank(ctx.config.threads, ctx.steps.dist.nproc_per_node)
    config = dataclasses.replace(ctx.config, threads=threads)
    plan = Plan(ctx.run.results["run"]["command"], ["train"], config, ctx.options, ctx.steps, argv=[])
    watchdog = Watchdog(ctx.run.fresh_sub(PROCESSES), ctx.run.path, ctx.steps.train.hang, ctx.say)
    try:
        status = run_torchrun(plan, ctx.run.path, started=watchdog.start)
    finally:
        watchdog.stop()
        record_hang(ctx, watchdog)
    end_if_hung(ctx, watchdog)
    return status


def train_in_ranks(ctx: Context) -> dict[str, Any]:
    """The train step's section from the ranks' records; ctx.trainer holds the trained model."""
    from dlscope.data.mnist import load_mnist

    options = ctx.steps.dist
    with ctx.task(f"training in {options.world_size} ranks (torchrun)"):
        status = launch(ctx)
    ranks = ranks_dir(ctx.run.path)
    if status != 0:
        last = last_checkpoint(ctx.run.path, options.ckpt_format)
        cause = failure_line((ranks / LOG).read_text(errors="replace"), status)
        raise DlscopeError(
            f"{cause}; torchrun stopped the job (log: {ctx.run.rel(ranks / LOG)})"
            + (f"; the last checkpoint is intact: {last.relative_to(ctx.run.path)}" if last.exists() else ""),
            ctx.run.path,
        )
    section_file = ranks_section(ctx.run.path)
    if not section_file.is_file():
        raise DlscopeError(f"the ranks finished but no rank wrote {ctx.run.rel(section_file)}", ctx.run.path)
    section = json.loads(section_file.read_text())
    section["launch"] = {
        **dataclasses.asdict(options),
        "world_size": options.world_size,
        "threads_per_rank": threads_per_rank(ctx.config.threads, options.nproc_per_node),
        "command": "torchrun " + " ".join(torchrun_command(options, "PLAN_JSON")[3:]),
        "log": ctx.run.rel(ranks / LOG),
    }
    # the steps after this one see the trained model, read back from the ranks' last checkpoint
    # (with this process's threads: the later steps have the machine to themselves)
    config = ctx.config = dataclasses.replace(TrainConfig.from_dict(section["config"]), threads=ctx.config.threads)
    if ctx.data is None:
        ctx.data = load_mnist(ctx.options.data_dir)
    trainer = ctx.trainer = Trainer(config, ctx.data)
    resume(trainer, last_checkpoint(ctx.run.path, options.ckpt_format))
    trainer.last_predictions = evaluate(trainer.model, trainer.test_images, trainer.test_labels)["predictions"]
    return section


STEP = Step("train", run, needs=("dataset",), also=("hang",))
