"""The training engine. The loop stays plain; everything that watches it is a `TrainingObserver`.

tuner (given with config.autotune): the first steps of epoch 1 time candidate layouts (dlscope.autotune)
for epoch:
    for x, y in batches:
        loss, logits = train_step(model, optimizer, x, y, scheduler)   # forward, backward, step
        observers.on_step_end(...)                             # every N steps: on_log
        every eval_every steps: evaluate, observers.on_eval    # may stop inside the epoch
    test = evaluate(model, test set)                           # the full test set
    observers.on_eval(...), observers.on_epoch_end(...)        # checkpoint, early stop, ...
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import hashlib
import math
import random
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from dlscope.config import DEFAULT_LR, LOADERS, OPTIMIZERS, RECIPES, SCHEDULES, TrainConfig  # noqa: F401 (re-exported)
from dlscope.data.loaders import ResidentBatches, make_batches, normalise
from dlscope.data.mnist import MNIST
from dlscope.errors import ConfigError
from dlscope.events import EpochResult, Evaluation, LogPoint, TrainingObserver, TrainResult
from dlscope.models import Layout, TunableCNN, build_model

# Scheduled evaluations wait until the training accuracy (last logging window) is this close to the
# target: a test-set pass costs as much as dozens of steps, and far from the target it cannot stop the run.
EVAL_WITHIN_PCT = 1.0


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
    index = name.partition(":")[2]
    if name.startswith("cuda:") and not (index.isdigit() and int(index) < torch.cuda.device_count()):
        raise ConfigError(f"device {name}: torch sees {torch.cuda.device_count()} CUDA GPU(s), numbered from 0")
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
def evaluate(
    model: nn.Module, images: torch.Tensor, labels: torch.Tensor, batch_size: int = 1000, keep_logits: bool = False
) -> dict[str, Any]:
    """Mean loss, accuracy (%) and the predicted classes over a whole normalised split, in eval mode;
    with `keep_logits`, the logits too (on CPU: checkpoint verification compares them)."""
    was_training = model.training
    model.eval()
    loss_sum = torch.zeros((), dtype=torch.float64, device=images.device)
    predictions, logits = [], []
    for i in range(0, len(labels), batch_size):
        x, y = images[i : i + batch_size], labels[i : i + batch_size]
        out = model(x)
        loss_sum += F.cross_entropy(out, y, reduction="sum").double()
        predictions.append(out.argmax(1))
        if keep_logits:
            logits.append(out.cpu())
    model.train(was_training)
    predicted = torch.cat(predictions)
    n = len(labels)
    return {
        "loss": loss_sum.item() / n,
        "accuracy": 100.0 * (predicted == labels).sum().item() / n,
        "predictions": predicted.cpu(),
        **({"logits": torch.cat(logits)} if keep_logits else {}),
    }


def fingerprint(predictions: torch.Tensor, labels: torch.Tensor) -> dict[str, Any]:
    """What checkpoint verification compares: a digest of the predicted class of every test sample."""
    predictions = predictions.cpu().to(torch.int64)
    return {
        "samples": len(labels),
        "predictions_sha256": hashlib.sha256(predictions.numpy().tobytes()).hexdigest(),
        "accuracy": 100.0 * (predictions == labels.cpu()).double().mean().item(),
    }


# measures candidate layouts on the first steps of epoch 1, applies the fastest, returns the evidence
Tuner = Callable[["Trainer", Iterator[tuple[torch.Tensor, torch.Tensor]], int], dict[str, Any]]


@dataclass(frozen=True)
class DataParallel:
    """One rank of a DistributedDataParallel job: the process group must already exist."""

    rank: int
    world_size: int
    bucket_cap_mb: float = 25.0


def summed_across_ranks(*values: torch.Tensor | int) -> list[float]:
    """Each value summed over every rank (the job's totals, the same on all ranks)."""
    import torch.distributed as dist

    device = "cuda" if dist.get_backend() == "nccl" else "cpu"  # NCCL reduces GPU tensors only
    totals = torch.tensor([float(v) for v in values], dtype=torch.float64, device=device)
    dist.all_reduce(totals)
    return totals.tolist()


# the epoch's and the logging window's running sums (a window closing adds to the epoch's)
RUNNING_METRICS = ("_epoch_loss", "_epoch_correct", "_epoch_n", "_window_loss", "_window_correct", "_window_n")


class Trainer:
    """Trains one model on MNIST according to a `TrainConfig`, telling its observers."""

    def __init__(
        self,
        config: TrainConfig,
        data: MNIST,
        observers: Sequence[TrainingObserver] = (),
        parallel: DataParallel | None = None,
        tuner: Tuner | None = None,
    ) -> None:
        if config.autotune and tuner is None:  # the engine does not import its tuner (dlscope.autotune)
            raise ConfigError("autotune is on but no tuner was given: Trainer(..., tuner=dlscope.autotune.autotune)")
        self.config = config
        self.tuner = tuner
        self.parallel = parallel
        self.device = resolve_device(config.device)
        if config.threads:
            torch.set_num_threads(config.threads)
        seed_everything(config.seed)
        self.model = build_model(config.model).to(self.device)
        # what the training step runs: DDP's wrapper with ranks, torch.compile's if autotune kept one
        # (autotune is refused with ranks, so never both)
        self.step_model: nn.Module = self.model
        n_train = config.train_subset or len(data.train_labels)
        n_test = config.test_subset or len(data.test_labels)
        self.batches = make_batches(
            config.loader,
            data.train_images[:n_train],
            data.train_labels[:n_train],
            config.batch_size // (parallel.world_size if parallel else 1),  # --batch-size is the global batch
            shuffle=True,
            seed=config.seed,
            device=self.device,
            workers=config.workers,
        )
        if parallel is not None:
            from torch.nn.parallel import DistributedDataParallel

            self.batches.shard(parallel.rank, parallel.world_size)
            device_ids = [self.device.index] if self.device.type == "cuda" else None
            self.step_model = DistributedDataParallel(
                self.model, device_ids=device_ids, bucket_cap_mb=parallel.bucket_cap_mb
            )
        self.test_images = normalise(data.test_images[:n_test]).to(self.device)
        self.test_labels = data.test_labels[:n_test].to(self.device)
        self.optimizer = make_optimizer(config, self.model)
        self.scheduler = make_scheduler(config, self.optimizer, len(self.batches))
        self.observers = list(observers)
        self.start_epoch = 0
        self.global_step = 0
        self.should_stop = False
        self._last_test: dict[str, Any] = {}  # the latest evaluation, at global step _last_test_step
        self._last_test_step = -1
        self._eval_seconds = 0.0  # evaluation time inside the current epoch
        self._train_acc = 0.0  # the last logging window's training accuracy
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
        if isinstance(self.model, TunableCNN):  # how it computed the fingerprint's predictions
            state["layout"] = self.model.layout.to_dict()
        if self.last_predictions is not None:
            state["fingerprint"] = fingerprint(self.last_predictions, self.test_labels)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from an in-memory state (a file or a DCP directory is read by dlscope.restore)."""
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        if "layout" in state and isinstance(self.model, TunableCNN):
            self.model.set_layout(Layout.from_dict(state["layout"]))
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

    def trial_state(self) -> dict[str, Any]:
        """A copy of what a tuning trial that goes wrong puts back (`put_back`): the weights, the
        optimizer's state and the epoch's running metrics; its steps stay counted."""
        metrics = {name: getattr(self, name) for name in RUNNING_METRICS}
        return copy.deepcopy({"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(), **metrics})

    def put_back(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        for name in RUNNING_METRICS:
            setattr(self, name, state[name])

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
            # a stop right after a scheduled evaluation ends on it rather than evaluating again
            test = self._last_test if self._last_test_step == self.global_step else self._evaluate(epoch + 1)
            self.start_epoch = epoch + 1  # the epoch boundary a checkpoint resumes from
            self.last_predictions = test["predictions"]
            record = EpochResult(
                epoch=epoch + 1,
                test_loss=test["loss"],
                test_acc=test["accuracy"],
                lr=self.lr,
                eval_seconds=self._eval_seconds,  # scheduled evaluations and the epoch-end one
                **epoch_stats,
            )
            result.epochs.append(record)
            result.steps = self.global_step
            result.train_seconds += record.train_seconds
            result.wall_seconds = time.perf_counter() - wall_start
            self._emit("on_epoch_end", record)
            if self.should_stop:
                result.stopped_early = epoch + 1 < config.epochs or record.steps < self.steps_per_epoch
                break

    def _evaluate(self, epoch: float) -> dict[str, Any]:
        """The full test set; observers hear of it (on_eval) and may stop the run."""
        start = time.perf_counter()
        test = evaluate(self.model, self.test_images, self.test_labels, self.config.test_batch_size)
        seconds = time.perf_counter() - start
        self._eval_seconds += seconds
        self._window_start += seconds  # the logging window's samples/s counts training only
        self._last_test, self._last_test_step = test, self.global_step
        evaluation = Evaluation(self.global_step, epoch, test["loss"], test["accuracy"], seconds)
        self.result.evaluations.append(evaluation)
        self._emit("on_eval", evaluation)
        if self.parallel is not None:  # ranks evaluate the same weights; a stop on one stops all
            self.should_stop = summed_across_ranks(self.should_stop)[0] > 0
        return test

    def train_batch(self, x: torch.Tensor, y: torch.Tensor, epoch: int) -> None:
        """One training step on (x, y), its metrics added to the logging window (no host sync)."""
        loss, output = train_step(self.step_model, self.optimizer, x, y, self.scheduler)
        n = len(y)
        self._window_loss += loss.double() * n
        self._window_correct += (output.argmax(1) == y).sum()
        self._window_n += n
        self.global_step += 1
        self._emit("on_step_end", loss, n)
        if self.global_step % self.config.log_every == 0:
            self._close_window(epoch, emit=True)

    def _close_window(self, epoch: int, emit: bool) -> None:
        if self.parallel is not None:  # every rank closes its window at the same step: log the job's metrics
            loss, correct, n = summed_across_ranks(self._window_loss, self._window_correct, self._window_n)
            self._window_loss = torch.tensor(loss, dtype=torch.float64, device=self.device)
            self._window_correct = torch.tensor(int(correct), device=self.device)
            self._window_n = int(n)
        if emit:
            now = time.perf_counter()
            point = LogPoint(
                step=self.global_step,
                epoch=epoch + 1,
                loss=self._window_loss.item() / self._window_n,
                accuracy=100.0 * self._window_correct.item() / self._window_n,
                lr=self.lr,
                samples_per_s=self._window_n / max(now - self._window_start, 1e-9),
                samples=self._window_n,
            )
            self._emit("on_log", point)
            self._train_acc = point.accuracy
        self._epoch_loss += self._window_loss
        self._epoch_correct += self._window_correct
        self._epoch_n += self._window_n
        zero = torch.zeros((), device=self.device)
        self._window_loss, self._window_correct, self._window_n = zero.double(), zero.long(), 0
        self._window_start = time.perf_counter()

    def _near_target(self) -> bool:
        target = self.config.target_acc
        return target is None or self._train_acc >= target - EVAL_WITHIN_PCT

    def _train_epoch(self, epoch: int) -> dict[str, float]:
        zero = torch.zeros((), device=self.device)
        self._epoch_loss, self._epoch_correct, self._epoch_n = zero.double(), zero.long(), 0
        self._window_loss, self._window_correct, self._window_n = zero.double(), zero.long(), 0
        self._eval_seconds = 0.0
        start = self._window_start = time.perf_counter()
        first_step = self.global_step
        batches = iter(self.batches)
        if self.tuner is not None and self.result.autotune is None:
            self.result.autotune = self.tuner(self, batches, epoch)
        eval_every = self.config.eval_every
        for x, y in batches:
            self.train_batch(x, y, epoch)
            steps = self.global_step - first_step
            # the epoch's last step is followed by the epoch-end evaluation anyway
            if (
                eval_every
                and self.global_step % eval_every == 0
                and steps < self.steps_per_epoch
                and self._near_target()
            ):
                self._evaluate(epoch + steps / self.steps_per_epoch)
                if self.should_stop:
                    break
        self._close_window(epoch, emit=False)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        seconds = time.perf_counter() - start - self._eval_seconds
        n = self._epoch_n
        return {
            "train_loss": self._epoch_loss.item() / max(n, 1),
            "train_acc": 100.0 * self._epoch_correct.item() / max(n, 1),
            "train_seconds": seconds,
            "samples_per_s": n / max(seconds, 1e-9),
            "steps": self.global_step - first_step,
        }


class StopAtAccuracy(TrainingObserver):
    """`--target-acc`: stop at the first evaluation (epoch end or scheduled) that reaches the target."""

    def __init__(self, target_percent: float) -> None:
        self.target = target_percent
        self.start = 0.0

    def on_train_begin(self, trainer: Trainer) -> None:
        self.start = time.perf_counter()

    def on_eval(self, trainer: Trainer, evaluation: Evaluation) -> None:
        result = trainer.result
        if result.target_reached_epoch is None and evaluation.test_acc >= self.target:
            result.target_reached_epoch = math.ceil(evaluation.epoch)
            result.target_reached_step = evaluation.step
            result.time_to_target_s = time.perf_counter() - self.start
            trainer.should_stop = True
