"""The training engine on real MNIST subsets: accuracy, observers, early stop, exact resume."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest
import torch

from dlscope.checkpoint import CheckpointObserver
from dlscope.errors import ConfigError
from dlscope.events import EpochResult, LogPoint, TrainingObserver
from dlscope.instruments.tensorboard import TensorBoardObserver
from dlscope.restore import load_checkpoint
from dlscope.train import StopAtAccuracy, TrainConfig, Trainer

SMALL = dict(train_subset=6000, test_subset=2000, batch_size=64, log_every=20)
RUN_TAGS = {"train": ("loss", "accuracy", "lr", "throughput/samples_per_s"), "test": ("loss", "accuracy")}


def read_tags(log_dir) -> dict[str, dict]:
    """What each run's event files under `log_dir` hold, read back with TensorBoard's own reader."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    runs = {}
    for run in sorted(p for p in log_dir.iterdir() if p.is_dir()):
        acc = EventAccumulator(str(run), size_guidance={"scalars": 0, "images": 0})
        acc.Reload()
        tags = acc.Tags()
        runs[run.name] = {
            "scalars": {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in tags["scalars"]},
            "images": list(tags["images"]),
            "graph": bool(tags["graph"]),
        }
    return runs


class Recorder(TrainingObserver):
    def __init__(self) -> None:
        self.calls: list[str] = []
        self.points: list[LogPoint] = []

    def on_train_begin(self, trainer):
        self.calls.append("begin")

    def on_log(self, trainer, point):
        self.points.append(point)

    def on_epoch_end(self, trainer, epoch):
        self.calls.append(f"epoch{epoch.epoch}")

    def on_train_end(self, trainer, result):
        self.calls.append("end")


@pytest.fixture(scope="module")
def one_epoch(mnist, tmp_path_factory):
    """One epoch of SMALL, observed by a Recorder and a TensorBoardObserver: (result, recorder, tb dir)."""
    recorder, tensorboard = Recorder(), tmp_path_factory.mktemp("tb")
    torch.set_num_threads(2)  # as tests/conftest.py's per-test pin, which a module fixture runs before
    result = Trainer(TrainConfig(epochs=1, **SMALL), mnist, [recorder, TensorBoardObserver(tensorboard)]).fit()
    return result, recorder, tensorboard


def test_short_training_reaches_95_percent(one_epoch):
    result, recorder, _ = one_epoch
    assert result.final.test_acc >= 95.0, result.final
    assert recorder.calls == ["begin", "epoch1", "end"]
    assert result.steps == 6000 // 64 + 1
    # windows cover every step: 94 steps, logged every 20 → 4 points of 20 × 64 samples
    assert [p.samples for p in recorder.points] == [1280] * 4
    assert all(0 < p.loss < 3 for p in recorder.points)
    assert recorder.points[-1].loss < recorder.points[0].loss


def test_window_means_are_sample_weighted(mnist):
    """The logged loss is the mean over every sample of the window (not last batch / batch size)."""
    recorder = Recorder()
    trainer = Trainer(
        TrainConfig(epochs=1, train_subset=300, test_subset=100, batch_size=100, log_every=3), mnist, [recorder]
    )
    losses: list[float] = []

    class Capture(TrainingObserver):
        def on_step_end(self, trainer, loss, batch_size):
            losses.append(loss.item())

    trainer.observers.append(Capture())
    trainer.fit()
    assert len(recorder.points) == 1
    assert recorder.points[0].loss == pytest.approx(sum(losses) / 3, rel=1e-6)


def test_stop_at_accuracy_ends_training_early(mnist):
    # a quarter of SMALL's samples: ~88% after the first epoch, far past the target
    config = TrainConfig(epochs=3, target_acc=80.0, **{**SMALL, "train_subset": 1500})
    result = Trainer(config, mnist, [StopAtAccuracy(config.target_acc)]).fit()
    assert result.target_reached_epoch == 1 and len(result.epochs) == 1 and result.stopped_early
    assert result.time_to_target_s > 0


@pytest.mark.parametrize(
    "bad",
    [
        dict(epochs=0),
        dict(batch_size=0),
        dict(optimizer="lbfgs"),
        dict(lr=-1.0),
        dict(target_acc=150.0),
        dict(device="tpu"),
        dict(model="vgg"),
    ],
)
def test_bad_config_is_rejected(bad):
    with pytest.raises(ConfigError):
        TrainConfig(**bad)


def test_tensorboard_puts_train_and_test_on_one_chart_per_metric(one_epoch):
    runs = read_tags(one_epoch[2])
    assert runs["train"]["graph"] and "batch" in runs["train"]["images"]
    for run, tags in RUN_TAGS.items():
        assert set(tags) <= set(runs[run]["scalars"]), run
    # one chart per metric: TensorBoard draws the same tag of both runs together
    assert {"loss", "accuracy"} <= set(runs["train"]["scalars"]) & set(runs["test"]["scalars"])
    assert len(runs["train"]["scalars"]["loss"]) == 4
    # a one-epoch run still draws a test curve: the untrained model at step 0, then the epoch's end
    (start, chance), (end, acc) = runs["test"]["scalars"]["accuracy"]
    assert (start, end) == (0, 94)
    assert chance < 30 and 90 < acc <= 100


class StopAfterEpoch(TrainingObserver):
    def __init__(self, epoch: int) -> None:
        self.epoch = epoch

    def on_epoch_end(self, trainer, epoch: EpochResult):
        if epoch.epoch == self.epoch:
            trainer.should_stop = True


@pytest.mark.parametrize("model", ["mlp", "cnn"])  # mlp has dropout: the RNG state must resume too
def test_resume_is_bit_identical(mnist, tmp_path, model):
    # 6 steps an epoch: bit-identity holds at any size (the RNG, the shuffle, the optimizer's moments)
    config = TrainConfig(model=model, epochs=2, train_subset=600, test_subset=200, batch_size=100)
    straight = Trainer(config, mnist)
    straight.fit()

    first = Trainer(config, mnist, [CheckpointObserver(tmp_path), StopAfterEpoch(1)])
    first.fit()
    state = load_checkpoint(tmp_path / "last.pt")
    assert state["epoch"] == 1
    torch.manual_seed(12345)  # scramble the global RNG: resume must restore it
    resumed = Trainer(config, mnist)
    resumed.load_state_dict(state)
    result = resumed.fit()
    assert [e.epoch for e in result.epochs] == [1, 2] and result.resumed_from_epoch == 1
    for (name, a), (_, b) in zip(straight.model.state_dict().items(), resumed.model.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    assert result.final.test_acc == straight.result.final.test_acc


@pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None, reason="TensorFlow is not installed here")
def test_tensorboard_logging_never_imports_tensorflow():
    probe = "import sys, dlscope.instruments.tensorboard; print('tensorflow' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"
