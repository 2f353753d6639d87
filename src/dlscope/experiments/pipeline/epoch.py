"""One measured epoch: where the consumer's time went, what the readers did, and a verdict.

    wall     = from asking for the first batch to the end of the last step
    wait     = time the consumer spent blocked on the next batch (the data stall)
    compute  = time inside the consumer (training step, or the simulated time)
    AU       = compute / wall   (DLIO's accelerator utilisation; its pass mark is 90%)

Read time and read calls are summed over every reader (worker processes included), so with
workers the read time can exceed the wall time: it ran in parallel.
"""

from __future__ import annotations

import hashlib
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from dlscope.errors import DatasetError
from dlscope.experiments.pipeline.consumer import Consumer
from dlscope.experiments.pipeline.prepare import Manifest, data_files
from dlscope.experiments.pipeline.readers import PipelineDataset, ReaderConfig, iterate_batches
from dlscope.experiments.pipeline.tfdata import import_tensorflow, tfdata_batches
from dlscope.experiments.pipeline.tfrecord import IOCounters

INPUT_BOUND_WAIT = 0.20  # TF Profiler: a step is input-bound when ≥ 20% of it waits for input
COMPUTE_BOUND_WAIT = 0.05  # below 5% waiting, input is not what limits the step
COLD_EVIDENCE = 0.5  # a cold run must fetch at least half the data from the device


@dataclass
class EpochMeasurement:
    engine: str
    fmt: str
    read_buffer: int
    shuffle_buffer: int
    batch_size: int
    workers: int
    prefetch: int
    consumer: str
    cache: str  # "cold" (evicted with posix_fadvise before the run) or "warm"
    cold_verified: bool | None  # cold: did the data really come from the device? (None: unknown)
    wall_s: float
    first_batch_s: float  # from asking to the first batch: the pipeline's start-up
    wait_s: float
    compute_s: float
    read_s: float | None  # None: not observable (tf.data)
    reads: int
    opens: int | None
    bytes_read: int
    disk_bytes: int | None
    steps: int
    samples: int
    exactly_once: bool
    missing: int
    duplicated: int
    order_digest: str  # fingerprint of the delivery order: equal digests, equal order

    @property
    def au(self) -> float:
        return self.compute_s / self.wall_s if self.wall_s else 0.0

    @property
    def wait_share(self) -> float:
        return self.wait_s / self.wall_s if self.wall_s else 0.0

    @property
    def verdict(self) -> str:
        return verdict(self.wait_share)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.update(
            au=self.au,
            wait_share=self.wait_share,
            verdict=self.verdict,
            reads_per_step=self.reads / self.steps if self.steps else None,
            samples_per_s=self.samples / self.wall_s if self.wall_s else None,
            mb_per_s=self.bytes_read / 1e6 / self.wall_s if self.wall_s else None,
            read_us_per_call=1e6 * self.read_s / self.reads if self.reads and self.read_s is not None else None,
        )
        return out


def verdict(wait_share: float) -> str:
    if wait_share >= INPUT_BOUND_WAIT:
        return "input-bound"
    if wait_share < COMPUTE_BOUND_WAIT:
        return "compute-bound"
    return "balanced"


def evict_page_cache(paths: list[Path]) -> None:
    """Drop the files' cached pages (posix_fadvise DONTNEED: no root needed). Clean pages only —
    `prepare` syncs what it writes — and file data only: directory entries and inodes stay cached."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def measure_epoch(
    root: str | Path, manifest: Manifest, reader: ReaderConfig, consumer: Consumer, cold: bool, epoch: int = 0
) -> EpochMeasurement:
    """Feed one epoch to `consumer` and account for every second and every read."""
    root = Path(root)
    files = data_files(root, manifest, reader.fmt)
    missing = [path for path in files if not path.is_file()]
    if missing:
        raise DatasetError(
            f"missing, and {len(missing) - 1:,} more of the {len(files):,} {reader.fmt!r} data files", missing[0]
        )
    if cold:
        evict_page_cache(files)
    if reader.engine == "tfdata":
        import_tensorflow()  # seconds of imports: not the epoch's time
    io = IOCounters()
    indices: list[torch.Tensor] = []
    wait = compute = 0.0
    first: float | None = None
    start = time.perf_counter()
    if reader.engine == "tfdata":
        batches = tfdata_batches(root, manifest, reader, epoch)
    else:
        batches = iterate_batches(PipelineDataset(root, manifest, reader, epoch), pin_memory=consumer.pin_memory)
    while True:
        asked = time.perf_counter()
        batch = next(batches, None)
        got = time.perf_counter()
        wait += got - asked
        if first is None:
            first = got - start
        if batch is None:
            break
        consumer(batch)
        compute += time.perf_counter() - got
        io = io + batch.io
        indices.append(batch.index)
    wall = time.perf_counter() - start
    delivered = torch.cat(indices) if indices else torch.zeros(0, dtype=torch.int64)
    counts = torch.bincount(delivered, minlength=manifest.samples)
    missing = int((counts[: manifest.samples] == 0).sum())
    duplicated = int((counts > 1).sum()) + int(counts[manifest.samples :].sum())
    return EpochMeasurement(
        **{k: getattr(reader, k) for k in ("engine", "fmt", "read_buffer", "shuffle_buffer", "batch_size")},
        workers=reader.workers,
        prefetch=reader.prefetch,
        consumer=consumer.name,
        cache="cold" if cold else "warm",
        cold_verified=(io.disk_bytes >= COLD_EVIDENCE * manifest.data_bytes(reader.fmt))
        if cold and io.disk_bytes is not None
        else None,
        wall_s=wall,
        first_batch_s=first or 0.0,
        wait_s=wait,
        compute_s=compute,
        read_s=io.read_seconds,
        reads=io.reads,
        opens=io.opens,
        bytes_read=io.bytes,
        disk_bytes=io.disk_bytes,
        steps=len(indices),
        samples=len(delivered),
        exactly_once=missing == 0 and duplicated == 0 and len(delivered) == manifest.samples,
        missing=missing,
        duplicated=duplicated,
        order_digest=hashlib.sha1(delivered.numpy().astype("<i8").tobytes()).hexdigest()[:16],
    )
