"""What a training run computes: TrainConfig, its recipes and vocabularies. Torch-free, so the CLI
can parse and check every option before anything heavy is imported."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from dlscope.errors import ConfigError, require

# The model zoo's names (dlscope.models.MODELS builds them; named here so checking a config never
# imports torch: `dlscope run` observes a script and its parent process never needs it)
MODEL_NAMES = ("cnn", "small", "net", "lenet", "mlp")
OPTIMIZERS = ("adam", "sgd", "adadelta")
SCHEDULES = ("onecycle", "step", "constant")
LOADERS = ("resident", "torch")
DEFAULT_LR = {"adam": 0.01, "sgd": 0.05, "adadelta": 1.0}

# Named sets of training defaults (`--recipe`). "fast": the least wall time to 99% test accuracy
# (benchmarks/fast_recipe.py; BENCHMARKS.md): a smaller net, its layout chosen by measuring on this
# machine, the test set evaluated on a schedule so training stops as soon as it crosses the target.
RECIPES: dict[str, dict[str, Any]] = {
    "default": {},
    "fast": {"model": "small", "autotune": True, "eval_every": 100},
}


@dataclass
class TrainConfig:
    """Everything that decides what a training run computes (saved in every checkpoint)."""

    model: str = "cnn"
    epochs: int = 2
    batch_size: int = 128
    test_batch_size: int = 500
    optimizer: str = "adam"
    lr: float | None = None  # None: DEFAULT_LR[optimizer] (the peak LR under one-cycle)
    schedule: str = "onecycle"
    gamma: float = 0.7  # StepLR decay per epoch
    momentum: float = 0.9
    weight_decay: float = 0.0
    seed: int = 1
    device: str = "auto"
    threads: int | None = None
    target_acc: float | None = None  # percent; stop at the first evaluation that reaches it
    eval_every: int | None = None  # steps between test evaluations inside an epoch (None: epoch ends)
    autotune: bool = False  # time candidate layouts and threads on the first steps, keep the fastest
    loader: str = "resident"
    workers: int = 0
    log_every: int = 50
    train_subset: int | None = None  # first N training samples (quick runs, tests)
    test_subset: int | None = None

    def __post_init__(self) -> None:
        require(
            (self.model in MODEL_NAMES, f"unknown model {self.model!r}; choose from {', '.join(MODEL_NAMES)}"),
            (self.optimizer in OPTIMIZERS, f"optimizer must be one of {', '.join(OPTIMIZERS)}"),
            (self.schedule in SCHEDULES, f"schedule must be one of {', '.join(SCHEDULES)}"),
            (self.loader in LOADERS, f"loader must be one of {', '.join(LOADERS)}"),
            (self.epochs >= 1, "epochs must be ≥ 1"),
            (self.batch_size >= 1 and self.test_batch_size >= 1, "batch sizes must be ≥ 1"),
            (self.lr is None or self.lr > 0, "lr must be > 0"),
            (self.log_every >= 1, "log-every must be ≥ 1"),
            (self.eval_every is None or self.eval_every >= 1, "eval-every must be ≥ 1"),
            (self.workers >= 0, "workers must be ≥ 0"),
            (self.threads is None or self.threads >= 1, "threads must be ≥ 1"),
            (
                self.device in ("auto", "cpu", "cuda", "mps") or self.device.startswith("cuda:"),
                "device must be auto, cpu, cuda, cuda:N or mps",
            ),
            (self.target_acc is None or 0 < self.target_acc <= 100, "target accuracy is a percentage in (0, 100]"),
        )

    @property
    def peak_lr(self) -> float:
        return self.lr if self.lr is not None else DEFAULT_LR[self.optimizer]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_recipe(cls, recipe: str, **settings: Any) -> TrainConfig:
        """A config from `settings`, where the recipe replaces every setting left at its default."""
        if recipe not in RECIPES:
            raise ConfigError(f"unknown recipe {recipe!r}; choose from {', '.join(RECIPES)}")
        defaults = {f.name: f.default for f in dataclasses.fields(cls)}
        for key, value in RECIPES[recipe].items():
            if settings.get(key, defaults[key]) == defaults[key]:
                settings[key] = value
        return cls(**settings)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> TrainConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in known})
