"""Datasets: the IDX format, MNIST, and the batch sources that feed training."""

from dlscope.data.idx import read_idx, write_idx
from dlscope.data.loaders import ResidentBatches, TorchLoaderBatches, make_batches, normalise
from dlscope.data.mnist import MNIST, fetch_mnist, load_mnist

__all__ = [
    "MNIST",
    "ResidentBatches",
    "TorchLoaderBatches",
    "fetch_mnist",
    "load_mnist",
    "make_batches",
    "normalise",
    "read_idx",
    "write_idx",
]
