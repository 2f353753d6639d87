"""MNIST: the vendored official files, another copy on disk, or a download from a mirror.

Every file is verified by the MD5 of its uncompressed content, so a flipped byte anywhere is
caught whatever the compression.
"""

from __future__ import annotations

import hashlib
import os
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import numpy as np
import torch

from dlscope.contract.env import CACHE_ENV
from dlscope.data.idx import maybe_gunzip, parse_idx, read_file_bytes
from dlscope.errors import DatasetError
from dlscope.fsutil import atomic_write_bytes
from dlscope.phases import phase

MEAN, STD = 0.1307, 0.3081  # of the training pixels scaled to [0, 1]


@dataclass(frozen=True)
class MnistFile:
    name: str
    size: int
    md5: str


MNIST_FILES = {
    "train_images": MnistFile("train-images-idx3-ubyte", 47040016, "6bbc9ace898e44ae57da46a324031adb"),
    "train_labels": MnistFile("train-labels-idx1-ubyte", 60008, "a25bea736e30d166cdddb491f175f624"),
    "test_images": MnistFile("t10k-images-idx3-ubyte", 7840016, "2646ac647ad5339dbf082846283269ea"),
    "test_labels": MnistFile("t10k-labels-idx1-ubyte", 10008, "27ae3e4e09519cfbb04c329615203637"),
}


@dataclass
class MNIST:
    """The dataset as uint8 images (N, 28, 28) and int64 labels, with where it came from."""

    train_images: torch.Tensor
    train_labels: torch.Tensor
    test_images: torch.Tensor
    test_labels: torch.Tensor
    source: str
    files: dict[str, str] = field(default_factory=dict)
    load_seconds: float = 0.0

    def describe(self) -> dict:
        return {
            "source": self.source,
            "files": self.files,
            "train_samples": len(self.train_labels),
            "test_samples": len(self.test_labels),
            "load_seconds": round(self.load_seconds, 4),
        }


def vendored_dir() -> Path:
    return Path(str(resources.files("dlscope.data") / "mnist"))


def default_cache_dir() -> Path:
    base = os.environ.get(CACHE_ENV) or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "dlscope"
    )
    return Path(base)


def raw_dir_of(data_dir: Path) -> Path:
    """Accept torchvision's `<root>/MNIST/raw`, or `<root>/raw`, or the folder of files itself."""
    for candidate in (data_dir / "MNIST" / "raw", data_dir / "raw", data_dir):
        if any(_file_in(candidate, f.name) for f in MNIST_FILES.values()):
            return candidate
    if not data_dir.exists():
        raise DatasetError("data directory does not exist", data_dir)
    raise DatasetError(
        "no MNIST files here (expected MNIST/raw/train-images-idx3-ubyte[.gz] and the other three)", data_dir
    )


def _file_in(directory: Path, name: str) -> Path | None:
    for candidate in (directory / name, directory / f"{name}.gz"):
        if candidate.is_file():
            return candidate
    return None


def verify_content(content: bytes | bytearray, spec: MnistFile, path: str | Path) -> None:
    if len(content) != spec.size:
        raise DatasetError(f"{spec.name} should be {spec.size} bytes uncompressed, found {len(content)}", path)
    digest = hashlib.md5(content).hexdigest()
    if digest != spec.md5:
        raise DatasetError(f"checksum mismatch: md5 {digest}, expected {spec.md5}", path)


def load_mnist(data_dir: str | Path | None = None) -> MNIST:
    """Load and verify MNIST from `data_dir` (torchvision layout) or the copy dlscope ships."""
    start = time.perf_counter()
    raw = vendored_dir() if data_dir is None else raw_dir_of(Path(data_dir))
    arrays: dict[str, np.ndarray] = {}
    files: dict[str, str] = {}
    for key, spec in MNIST_FILES.items():
        path = _file_in(raw, spec.name)
        if path is None:
            raise DatasetError(f"missing {spec.name}[.gz]", raw)
        with phase("data_load"):
            content = read_file_bytes(path, limit=spec.size)
        with phase("preprocess"):  # decompress-checked, verified, parsed
            verify_content(content, spec, path)
            arrays[key] = parse_idx(content, path)
        files[key] = str(path)
    _check_shapes(arrays, raw)
    # images stay uint8 (copied out of the read-only buffer), labels become int64
    tensors = {k: torch.from_numpy(a.astype(np.int64) if "labels" in k else a.copy()) for k, a in arrays.items()}
    return MNIST(
        **tensors,
        source="embedded" if data_dir is None else str(raw),
        files=files,
        load_seconds=time.perf_counter() - start,
    )


def _check_shapes(arrays: dict[str, np.ndarray], where: Path) -> None:
    for split in ("train", "test"):
        images, labels = arrays[f"{split}_images"], arrays[f"{split}_labels"]
        if images.ndim != 3 or images.shape[1:] != (28, 28) or len(images) != len(labels):
            raise DatasetError(f"{split} images {images.shape} and labels {labels.shape} do not match", where)


def fetch_mnist(mirror: str, dest: str | Path | None = None, timeout: float = 60.0) -> Path:
    """Download the four .gz files from `mirror` into `dest`/MNIST/raw, all or nothing.

    Every file is downloaded and verified before any is written under its final name, each
    write is atomic, and a bad checksum leaves nothing behind.
    """
    raw = Path(dest or default_cache_dir()) / "MNIST" / "raw"
    downloads: dict[Path, bytes] = {}
    for spec in MNIST_FILES.values():
        url = f"{mirror.rstrip('/')}/{spec.name}.gz"
        try:
            with urllib.request.urlopen(url, timeout=timeout) as response:
                payload = response.read()
        except (urllib.error.URLError, OSError, ValueError) as e:
            reason = getattr(e, "reason", None) or e
            raise DatasetError(f"download failed: {reason}", url) from None
        verify_content(maybe_gunzip(payload, url, limit=spec.size), spec, url)
        downloads[raw / f"{spec.name}.gz"] = payload
    for path, payload in downloads.items():
        atomic_write_bytes(path, payload)
    return raw
