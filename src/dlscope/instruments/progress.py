"""A live progress bar for training: step, loss, accuracy and samples/s, one line per epoch."""

from __future__ import annotations

from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from dlscope.console import err_console
from dlscope.events import EpochResult, LogPoint, TrainingObserver, TrainResult
from dlscope.train import Trainer


class ProgressObserver(TrainingObserver):
    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.progress: Progress | None = None
        self.task: TaskID | None = None

    def on_train_begin(self, trainer: Trainer) -> None:
        if not self.enabled:
            return
        self.progress = Progress(
            TextColumn("[phase]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("loss [metric]{task.fields[loss]}[/] acc [metric]{task.fields[acc]}[/]"),
            TextColumn("[dim]{task.fields[speed]}"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=err_console,
            transient=True,
        )
        self.progress.start()
        self._new_task(trainer, trainer.start_epoch + 1)

    def _new_task(self, trainer: Trainer, epoch: int) -> None:
        assert self.progress is not None
        self.task = self.progress.add_task(
            f"epoch {epoch}/{trainer.config.epochs}", total=trainer.steps_per_epoch, loss="…", acc="…", speed=""
        )

    def on_step_end(self, trainer: Trainer, loss, batch_size: int) -> None:
        if self.progress is not None and self.task is not None:
            self.progress.advance(self.task)

    def on_log(self, trainer: Trainer, point: LogPoint) -> None:
        if self.progress is not None and self.task is not None:
            self.progress.update(
                self.task,
                loss=f"{point.loss:.4f}",
                acc=f"{point.accuracy:5.2f}%",
                speed=f"{point.samples_per_s:,.0f} samples/s",
            )

    def on_epoch_end(self, trainer: Trainer, epoch: EpochResult) -> None:
        if not self.enabled:
            return
        assert self.progress is not None and self.task is not None
        self.progress.remove_task(self.task)
        self.progress.console.print(
            f"[phase]epoch {epoch.epoch}/{trainer.config.epochs}[/]  "
            f"train loss [metric]{epoch.train_loss:.4f}[/] acc [metric]{epoch.train_acc:.2f}%[/]  "
            f"test loss [metric]{epoch.test_loss:.4f}[/] acc [good]{epoch.test_acc:.2f}%[/]  "
            f"[dim]{epoch.samples_per_s:,.0f} samples/s, {epoch.train_seconds:.1f}s + "
            f"eval {epoch.eval_seconds:.1f}s[/]"
        )
        if epoch.epoch < trainer.config.epochs and not trainer.should_stop:
            self._new_task(trainer, epoch.epoch + 1)

    def on_train_end(self, trainer: Trainer, result: TrainResult) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None
