"""Step: train to the target accuracy, with progress, TensorBoard and per-epoch checkpoints."""

from __future__ import annotations

from typing import Any

from dlscope.checkpoint import CheckpointObserver, load_checkpoint
from dlscope.observe.progress import ProgressObserver
from dlscope.observe.tensorboard import TensorBoardObserver
from dlscope.phases import mark_begin, mark_end
from dlscope.steps.base import Context, Step
from dlscope.train import EpochResult, LogPoint, Observer, StopAtAccuracy, TrainConfig, Trainer


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


def run(ctx: Context) -> dict[str, Any]:
    assert ctx.data is not None
    config = ctx.config
    resume_state = None
    resume = ctx.steps.train.resume
    if resume:
        resume_state = load_checkpoint(resume)
        config = ctx.config = TrainConfig.from_dict(resume_state["config"])
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
    return section


STEP = Step("train", run, needs=("dataset",))
