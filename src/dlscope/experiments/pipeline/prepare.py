"""`dlscope pipeline prepare`: one set of samples written three ways, and the manifest that says how.

<dataset>/
    manifest.json                     what is here (the readers trust nothing else)
    files/000/000000.rec ...          one file per sample (a single TFRecord record each),
                                      1,000 per directory
    shards/shard-00000-of-00008.tfrecord ...   consecutive samples, TFRecord framing
    array.npy                         uint8 (samples, 5 + sample bytes): memory-mappable

A record (in files and shards) is a `tf.train.Example` with features image, label and index, as a
TF user writes it (example.py); a row of the array is uint32 index, uint8 label, the sample bytes.
The index travels with the sample so a consumer can check that an epoch delivered every sample
exactly once, whatever the workers, shuffling and batching did.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from dlscope.errors import ConfigError, DatasetError
from dlscope.experiments.pipeline.example import encode_example, example_bytes
from dlscope.experiments.pipeline.tfrecord import OVERHEAD, frame, write_records
from dlscope.options import PIPELINE_FORMATS as FORMATS

ROW_HEADER = struct.Struct("<IB")  # sample index, label: the array's rows
FILES_PER_DIR = 1000
MANIFEST = "manifest.json"
MANIFEST_VERSION = 2  # 2: records are tf.train.Example protos (1: a bare index/label/bytes payload)


@dataclass(frozen=True)
class Manifest:
    """What a prepared dataset holds; paths are derived from it, never listed."""

    samples: int
    sample_bytes: int
    source: str  # "mnist" or "synthetic"
    formats: tuple[str, ...]
    shards: int
    version: int = MANIFEST_VERSION

    @property
    def row_bytes(self) -> int:
        """One row of the array."""
        return ROW_HEADER.size + self.sample_bytes

    @property
    def record_file_bytes(self) -> int:
        """Size of one per-sample file: a single framed tf.train.Example."""
        return OVERHEAD + example_bytes(self.sample_bytes)

    def shard_range(self, shard: int) -> range:
        """The sample indices shard `shard` holds: consecutive, sizes differing by at most one."""
        return range(shard * self.samples // self.shards, (shard + 1) * self.samples // self.shards)

    def data_bytes(self, fmt: str) -> int:
        if fmt == "array":
            return self.samples * self.row_bytes
        return self.samples * self.record_file_bytes


def sample_file(root: Path, index: int) -> Path:
    return root / "files" / f"{index // FILES_PER_DIR:03d}" / f"{index:06d}.rec"


def shard_file(root: Path, shard: int, shards: int) -> Path:
    return root / "shards" / f"shard-{shard:05d}-of-{shards:05d}.tfrecord"


def data_files(root: Path, manifest: Manifest, fmt: str) -> list[Path]:
    """The files a reader of format `fmt` opens, in dataset order."""
    if fmt == "files":
        return [sample_file(root, i) for i in range(manifest.samples)]
    if fmt == "tfrecord":
        return [shard_file(root, k, manifest.shards) for k in range(manifest.shards)]
    return [root / "array.npy"]


def payloads(indices: range, labels: np.ndarray, samples: np.ndarray) -> list[bytes]:
    return [encode_example(i, int(labels[i]), samples[i].tobytes()) for i in indices]


def synthetic_samples(n: int, sample_bytes: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 10, n, dtype=np.uint8), rng.integers(0, 256, (n, sample_bytes), dtype=np.uint8)


def prepare_dataset(
    out: str | Path,
    labels: np.ndarray,
    samples: np.ndarray,
    source: str,
    shards: int = 8,
    formats: tuple[str, ...] = FORMATS,
) -> Manifest:
    """Write `samples` (uint8, one row per sample) in each format into a new directory `out`.

    Everything is written into a temporary sibling directory, synced, then renamed into place:
    an interrupted prepare leaves no half-written dataset under `out`.
    """
    out = Path(out)
    n = len(labels)
    if samples.ndim != 2 or samples.dtype != np.uint8 or len(samples) != n:
        raise ConfigError("samples must be a uint8 array with one row per label")
    if not 1 <= shards <= n:
        raise ConfigError(f"shards must be between 1 and the number of samples ({n})")
    if unknown := set(formats) - set(FORMATS):
        raise ConfigError(f"unknown format(s) {', '.join(sorted(unknown))}; choose from {', '.join(FORMATS)}")
    if out.exists():
        raise ConfigError("already exists; choose another --out or remove it", out)
    manifest = Manifest(n, samples.shape[1], source, tuple(f for f in FORMATS if f in formats), shards)
    tmp = out.parent / f".dlscope-tmp-{out.name}.{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir(parents=True)
        _write_formats(tmp, manifest, labels, samples)
        (tmp / MANIFEST).write_text(json.dumps(asdict(manifest), indent=2))
        os.sync()  # page-cache eviction (cold runs) cannot drop dirty pages: write them out now
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return manifest


def _write_formats(root: Path, manifest: Manifest, labels: np.ndarray, samples: np.ndarray) -> None:
    if "files" in manifest.formats:
        for d in range(-(-manifest.samples // FILES_PER_DIR)):
            (root / "files" / f"{d:03d}").mkdir(parents=True)
        for i, payload in enumerate(payloads(range(manifest.samples), labels, samples)):
            sample_file(root, i).write_bytes(frame(payload))
    if "tfrecord" in manifest.formats:
        (root / "shards").mkdir(parents=True)
        for k in range(manifest.shards):
            with open(shard_file(root, k, manifest.shards), "wb") as f:
                write_records(f, payloads(manifest.shard_range(k), labels, samples))
    if "array" in manifest.formats:
        array = np.empty((manifest.samples, manifest.row_bytes), np.uint8)
        array[:, :4] = np.arange(manifest.samples, dtype="<u4").view(np.uint8).reshape(-1, 4)
        array[:, 4] = labels
        array[:, 5:] = samples
        np.save(root / "array.npy", array)


def load_manifest(root: str | Path, fmt: str | None = None) -> Manifest:
    """The manifest of a prepared dataset (and a check that `fmt` was prepared there)."""
    path = Path(root) / MANIFEST
    if not path.is_file():
        raise DatasetError("not a pipeline dataset (no manifest.json); make one with `dlscope pipeline prepare`", root)
    try:
        values = json.loads(path.read_text())
        manifest = Manifest(**{**values, "formats": tuple(values["formats"])})
    except (json.JSONDecodeError, TypeError, KeyError) as e:
        raise DatasetError(f"manifest.json is not a dlscope pipeline manifest ({e})", path) from None
    if manifest.version > MANIFEST_VERSION:
        raise DatasetError(f"manifest version {manifest.version} is newer than this dlscope reads", path)
    if manifest.version < MANIFEST_VERSION:
        raise DatasetError(
            f"manifest version {manifest.version}: records before tf.train.Example; prepare the dataset again", path
        )
    if fmt is not None and fmt not in manifest.formats:
        raise DatasetError(f"format {fmt!r} was not prepared here (have: {', '.join(manifest.formats)})", root)
    return manifest
