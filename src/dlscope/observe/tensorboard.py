"""TensorBoard logging: graph, an image grid, train/test curves, LR, throughput and hparams.

Tags (one chart per pair, train and test side by side):
    loss/train  loss/test  accuracy/train  accuracy/test  lr  throughput/samples_per_s
The training points are means over every sample of the last `log_every` steps, not the last
batch's loss divided once more by the batch size as the lab's reference script did.
"""

from __future__ import annotations

import os
import shutil
import warnings
from pathlib import Path

# TensorBoard imports TensorFlow when it is installed (the tf extra); TF's C++ start-up lines on
# stderr would break dlscope's one-line errors and clutter the terminal. A user's own setting wins.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from torch.utils.tensorboard import SummaryWriter

from dlscope.data.mnist import MEAN, STD
from dlscope.train import EpochResult, LogPoint, Observer, Trainer, TrainResult

SCALAR_TAGS = (
    "loss/train",
    "accuracy/train",
    "loss/test",
    "accuracy/test",
    "lr",
    "throughput/samples_per_s",
)


class TensorBoardObserver(Observer):
    def __init__(self, log_dir: str | Path, graph: bool = True, images: int = 64) -> None:
        self.log_dir = Path(log_dir)
        self.graph = graph
        self.images = images
        self.writer: SummaryWriter | None = None
        self.graph_logged = False

    def on_train_begin(self, trainer: Trainer) -> None:
        if trainer.result.resumed_from_epoch is None and self.log_dir.exists():
            shutil.rmtree(self.log_dir)  # a fresh run: old event files would mix curves
        self.writer = SummaryWriter(str(self.log_dir))
        x, _ = trainer.sample_batch(self.images)
        self.writer.add_images("train/batch", (x * STD + MEAN).clamp(0, 1).cpu(), 0)
        if self.graph:
            was_training = trainer.model.training
            trainer.model.eval()  # trace without dropout randomness; inputs on the model's device
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                self.writer.add_graph(trainer.model, x[:1])
            trainer.model.train(was_training)
            self.graph_logged = True
        self.writer.flush()

    def on_log(self, trainer: Trainer, point: LogPoint) -> None:
        assert self.writer is not None
        w, step = self.writer, point.step
        w.add_scalar("loss/train", point.loss, step)
        w.add_scalar("accuracy/train", point.accuracy, step)
        w.add_scalar("lr", point.lr, step)
        w.add_scalar("throughput/samples_per_s", point.samples_per_s, step)

    def on_epoch_end(self, trainer: Trainer, epoch: EpochResult) -> None:
        assert self.writer is not None
        step = trainer.global_step
        self.writer.add_scalar("loss/test", epoch.test_loss, step)
        self.writer.add_scalar("accuracy/test", epoch.test_acc, step)
        self.writer.flush()

    def on_train_end(self, trainer: Trainer, result: TrainResult) -> None:
        if self.writer is None:
            return
        final = result.final
        if final is not None:
            hparams = {k: v if isinstance(v, int | float | str | bool) else str(v) for k, v in result.config.items()}
            metrics = {
                "hparam/test_accuracy": final.test_acc,
                "hparam/test_loss": final.test_loss,
                "hparam/train_seconds": result.train_seconds,
            }
            self.writer.add_hparams(hparams, metrics, run_name=".", global_step=result.steps)
        self.writer.close()
        self.writer = None


def read_tags(log_dir: str | Path) -> dict[str, list]:
    """What the event files under `log_dir` hold, read back with TensorBoard's own reader."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "images": 0})
    acc.Reload()
    tags = acc.Tags()
    return {
        "scalars": {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in tags["scalars"]},
        "images": list(tags["images"]),
        "graph": bool(tags["graph"]),
    }
