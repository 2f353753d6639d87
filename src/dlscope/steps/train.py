"""Step: train to the target accuracy, with progress, TensorBoard and per-epoch checkpoints."""

from __future__ import annotations

import dataclasses
from typing import Any

from dlscope.checkpoint import CheckpointObserver, load_checkpoint
from dlscope.observe.progress import ProgressObserver
from dlscope.observe.tensorboard import TensorBoardObserver
from dlscope.phases import mark_begin, mark_end
from dlscope.steps.base import Context, Step
from dlscope.train import EpochResult, LogPoint, Observer, StopAtAccuracy, TrainConfig, Trainer, evaluate


class PhaseMarker(Observer):
    """Phase markers per epoch: train-epoch-N, then evaluate-epoch-N (see dlscope.phases)."""

    def on_epoch_begin(self, trainer: Trainer, epoch: int) -> None:
        mark_begin(f"train-epoch-{epoch}")

    def on_evaluate_begin(self, trainer: Trainer, epoch: int) -> None:
        mark_end(f"train-epoch-{epoch}")
        mark_begin(f"evaluate-epoch-{epoch}")

    def on_epoch_end(self, trainer: Trainer, epoch: EpochResult) -> None:
        mark_end(f"evaluate-epoch-{epoch.epoch}")


class LogRecorder(Observer):
    """Keeps the logged training points for results.json (the report's curves)."""

    def __init__(self) -> None:
        self.points: list[dict[str, float]] = []

    def on_log(self, trainer: Trainer, point: LogPoint) -> None:
        self.points.append(vars(point).copy())


def resumed_config(ctx: Context, state: dict[str, Any]) -> TrainConfig:
    """The checkpoint's config (what the run computes), with --epochs as the new total when given."""
    config = TrainConfig.from_dict(state["config"])
    if ctx.steps.train.epochs is not None:
        config = dataclasses.replace(config, epochs=ctx.steps.train.epochs)
    return config


def run(ctx: Context) -> dict[str, Any]:
    assert ctx.data is not None
    config = ctx.config
    resume_state = None
    resume = ctx.steps.train.resume
    if resume:
        resume_state = load_checkpoint(resume)
        config = ctx.config = resumed_config(ctx, resume_state)
    recorder = LogRecorder()
    # PhaseMarker first: its evaluate phase ends before other observers write checkpoints and logs
    observers: list[Observer] = [PhaseMarker(), recorder, ProgressObserver(ctx.options.progress)]
    if ctx.options.tensorboard:
        observers.append(TensorBoardObserver(ctx.run.sub("tensorboard")))
    if config.target_acc is not None:
        observers.append(StopAtAccuracy(config.target_acc))
    checkpoints = CheckpointObserver(ctx.run.sub("checkpoints"))
    observers.append(checkpoints)
    trainer = ctx.trainer = Trainer(config, ctx.data, observers)
    if resume_state is not None:
        trainer.load_state_dict(resume_state)
    result = trainer.fit()
    section = result.to_dict()
    section["log"] = recorder.points
    section["steps_per_epoch"] = trainer.steps_per_epoch
    section["peak_lr"] = config.peak_lr
    section["train_samples"] = trainer.batches.num_samples
    section["test_samples"] = len(trainer.test_labels)
    section["checkpoint"] = ctx.run.rel(checkpoints.path)
    section["tensorboard"] = ctx.run.rel(ctx.run.path / "tensorboard") if ctx.options.tensorboard else None
    section["schedule_restarted"] = resume_state is not None and trainer.restarts_schedule(resume_state)
    section["already_finished"] = resume_state is not None and trainer.global_step == resume_state["global_step"]
    if section["already_finished"]:
        # nothing left to train: the later steps verify and report the state as it was saved
        test = evaluate(trainer.model, trainer.test_images, trainer.test_labels, config.test_batch_size)
        trainer.last_predictions = test["predictions"]
        ctx.say(
            f"the checkpoint is already at epoch {resume_state['epoch']} of {config.epochs}: recorded test "
            f"accuracy {section['final_test_acc']:.2f}%; nothing to train (raise --epochs to train more)"
        )
    return section


STEP = Step("train", run, needs=("dataset",))
