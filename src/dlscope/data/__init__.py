"""Datasets: the IDX format, MNIST, and the batch sources that feed training."""

from __future__ import annotations

from dlscope.lazy import lazy_exports

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


__getattr__ = lazy_exports(__name__, _API)
