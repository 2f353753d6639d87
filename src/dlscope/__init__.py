"""dlscope: what a deep-learning training job does to a machine, layer by layer.

The public API, for notebooks and scripts (imported lazily: `import dlscope` stays light):

    import dlscope
    data = dlscope.load_mnist()
    trainer = dlscope.Trainer(dlscope.TrainConfig(epochs=1), data, [dlscope.TensorBoardObserver("tb")])
    result = trainer.fit()
"""

from __future__ import annotations

from dlscope.lazy import lazy_exports
from dlscope.phases import phase  # eager: a marker must cost µs, and the module imports only os and re

__version__ = "0.1.0"

_API = {
    "load_mnist": "dlscope.data.mnist",
    "fetch_mnist": "dlscope.data.mnist",
    "read_idx": "dlscope.data.idx",
    "write_idx": "dlscope.data.idx",
    "build_model": "dlscope.models",
    "MODELS": "dlscope.models",
    "TrainConfig": "dlscope.train",
    "Trainer": "dlscope.train",
    "TrainingObserver": "dlscope.events",
    "StopAtAccuracy": "dlscope.train",
    "evaluate": "dlscope.train",
    "TensorBoardObserver": "dlscope.instruments.tensorboard",
    "ProgressObserver": "dlscope.instruments.progress",
    "profile_training": "dlscope.instruments.profiler",
    "summarize_model": "dlscope.instruments.summary",
    "collect_environment": "dlscope.instruments.environment",
    "save_checkpoint": "dlscope.checkpoint",
    "load_checkpoint": "dlscope.restore",
    "verify_checkpoint": "dlscope.checkpoint",
    "CheckpointObserver": "dlscope.checkpoint",
    "render_report": "dlscope.report.render",
}

__all__ = ["__version__", "phase", *_API]


__getattr__ = lazy_exports(__name__, _API)
