"""Seed 003's Keras MLP (Flatten → Dense 512 relu → Dropout 0.2 → Dense 10 softmax, Adam,
sparse categorical cross-entropy), trained and saved through Keras 3 on the torch backend.

An optional extra (`pip install -e .[keras]`): it exists so the checkpoint anatomy can show the
same model_config / training_config listing the handout prints, from files Keras really wrote.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import torch

from dlscope.errors import DlscopeError


def import_keras() -> Any:
    os.environ.setdefault("KERAS_BACKEND", "torch")  # keras reads it once, at import
    try:
        import keras
    except ImportError:
        raise DlscopeError("the Keras seed needs keras 3 (pip install -e .[keras])") from None
    if keras.backend.backend() != "torch":
        raise DlscopeError(f"keras runs on the {keras.backend.backend()} backend; set KERAS_BACKEND=torch")
    return keras


def seed_mlp(keras: Any, seed: int = 1) -> Any:
    """Seed 003's model, compiled as the handout compiles it (Adam, sparse categorical cross-entropy)."""
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
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def train_seed_mlp(
    images: torch.Tensor, labels: torch.Tensor, out_dir: Path, epochs: int, batch_size: int = 32
) -> dict[str, Any]:
    """Train the seed model on uint8 images (scaled /255 as the seed does); save model.h5 and model.keras."""
    keras = import_keras()
    start = time.perf_counter()
    keras.backend.clear_session()  # layer names restart at dense, dense_1 … as in the handout's listing
    model = seed_mlp(keras)
    x = (images.numpy() / 255.0).astype("float32")
    history = model.fit(x, labels.numpy(), epochs=epochs, batch_size=batch_size, verbose=0)
    train_seconds = time.perf_counter() - start
    out_dir.mkdir(parents=True, exist_ok=True)
    h5, native = out_dir / "model.h5", out_dir / "model.keras"
    model.save(native)  # first: after a legacy .h5 save, Keras 3.15 leaves the optimizer out of compile_config
    model.save(h5)  # the seed's call: legacy HDF5 with model_config / training_config attributes
    return {
        "keras_version": keras.__version__,
        "backend": keras.backend.backend(),
        "samples": len(labels),
        "epochs": epochs,
        "train_seconds": train_seconds,
        "accuracy": [float(a) for a in history.history["accuracy"]],
        "files": {"h5": h5, "keras": native},
    }
