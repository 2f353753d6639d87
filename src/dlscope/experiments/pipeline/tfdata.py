"""tf.data as a second engine of the pipeline experiments: the same files, the same rows, the same
consumer, so its numbers stand next to dlscope's stages.

    files    = list_files(…) in the same order (shuffled per epoch when shuffling)
    records  = TFRecordDataset(files, buffer_size=read_buffer)           workers == 0
             | files.interleave(TFRecordDataset, cycle_length=workers,
                                num_parallel_calls=workers)              workers ≥ 1 (threads)
    records  = records.shuffle(shuffle_buffer, seed)
    batch    = records.batch(batch_size).map(tf.io.parse_example)       batch before the cheap map
    batches  = batch.prefetch(prefetch)

AUTOTUNE (-1) is accepted for workers and prefetch. tf.data reads in C++ threads, out of Python's
sight: its read calls and bytes are the process's own counters (/proc/self/io syscr, rchar) over
each batch, less the reads of /proc/self/io itself (tests/test_tf.py checks them against strace).
"""

from __future__ import annotations

import functools
import os
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dlscope.errors import ConfigError, DatasetError
from dlscope.experiments.pipeline.example import encode_example
from dlscope.experiments.pipeline.prepare import Manifest, data_files
from dlscope.experiments.pipeline.readers import AUTOTUNE, Batch, ReaderConfig, proc_io
from dlscope.experiments.pipeline.tfrecord import IOCounters

INSTALL = "pip install -e '.[tf]'"


def import_tensorflow() -> Any:
    """TensorFlow, or a one-line error naming the install command."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # no C++ banner on every run
    try:
        import tensorflow as tf
    except ImportError:
        raise ConfigError(f"this needs TensorFlow, which is not installed: {INSTALL}") from None
    _warm_up(tf)
    return tf


@functools.cache
def _warm_up(tf: Any) -> None:
    """tf.data's first pipeline in a process starts its runtime (thread pools, CPU probing: about a
    second here); pay that once, before any epoch is timed."""
    record = tf.data.Dataset.from_tensors([encode_example(0, 0, b"")])
    for _ in record.interleave(tf.data.Dataset.from_tensors, num_parallel_calls=2).map(
        lambda r: tf.io.parse_example(r, _features(tf))
    ):
        pass


def _own_cost() -> tuple[int, int]:
    """Read calls and bytes that one proc_io() adds to the counters (subtracted from every delta)."""
    first, second = proc_io(), proc_io()
    if first is None or second is None:
        return 0, 0
    return second[0] - first[0], second[1] - first[1]


def _features(tf: Any) -> dict[str, Any]:
    return {
        "image": tf.io.FixedLenFeature([], tf.string),
        "label": tf.io.FixedLenFeature([], tf.int64),
        "index": tf.io.FixedLenFeature([], tf.int64),
    }


def tfdata_batches(root: str | Path, manifest: Manifest, config: ReaderConfig, epoch: int = 0) -> Iterator[Batch]:
    """One epoch through tf.data, as Batches whose `io` is what the process read meanwhile."""
    if config.fmt == "array":
        raise ConfigError("the tfdata engine reads TFRecords (formats files and tfrecord), not the .npy array")
    tf = import_tensorflow()
    files = [str(p) for p in data_files(Path(root), manifest, config.fmt)]
    if config.shuffle_buffer > 1:  # the same file order as dlscope's engine
        random.Random(f"files/{config.seed}/{epoch}").shuffle(files)
    tune = tf.data.AUTOTUNE

    def read(path: Any) -> Any:
        return tf.data.TFRecordDataset(path, buffer_size=config.read_buffer)

    names = tf.data.Dataset.from_tensor_slices(files)
    if config.workers == 0:
        records = read(names)
    else:
        parallel = tune if config.workers == AUTOTUNE else config.workers
        records = names.interleave(read, cycle_length=parallel, num_parallel_calls=parallel, deterministic=True)
    if config.shuffle_buffer > 1:
        records = records.shuffle(config.shuffle_buffer, seed=config.seed * 1_000_003 + epoch)
    features = _features(tf)
    batches = records.batch(config.batch_size).map(lambda r: tf.io.parse_example(r, features))
    if config.prefetch:
        batches = batches.prefetch(tune if config.prefetch == AUTOTUNE else config.prefetch)
    yield from _with_io(batches, Path(root), tf)


def _with_io(batches: Any, root: Path, tf: Any) -> Iterator[Batch]:
    own_calls, own_bytes = _own_cost()
    before = proc_io()
    iterator = iter(batches)
    while True:
        try:
            parsed = next(iterator)
        except StopIteration:
            return
        except tf.errors.DataLossError as e:  # TF's CRC and truncation checks
            raise DatasetError(f"tf.data: {e.message.splitlines()[0]}", root) from None
        except tf.errors.InvalidArgumentError as e:  # a record that is not a dlscope tf.train.Example
            raise DatasetError(f"tf.data could not parse a record: {e.message.splitlines()[0]}", root) from None
        now = proc_io()
        io = IOCounters(opens=None, read_seconds=None, disk_bytes=None)
        if before is not None and now is not None:
            io.reads = now[0] - before[0] - own_calls
            io.bytes = now[1] - before[1] - own_bytes
            io.disk_bytes = now[2] - before[2]
        before = now
        images = parsed["image"].numpy()
        x = np.frombuffer(b"".join(images), np.uint8).reshape(len(images), -1)
        yield Batch(
            torch.from_numpy(parsed["index"].numpy()),
            torch.from_numpy(parsed["label"].numpy()),
            torch.from_numpy(x.copy()),
            io,
        )
