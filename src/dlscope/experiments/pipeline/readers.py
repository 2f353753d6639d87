"""Reader stages composed as in tf.data: read → parse → shuffle → batch → decode, then workers
and prefetch.

    records  = read_records(file, read_buffer)     # os.read of read_buffer bytes, CRCs checked
    samples  = parse_records(file, records)        # tf.data's map(parse): tf.train.Example → fields
    samples  = shuffle(samples, buffer_size, rng)  # tf.data's shuffle buffer
    groups   = batches(samples, batch_size)
    batch    = decode(group)                       # one copy of the image bytes per batch

`PipelineDataset` is a torch IterableDataset: each DataLoader worker reads its own share of the
files (every file read by exactly one worker, so no sample is seen twice), shuffles its own
stream and makes its own batches. `iterate_batches` adds prefetching: the DataLoader's
`prefetch_factor` with workers, a background thread with a bounded queue without them.
"""

from __future__ import annotations

import queue
import random
import threading
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple, TypeVar

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from dlscope.errors import DatasetError, DlscopeError, require
from dlscope.experiments.pipeline.example import parse_example
from dlscope.experiments.pipeline.prepare import ROW_HEADER, Manifest, data_files
from dlscope.experiments.pipeline.tfrecord import OVERHEAD, IOCounters, TFRecordError, read_records
from dlscope.protowire import FormatError

T = TypeVar("T")


class Batch(NamedTuple):
    index: torch.Tensor  # int64 sample indices (for the exactly-once check)
    label: torch.Tensor  # int64
    x: torch.Tensor  # uint8 (n, sample_bytes)
    io: IOCounters  # what reading this batch cost (deltas since the worker's previous batch)


ENGINES = ("dlscope", "tfdata")
AUTOTUNE = -1  # tf.data.AUTOTUNE, for the tfdata engine's workers and prefetch


@dataclass(frozen=True)
class ReaderConfig:
    fmt: str = "tfrecord"
    read_buffer: int = 262_144  # bytes per read system call (tf.data's default buffer)
    shuffle_buffer: int = 0  # records; 0 or 1: no shuffling
    batch_size: int = 500
    workers: int = 0
    prefetch: int = 2  # batches in flight per worker (DataLoader) or in the thread queue
    seed: int = 0
    engine: str = "dlscope"  # or "tfdata": the same row through tf.data (tfdata.py)

    def __post_init__(self) -> None:
        lowest = AUTOTUNE if self.engine == "tfdata" else 0
        require(
            (self.fmt in ("files", "tfrecord", "array"), "format must be files, tfrecord or array"),
            (self.engine in ENGINES, f"engine must be one of {', '.join(ENGINES)}"),
            (self.read_buffer >= 1, "read buffer must be ≥ 1 byte"),
            (self.shuffle_buffer >= 0, "shuffle buffer must be ≥ 0"),
            (self.batch_size >= 1, "batch size must be ≥ 1"),
            (self.workers >= lowest, "workers must be ≥ 0 (-1, AUTOTUNE, with the tfdata engine)"),
            (self.prefetch >= lowest, "prefetch must be ≥ 0 (-1, AUTOTUNE, with the tfdata engine)"),
            (
                self.engine == "tfdata" or self.workers == 0 or self.prefetch >= 1,
                "with workers, prefetch (prefetch_factor) must be ≥ 1",
            ),
        )


def shuffle(records: Iterable[T], buffer_size: int, rng: random.Random) -> Iterator[T]:
    """tf.data's shuffle: hold `buffer_size` records, emit one drawn uniformly, refill its slot.

    A buffer smaller than the dataset only shuffles locally: a record can move at most about
    `buffer_size` places earlier. At the end of the input the rest drain in random order.
    """
    if buffer_size <= 1:
        yield from records
        return
    buffer: list[T] = []
    for record in records:
        if len(buffer) < buffer_size:
            buffer.append(record)
            continue
        i = rng.randrange(buffer_size)
        yield buffer[i]
        buffer[i] = record
    rng.shuffle(buffer)
    yield from buffer


def batches(records: Iterable[T], batch_size: int) -> Iterator[list[T]]:
    """Groups of `batch_size` (the last may be short). A full group is handed on only once the
    next record has arrived or the input has ended, so the reads that discover the end of the
    data are counted with the last batch rather than after it."""
    group: list[T] = []
    for record in records:
        if len(group) == batch_size:
            yield group
            group = []
        group.append(record)
    if group:
        yield group


class Sample(NamedTuple):
    index: int
    label: int
    image: bytes


def parse_records(path: Path, records: Iterable[bytes]) -> Iterator[Sample]:
    """tf.data's map(parse_single_example): each record's tf.train.Example → a Sample; a record
    that is not one (a CRC-valid record of another kind) is named by file and offset."""
    offset = 0
    for record in records:
        try:
            yield Sample(*parse_example(record))
        except FormatError as e:
            raise TFRecordError(f"record at offset {offset} is not a dlscope tf.train.Example: {e}", path) from None
        offset += OVERHEAD + len(record)


def decode(group: list[Sample], io: IOCounters) -> Batch:
    """Samples → tensors, with one copy of the image bytes per batch."""
    index = torch.tensor([s.index for s in group], dtype=torch.int64)
    label = torch.tensor([s.label for s in group], dtype=torch.int64)
    x = np.frombuffer(bytearray(b"".join(s.image for s in group)), np.uint8).reshape(len(group), -1)
    return Batch(index, label, torch.from_numpy(x), io)


def proc_io() -> tuple[int, int, int] | None:
    """(read system calls, bytes they returned, bytes fetched from a device) of this process so far."""
    try:
        with open("/proc/self/io", "rb") as f:
            values = dict(line.split(b":") for line in f.read().splitlines())
    except OSError:
        return None
    return int(values[b"syscr"]), int(values[b"rchar"]), int(values[b"read_bytes"])


def disk_read_bytes() -> int | None:
    """Bytes this process has made the kernel fetch from a storage device."""
    counters = proc_io()
    return None if counters is None else counters[2]


def array_samples(path: Path, manifest: Manifest, rows: range, io: IOCounters) -> Iterator[Sample]:
    """Rows of the memory-mapped array: page faults, not read calls (io.reads stays 0)."""
    try:
        array = np.load(path, mmap_mode="r")
    except (OSError, ValueError) as e:
        raise DatasetError(f"not a readable .npy array ({e})", path) from None
    expected = (manifest.samples, manifest.row_bytes)
    if array.shape != expected or array.dtype != np.uint8:
        raise DatasetError(f"array is {array.dtype} {array.shape}, the manifest says uint8 {expected}", path)
    for i in rows:
        record = array[i].tobytes()
        io.bytes += len(record)
        yield Sample(*ROW_HEADER.unpack_from(record), record[ROW_HEADER.size :])


class PipelineDataset(IterableDataset):
    """One epoch of batches from a prepared dataset, sharded across DataLoader workers."""

    def __init__(self, root: str | Path, manifest: Manifest, config: ReaderConfig, epoch: int = 0) -> None:
        self.root = Path(root)
        self.manifest = manifest
        self.config = config
        self.epoch = epoch

    def _samples(self, worker: int, workers: int, io: IOCounters) -> Iterator[Sample]:
        config, files = self.config, data_files(self.root, self.manifest, self.config.fmt)
        if config.fmt == "array":
            n = self.manifest.samples
            yield from array_samples(
                files[0], self.manifest, range(worker * n // workers, (worker + 1) * n // workers), io
            )
            return
        if config.shuffle_buffer > 1:  # as tf.data's list_files(shuffle=True): file order too
            random.Random(f"files/{config.seed}/{self.epoch}").shuffle(files)
        for path in files[worker::workers]:
            yield from parse_records(path, read_records(path, config.read_buffer, io))

    def __iter__(self) -> Iterator[Batch | DlscopeError]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        io = IOCounters(disk_bytes=disk_read_bytes())
        rng = random.Random(f"shuffle/{self.config.seed}/{self.epoch}/{worker}")
        records = shuffle(self._samples(worker, workers, io), self.config.shuffle_buffer, rng)
        reported = io.copy()
        try:
            for group in batches(records, self.config.batch_size):
                io.disk_bytes = disk_read_bytes()
                yield decode(group, io - reported)
                reported = io.copy()
        except DlscopeError as e:
            if info is None:
                raise
            # handed over as an item: torch would re-raise it wrapped in the worker's traceback,
            # and the user should see the one line naming the file and the offset
            yield e


def iterate_batches(dataset: PipelineDataset, pin_memory: bool = False) -> Iterator[Batch]:
    """The dataset's batches through a DataLoader (workers, prefetch_factor, pinned memory), or,
    without workers, through a background thread that keeps `prefetch` batches ready."""
    config = dataset.config
    with warnings.catch_warnings():
        # torch warns when workers outnumber cores; for I/O-bound readers that is the point
        warnings.filterwarnings("ignore", message="This DataLoader will create")
        loader = DataLoader(
            dataset,
            batch_size=None,  # the dataset batches itself
            num_workers=config.workers,
            prefetch_factor=config.prefetch if config.workers else None,
            pin_memory=pin_memory,
        )
        batches = iter(loader)
    if config.workers:
        return raise_worker_errors(batches)
    return batches if config.prefetch == 0 else prefetch_thread(batches, config.prefetch)


def raise_worker_errors(items: Iterator[Batch | DlscopeError]) -> Iterator[Batch]:
    for item in items:
        if isinstance(item, DlscopeError):
            raise item
        yield item


_DONE = object()


def prefetch_thread(source: Iterator[Batch], depth: int) -> Iterator[Batch]:
    """tf.data's prefetch(depth) without processes: a producer thread fills a bounded queue, so
    reading (system calls and numpy release the GIL) overlaps the consumer."""
    ready: queue.Queue = queue.Queue(maxsize=depth)
    failure: list[BaseException] = []
    stop = threading.Event()

    def put(item: object) -> bool:
        while not stop.is_set():
            try:
                ready.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for batch in source:
                if not put(batch):
                    return  # the consumer stopped early
        except BaseException as e:  # handed to the consumer, raised there
            failure.append(e)
        put(_DONE)

    thread = threading.Thread(target=produce, name="dlscope-prefetch", daemon=True)
    thread.start()
    try:
        while (item := ready.get()) is not _DONE:
            yield item
        if failure:
            raise failure[0]
    finally:
        stop.set()
        thread.join(timeout=5)
