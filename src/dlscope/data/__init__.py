"""Datasets: the IDX format, MNIST, and the batch sources that feed training."""

from __future__ import annotations

import importlib
from typing import Any

# imported on first use: `dlscope --help` must not pay for torch
_API = {
    "MNIST": "dlscope.data.mnist",
    "ResidentBatches": "dlscope.data.loaders",
    "TorchLoaderBatches": "dlscope.data.loaders",
    "fetch_mnist": "dlscope.data.mnist",
    "load_mnist": "dlscope.data.mnist",
    "make_batches": "dlscope.data.loaders",
    "normalise": "dlscope.data.loaders",
    "read_idx": "dlscope.data.idx",
    "write_idx": "dlscope.data.idx",
}

__all__ = list(_API)


def __getattr__(name: str) -> Any:
    if name in _API:
        return getattr(importlib.import_module(_API[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
