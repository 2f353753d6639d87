"""What the training engine tells its watchers: the hooks and the records (torch-free).

The engine (dlscope.train), checkpointing and every observer import this module; it imports none
of them, so a watcher never reaches back into the engine to learn what an event is.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any


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
class Evaluation:
    """One evaluation of the test set: at an epoch's end, or inside it every `eval_every` steps."""

    step: int
    epoch: float  # epochs of training done (fractional inside an epoch)
    test_loss: float
    test_acc: float
    seconds: float


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
    evaluations: list[Evaluation] = field(default_factory=list)
    target_reached_epoch: int | None = None
    target_reached_step: int | None = None
    time_to_target_s: float | None = None
    autotune: dict[str, Any] | None = None  # the decision and its evidence (dlscope.autotune)
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


class TrainingObserver:
    """Hooks into a training run. Override what you need; set `trainer.should_stop` to stop.

    `trainer` is the dlscope.train.Trainer that emits the event; `loss` a 0-d tensor on its device
    (reading it forces a host sync: keep it for every N steps)."""

    def on_train_begin(self, trainer: Any) -> None: ...

    def on_epoch_begin(self, trainer: Any, epoch: int) -> None: ...

    def on_evaluate_begin(self, trainer: Any, epoch: int) -> None: ...

    def on_step_end(self, trainer: Any, loss: Any, batch_size: int) -> None: ...

    def on_log(self, trainer: Any, point: LogPoint) -> None: ...

    def on_eval(self, trainer: Any, evaluation: Evaluation) -> None: ...

    def on_epoch_end(self, trainer: Any, epoch: EpochResult) -> None: ...

    def on_train_end(self, trainer: Any, result: TrainResult) -> None: ...
