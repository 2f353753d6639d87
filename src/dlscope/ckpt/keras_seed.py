"""Seed 003's Keras MLP (Flatten → Dense 512 relu → Dropout 0.2 → Dense 10 softmax, sparse
categorical cross-entropy), trained and saved through Keras 3 on the torch or the TensorFlow backend.

Optional extras: `keras` (torch backend) and `tf` (TensorFlow backend). Keras picks its backend
once per process, at import (KERAS_BACKEND), so one process trains on one backend. Each run saves
what the handout's framework saves — model.h5 and model.keras, plus on TensorFlow a
tf.train.Checkpoint bundle — and profiles a few extra training steps with the backend's own
profiler, so the two backends give the same top-10 operator table.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from dlscope.errors import ConfigError, DlscopeError

BACKENDS = ("torch", "tensorflow")
PROFILE_STEPS = 10


def import_keras(backend: str = "torch") -> Any:
    if backend not in BACKENDS:
        raise ConfigError(f"keras backend must be one of {', '.join(BACKENDS)}")
    if "keras" in sys.modules:
        import keras

        if keras.backend.backend() != backend:
            raise DlscopeError(
                f"keras already runs on the {keras.backend.backend()} backend in this process; "
                f"the {backend} backend needs a new process"
            )
        return keras
    os.environ["KERAS_BACKEND"] = backend  # keras reads it once, at import (importing TF may import keras)
    if backend == "tensorflow":
        from dlscope.experiments.pipeline.tfdata import import_tensorflow

        import_tensorflow()  # one line naming the install command when TF is missing
    try:
        import keras
    except ImportError:
        raise DlscopeError("the Keras seed needs keras 3 (pip install -e .[keras])") from None
    return keras


def seed_mlp(keras: Any, seed: int = 1, optimizer: str = "adam") -> Any:
    """Seed 003's model, compiled as the handout compiles it (Adam; RMSprop on request)."""
    keras.utils.set_random_seed(seed)
    model = keras.Sequential(
        [
            keras.Input((28, 28)),
            keras.layers.Flatten(),
            keras.layers.Dense(512, activation="relu"),
            keras.layers.Dropout(0.2),
            keras.layers.Dense(10, activation="softmax"),
        ]
    )
    model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def train_seed_mlp(
    images: torch.Tensor,
    labels: torch.Tensor,
    out_dir: Path,
    epochs: int,
    batch_size: int = 32,
    backend: str = "torch",
    optimizer: str = "adam",
) -> dict[str, Any]:
    """Train the seed model on uint8 images (scaled /255 as the seed does); save its checkpoints and
    profile PROFILE_STEPS more steps (after saving: the files hold the trained state)."""
    keras = import_keras(backend)
    start = time.perf_counter()
    keras.backend.clear_session()  # layer names restart at dense, dense_1 … as in the handout's listing
    model = seed_mlp(keras, optimizer=optimizer)
    x = (images.numpy() / 255.0).astype("float32")
    y = labels.numpy()
    history = model.fit(x, y, epochs=epochs, batch_size=batch_size, verbose=0)
    train_seconds = time.perf_counter() - start
    out_dir.mkdir(parents=True, exist_ok=True)
    files = {"h5": out_dir / "model.h5", "keras": out_dir / "model.keras"}
    model.save(files["keras"])  # first: after a legacy .h5 save, Keras 3.15 leaves the optimizer out of compile_config
    model.save(files["h5"])  # the seed's call: legacy HDF5 with model_config / training_config attributes
    if backend == "tensorflow":  # the handout's other format: TF's own checkpoint (index + data shard)
        import tensorflow as tf

        prefix = tf.train.Checkpoint(model=model, optimizer=model.optimizer).write(str(out_dir / "tf" / "ckpt"))
        files["tf_bundle"] = Path(prefix)
    profile_x, profile_y = x[: PROFILE_STEPS * batch_size], y[: PROFILE_STEPS * batch_size]
    steps = -(-len(profile_y) // batch_size)
    return {
        "keras_version": keras.__version__,
        "backend": keras.backend.backend(),
        "optimizer": optimizer,
        "batch_size": batch_size,
        "samples": len(labels),
        "epochs": epochs,
        "train_seconds": train_seconds,
        "accuracy": [float(a) for a in history.history["accuracy"]],
        "profile": profile_steps(model, profile_x, profile_y, batch_size, backend, steps),
        "files": files,
    }


def profile_steps(model: Any, x: Any, y: Any, batch_size: int, backend: str, steps: int) -> dict[str, Any]:
    """Top-10 operators of `steps` training steps under the backend's profiler (torch.profiler, or
    tf.profiler.experimental read back from its XSpace trace)."""
    if backend == "tensorflow":
        import tensorflow as tf

        from dlscope.instruments.xplane import find_trace, table_from_xspace

        with tempfile.TemporaryDirectory(prefix="dlscope-tfprof-") as logdir:
            tf.profiler.experimental.start(logdir)
            try:
                model.fit(x, y, epochs=1, batch_size=batch_size, verbose=0)
            finally:
                tf.profiler.experimental.stop()
            table = table_from_xspace(find_trace(logdir), steps)
        profiler = "tf.profiler.experimental (XSpace)"
    else:
        from torch.profiler import ProfilerActivity, profile

        from dlscope.analysis.optable import table_from_events
        from dlscope.measure.native_stderr import quiet_native_stderr

        with quiet_native_stderr(), profile(activities=[ProfilerActivity.CPU]) as prof:
            model.fit(x, y, epochs=1, batch_size=batch_size, verbose=0)
        table = table_from_events(prof.key_averages(), steps)
        profiler = "torch.profiler"
    return {
        "profiler": profiler,
        "steps": steps,
        "self_us_total": table.self_cpu_total_us,
        "top": [
            {"name": r.name, "calls": r.calls, "self_us": r.self_cpu_us, "self_pct": table.share(r)}
            for r in table.top(10)
        ],
    }
