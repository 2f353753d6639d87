"""TensorBoard logging: graph, an image grid, train/test curves, LR, throughput and hparams.

TensorBoard's convention for curves that belong on one chart: one run per split, the same tag in
each. So `tensorboard/train` and `tensorboard/test` both hold `loss` and `accuracy`, and each
chart shows train and test together; `train` also holds `lr`, `throughput/samples_per_s`, the
image grid, the graph and the hparams. The test set is also evaluated before the first step
(step 0), so even a one-epoch run draws a test curve, not a lone point. Test points are one per
epoch: view them with smoothing 0, or TensorBoard's moving average shows values never measured.
The training points are means over every sample of the last `log_every` steps, not the last
batch's loss divided once more by the batch size as the lab's reference script did.
"""

from __future__ import annotations

import shutil
import sys
import types
import warnings
from pathlib import Path

from dlscope.data.mnist import MEAN, STD
from dlscope.events import EpochResult, LogPoint, TrainingObserver, TrainResult
from dlscope.train import Trainer, evaluate

# TensorBoard's writer imports all of TensorFlow when it is installed (the `tf` extra): ~8 s, and
# absl's log lines on stderr. Its "notf" marker module makes it use its own stub, which is all
# that writing local event files needs.
sys.modules.setdefault("tensorboard.compat.notf", types.ModuleType("tensorboard.compat.notf"))
from torch.utils.tensorboard import SummaryWriter  # noqa: E402


class TensorBoardObserver(TrainingObserver):
    def __init__(self, log_dir: str | Path, graph: bool = True, images: int = 64) -> None:
        self.log_dir = Path(log_dir)
        self.graph = graph
        self.images = images
        self.train: SummaryWriter | None = None
        self.test: SummaryWriter | None = None

    def on_train_begin(self, trainer: Trainer) -> None:
        fresh = trainer.result.resumed_from_epoch is None
        if fresh and self.log_dir.exists():
            shutil.rmtree(self.log_dir)  # a fresh run: old event files would mix curves
        self.train = SummaryWriter(str(self.log_dir / "train"))
        self.test = SummaryWriter(str(self.log_dir / "test"))
        x, _ = trainer.sample_batch(self.images)
        self.train.add_images("batch", (x * STD + MEAN).clamp(0, 1).cpu(), 0)
        if self.graph:
            was_training = trainer.model.training
            trainer.model.eval()  # trace without dropout randomness; inputs on the model's device
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                self.train.add_graph(trainer.model, x[:1])
            trainer.model.train(was_training)
        if fresh:  # where the test curve starts: the untrained model (eval mode changes no state)
            start = evaluate(trainer.model, trainer.test_images, trainer.test_labels, trainer.config.test_batch_size)
            self.test.add_scalar("loss", start["loss"], 0)
            self.test.add_scalar("accuracy", start["accuracy"], 0)
        self.train.flush()
        self.test.flush()

    def on_log(self, trainer: Trainer, point: LogPoint) -> None:
        assert self.train is not None
        w, step = self.train, point.step
        w.add_scalar("loss", point.loss, step)
        w.add_scalar("accuracy", point.accuracy, step)
        w.add_scalar("lr", point.lr, step)
        w.add_scalar("throughput/samples_per_s", point.samples_per_s, step)

    def on_epoch_end(self, trainer: Trainer, epoch: EpochResult) -> None:
        assert self.train is not None and self.test is not None
        step = trainer.global_step
        self.test.add_scalar("loss", epoch.test_loss, step)
        self.test.add_scalar("accuracy", epoch.test_acc, step)
        self.test.flush()
        self.train.flush()

    def on_train_end(self, trainer: Trainer, result: TrainResult) -> None:
        if self.train is None or self.test is None:
            return
        final = result.final
        if final is not None:
            hparams = {k: v if isinstance(v, int | float | str | bool) else str(v) for k, v in result.config.items()}
            metrics = {
                "hparam/test_accuracy": final.test_acc,
                "hparam/test_loss": final.test_loss,
                "hparam/train_seconds": result.train_seconds,
            }
            self.train.add_hparams(hparams, metrics, run_name=".", global_step=result.steps)
        self.train.close()
        self.test.close()
        self.train = self.test = None
