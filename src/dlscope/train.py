"""The training engine. The loop stays plain; everything that watches it is an `Observer`.

for epoch:
    for x, y in batches:
        loss, logits = train_step(model, optimizer, x, y, scheduler)   # forward, backward, step
        observers.on_step_end(...)                             # every N steps: on_log
    test = evaluate(model, test set)                           # the full test set
    observers.on_epoch_end(...)                                # checkpoint, early stop, ...
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from dlscope.config import DEFAULT_LR, LOADERS, OPTIMIZERS, RECIPES, SCHEDULES, TrainConfig  # noqa: F401 (re-exported)
from dlscope.data.loaders import ResidentBatches, make_batches, normalise
from dlscope.data.mnist import MNIST
from dlscope.errors import ConfigError
from dlscope.models import build_model


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError("device cuda requested but torch sees no CUDA GPU")
    if name == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise ConfigError("device mps requested but it is not available")
    return torch.device(name)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def rng_state() -> dict[str, Any]:
    state = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def make_optimizer(config: TrainConfig, model: nn.Module) -> torch.optim.Optimizer:
    params, lr, wd = model.parameters(), config.peak_lr, config.weight_decay
    if config.optimizer == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=wd)
    if config.optimizer == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=config.momentum, weight_decay=wd, nesterov=True)
    return torch.optim.Adadelta(params, lr=lr, weight_decay=wd)


def make_scheduler(
    config: TrainConfig, optimizer: torch.optim.Optimizer, steps_per_epoch: int
) -> torch.optim.lr_scheduler.LRScheduler:
    """Stepped once per training step (StepLR counts steps, so its period is one epoch)."""
    if config.schedule == "onecycle":
        return torch.optim.lr_scheduler.OneCycleLR(
            optimizer, max_lr=config.peak_lr, total_steps=config.epochs * steps_per_epoch
        )
    if config.schedule == "step":
        return torch.optim.lr_scheduler.StepLR(optimizer, step_size=steps_per_epoch, gamma=config.gamma)
    return torch.optim.lr_scheduler.ConstantLR(optimizer, factor=1.0, total_iters=0)


def train_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    x: torch.Tensor,
    y: torch.Tensor,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One training step: forward, loss, backward, optimizer (and scheduler) step."""
    with annotate("step/forward"):
        output = model(x)
        loss = F.cross_entropy(output, y)
    with annotate("step/backward"):
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
    with annotate("step/optimizer"):
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
    return loss.detach(), output.detach()


def annotate(name: str) -> contextlib.AbstractContextManager:
    """A profiler range around part of a step; free when no profiler is recording."""
    if torch.autograd.profiler._is_profiler_enabled:
        return torch.profiler.record_function(name)
    return contextlib.nullcontext()


@torch.no_grad()
def evaluate(model: nn.Module, images: torch.Tensor, labels: torch.Tensor, batch_size: int = 1000) -> dict[str, Any]:
    """Mean loss, accuracy (%) and the predicted classes over a whole normalised split."""
    was_training = model.training
    model.eval()
    loss_sum = torch.zeros((), dtype=torch.float64, device=images.device)
    predictions = []
    for i in range(0, len(labels), batch_size):
        x, y = images[i : i + batch_size], labels[i : i + batch_size]
        out = model(x)
        loss_sum += F.cross_entropy(out, y, reduction="sum").double()
        predictions.append(out.argmax(1))
    model.train(was_training)
    predicted = torch.cat(predictions)
    n = len(labels)
    return {
        "loss": loss_sum.item() / n,
        "accuracy": 100.0 * (predicted == labels).sum().item() / n,
        "predictions": predicted.cpu(),
    }


def fingerprint(predictions: torch.Tensor, labels: torch.Tensor) -> dict[str, Any]:
    """What checkpoint verification compares: a digest of the predicted class of every test sample."""
    predictions = predictions.cpu().to(torch.int64)
    return {
        "samples": len(labels),
        "predictions_sha256": hashlib.sha256(predictions.numpy().tobytes()).hexdigest(),
        "accuracy": 100.0 * (predictions == labels.cpu()).double().mean().item(),
    }


@dataclass
class LogPoint:
    """Training metrics averaged over the samples of the last `log_every` steps."""

    step: int
    epoch: int
    loss: float
    accuracy: float
    lr: float
    samples_per_s: float
    samples: int


@dataclass
class EpochResult:
    epoch: int  # 1-based
    train_loss: float
    train_acc: float
    test_loss: float
    test_acc: float
    lr: float
    train_seconds: float
    eval_seconds: float
    samples_per_s: float
    steps: int


@dataclass
class TrainResult:
    config: dict[str, Any]
    device: str
    epochs: list[EpochResult] = field(default_factory=list)
    steps: int = 0
    train_seconds: float = 0.0  # training steps only
    wall_seconds: float = 0.0  # training and evaluation
    target_reached_epoch: int | None = None
    time_to_target_s: float | None = None
    stopped_early: bool = False
    interrupted: bool = False
    resumed_from_epoch: int | None = None

    @property
    def final(self) -> EpochResult | None:
        return self.epochs[-1] if self.epochs else None

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        final = self.final
        out["final_test_acc"] = final.test_acc if final else None
        out["final_test_loss"] = final.test_loss if final else None
        out["samples_per_s"] = (
            sum(e.samples_per_s * e.train_seconds for e in self.epochs) / self.train_seconds
            if self.train_seconds
            else None
        )
        return out


class Observer:
    """Hooks into a training run. Override what you need; set `trainer.should_stop` to stop."""

    def on_train_begin(self, trainer: Trainer) -> None: ...

    def on_epoch_begin(self, trainer: Trainer, epoch: int) -> None: ...

    def on_evaluate_begin(self, trainer: Trainer, epoch: int) -> None: ...

    def on_step_end(self, trainer: Trainer, loss: torch.Tensor, batch_size: int) -> None: ...

    def on_log(self, trainer: Trainer, point: LogPoint) -> None: ...

    def on_epoch_end(self, trainer: Trainer, epoch: EpochResult) -> None: ...

    def on_train_end(self, trainer: Trainer, result: TrainResult) -> None: ...


class Trainer:
    """Trains one model on MNIST according to a `TrainConfig`, telling its observers."""

    def __init__(self, config: TrainConfig, data: MNIST, observers: Sequence[Observer] = ()) -> None:
        self.config = config
        self.device = resolve_device(config.device)
        if config.threads:
            torch.set_num_threads(config.threads)
        seed_everything(config.seed)
        self.model = build_model(config.model).to(self.device)
        n_train = config.train_subset or len(data.train_labels)
        n_test = config.test_subset or len(data.test_labels)
        self.batches = make_batches(
            config.loader,
            data.train_images[:n_train],
            data.train_labels[:n_train],
            config.batch_size,
            shuffle=True,
            seed=config.seed,
            device=self.device,
            workers=config.workers,
        )
        self.test_images = normalise(data.test_images[:n_test]).to(self.device)
        self.test_labels = data.test_labels[:n_test].to(self.device)
        self.optimizer = make_optimizer(config, self.model)
        self.scheduler = make_scheduler(config, self.optimizer, len(self.batches))
        self.observers = list(observers)
        self.start_epoch = 0
        self.global_step = 0
        self.should_stop = False
        self.last_predictions: torch.Tensor | None = None  # test-set classes at the last eval
        self.result = TrainResult(config=config.to_dict(), device=str(self.device))

    @property
    def steps_per_epoch(self) -> int:
        return len(self.batches)

    @property
    def lr(self) -> float:
        return self.optimizer.param_groups[0]["lr"]

    def sample_batch(self, n: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
        """The first `n` training samples, normalised and on the device (graph, image grid)."""
        if isinstance(self.batches, ResidentBatches):
            return self.batches.images[:n], self.batches.labels[:n]
        x, y = zip(*(self.batches.dataset[i] for i in range(n)), strict=True)
        return torch.stack(x).to(self.device), torch.stack(y).to(self.device)

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint holds: all to resume exactly at the current epoch boundary, and the
        fingerprint of the last evaluation's predictions that `verify_checkpoint` checks."""
        state = {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "epoch": self.start_epoch,
            "global_step": self.global_step,
            "rng": rng_state(),
            "config": self.config.to_dict(),
            "history": [dataclasses.asdict(e) for e in self.result.epochs],
        }
        if self.last_predictions is not None:
            state["fingerprint"] = fingerprint(self.last_predictions, self.test_labels)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.start_epoch = int(state["epoch"])
        if self.restarts_schedule(state):
            # the saved one-cycle ends at the old total (stepping past it raises): a fresh cycle
            # over the epochs still to run, from where the optimizer stands
            remaining = dataclasses.replace(self.config, epochs=max(self.config.epochs - self.start_epoch, 1))
            self.scheduler = make_scheduler(remaining, self.optimizer, self.steps_per_epoch)
        else:
            self.scheduler.load_state_dict(state["scheduler"])
        self.global_step = self.result.steps = int(state["global_step"])
        set_rng_state(state["rng"])
        self.result.epochs = [EpochResult(**e) for e in state.get("history", [])]
        self.result.resumed_from_epoch = self.start_epoch

    def restarts_schedule(self, state: dict[str, Any]) -> bool:
        """Whether resuming `state` under this config starts a new one-cycle (--epochs changed)."""
        saved_epochs = int(state["config"].get("epochs", self.config.epochs))
        return self.config.schedule == "onecycle" and self.config.epochs != saved_epochs

    def _emit(self, hook: str, *args: Any) -> None:
        for observer in self.observers:
            getattr(observer, hook)(self, *args)

    def fit(self) -> TrainResult:
        result = self.result
        self._emit("on_train_begin")
        wall_start = time.perf_counter()
        try:
            self._run_epochs(wall_start)
        except BaseException:
            result.interrupted = True  # Ctrl-C or a failure: observers still close what they opened
            raise
        finally:
            result.wall_seconds = time.perf_counter() - wall_start
            self._emit("on_train_end", result)
        return result

    def _run_epochs(self, wall_start: float) -> None:
        config, result = self.config, self.result
        for epoch in range(self.start_epoch, config.epochs):
            self.batches.set_epoch(epoch)
            self.model.train()
            self._emit("on_epoch_begin", epoch + 1)
            epoch_stats = self._train_epoch(epoch)
            self._emit("on_evaluate_begin", epoch + 1)
            eval_start = time.perf_counter()
            test = evaluate(self.model, self.test_images, self.test_labels, config.test_batch_size)
            self.start_epoch = epoch + 1  # the epoch boundary a checkpoint resumes from
            self.last_predictions = test["predictions"]
            record = EpochResult(
                epoch=epoch + 1,
                test_loss=test["loss"],
                test_acc=test["accuracy"],
                eval_seconds=time.perf_counter() - eval_start,
                lr=self.lr,
                **epoch_stats,
            )
            result.epochs.append(record)
            result.steps = self.global_step
            result.train_seconds += record.train_seconds
            result.wall_seconds = time.perf_counter() - wall_start
            self._emit("on_epoch_end", record)
            if self.should_stop:
                result.stopped_early = epoch + 1 < config.epochs
                break

    def _train_epoch(self, epoch: int) -> dict[str, float]:
        log_every = self.config.log_every
        zero = torch.zeros((), device=self.device)
        epoch_loss, epoch_correct, epoch_n = zero.double(), zero.long(), 0
        window_loss, window_correct, window_n = zero.double(), zero.long(), 0
        window_start = start = time.perf_counter()
        steps = 0
        for x, y in self.batches:
            loss, output = train_step(self.model, self.optimizer, x, y, self.scheduler)
            n = len(y)
            # sample-weighted sums, kept on the device: no host sync per step
            batch_loss = loss.double() * n
            batch_correct = (output.argmax(1) == y).sum()
            window_loss += batch_loss
            window_correct += batch_correct
            window_n += n
            self.global_step += 1
            steps += 1
            self._emit("on_step_end", loss, n)
            if self.global_step % log_every == 0:
                now = time.perf_counter()
                point = LogPoint(
                    step=self.global_step,
                    epoch=epoch + 1,
                    loss=window_loss.item() / window_n,
                    accuracy=100.0 * window_correct.item() / window_n,
                    lr=self.lr,
                    samples_per_s=window_n / max(now - window_start, 1e-9),
                    samples=window_n,
                )
                self._emit("on_log", point)
                epoch_loss += window_loss
                epoch_correct += window_correct
                epoch_n += window_n
                window_loss, window_correct, window_n = zero.double(), zero.long(), 0
                window_start = time.perf_counter()
        epoch_loss += window_loss
        epoch_correct += window_correct
        epoch_n += window_n
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        seconds = time.perf_counter() - start
        return {
            "train_loss": epoch_loss.item() / max(epoch_n, 1),
            "train_acc": 100.0 * epoch_correct.item() / max(epoch_n, 1),
            "train_seconds": seconds,
            "samples_per_s": epoch_n / max(seconds, 1e-9),
            "steps": steps,
        }


class StopAtAccuracy(Observer):
    """`--target-acc`: stop after the first epoch whose test accuracy reaches the target."""

    def __init__(self, target_percent: float) -> None:
        self.target = target_percent
        self.start = 0.0

    def on_train_begin(self, trainer: Trainer) -> None:
        self.start = time.perf_counter()

    def on_epoch_end(self, trainer: Trainer, epoch: EpochResult) -> None:
        result = trainer.result
        if result.target_reached_epoch is None and epoch.test_acc >= self.target:
            result.target_reached_epoch = epoch.epoch
            result.time_to_target_s = time.perf_counter() - self.start
            trainer.should_stop = True
