"""`dlscope pipeline sweep`: seed 003's three tables (batch size, shuffle buffer, read buffer on
small files) at laptop scale, plus file layout and cache state, plus workers and prefetch.

Two prepared datasets: MNIST images (784-byte samples; the training consumer can learn from them)
and synthetic samples sized so that one sample per file makes a 550-byte file, as in the seed's
read-buffer experiment. Every row is one measured epoch; every row is checked for exactly-once
delivery.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from dlscope.data.mnist import MNIST
from dlscope.experiments.pipeline.consumer import SimulatedCompute, TrainingCompute
from dlscope.experiments.pipeline.epoch import COMPUTE_BOUND_WAIT, INPUT_BOUND_WAIT, measure_epoch
from dlscope.experiments.pipeline.example import example_bytes
from dlscope.experiments.pipeline.prepare import Manifest, prepare_dataset, synthetic_samples
from dlscope.experiments.pipeline.readers import AUTOTUNE, ReaderConfig
from dlscope.experiments.pipeline.tfrecord import OVERHEAD
from dlscope.options import SweepPlan

DEFAULT_READ_BUFFER = 262_144  # tf.data's TFRecordDataset buffer, and DLIO's transfer size
SEED_FILE_BYTES = 550  # seed 003: a million 550-byte files


@dataclass
class TableSpec:
    key: str  # report.sections.pipeline titles it and says how it maps to the seed
    varied: str  # the column that changes
    dataset: str  # "mnist" or "small"
    consumer: str  # "train" or "simulated"
    rows: list[tuple[str, ReaderConfig, bool]] = field(default_factory=list)  # label, reader, cold


def plan_tables(plan: SweepPlan, file_bytes: int) -> list[TableSpec]:
    small = "small" if plan.small_files else "mnist"
    at = {"batch_size": plan.batch_size, "seed": plan.seed}  # every table's but the batch-size one's
    caches = ((True, "cold"), (False, "warm"))
    tables: list[TableSpec] = []
    if plan.training_tables:
        batch = [(str(b), ReaderConfig("tfrecord", batch_size=b, seed=plan.seed), False) for b in plan.batch_sizes]
        shuffles = (*plan.shuffle_buffers, plan.mnist_samples)
        shuffle = [(f"{s:,}", ReaderConfig("tfrecord", shuffle_buffer=s, **at), False) for s in shuffles]
        tables += [
            TableSpec("batch", "batch size", "mnist", "train", batch),
            TableSpec("shuffle", "shuffle buffer", "mnist", "train", shuffle),
        ]
    buffers = (file_bytes // 2, file_bytes, DEFAULT_READ_BUFFER)
    read = [(f"{b:,}, {c}", ReaderConfig("files", read_buffer=b, **at), cold) for b in buffers for cold, c in caches]
    formats = ("files", "tfrecord", "array")
    layout = [(f"{fmt}, {c}", ReaderConfig(fmt, **at), cold) for fmt in formats for cold, c in caches]
    workers = [(f"{w} / {p}", ReaderConfig("files", workers=w, prefetch=p, **at), True) for w, p in plan.workers]
    if "tfdata" in plan.engines:
        tuned = ReaderConfig("files", batch_size=plan.batch_size, workers=AUTOTUNE, prefetch=AUTOTUNE, engine="tfdata")
        workers.append(("AUTOTUNE", tuned, True))
    tables += [
        TableSpec("read_buffer", "read buffer (B)", small, "simulated", read),
        TableSpec("layout", "layout", small, "simulated", layout),
        TableSpec("workers", "workers / prefetch", small, "simulated", workers),
    ]
    for table in tables:
        table.rows = [
            (engine_label(label, engine, plan.engines), replace(reader, engine=engine), cold)
            for label, reader, cold in table.rows
            for engine in plan.engines
            if engine_runs(engine, reader)
        ]
    return tables


def engine_runs(engine: str, reader: ReaderConfig) -> bool:
    """tf.data reads TFRecords (not the array); AUTOTUNE is tf.data's alone."""
    if engine == "tfdata":
        return reader.fmt != "array"
    return reader.workers != AUTOTUNE


def engine_label(label: str, engine: str, engines: tuple[str, ...]) -> str:
    """A row's label, with its engine when the sweep runs more than one (report.sections.pipeline.base_label)."""
    return label if len(engines) == 1 else f"{label} · {'tf.data' if engine == 'tfdata' else engine}"


def prepare_sweep_data(workdir: Path, mnist: MNIST, plan: SweepPlan) -> dict[str, tuple[Path, Manifest]]:
    n = min(plan.mnist_samples, len(mnist.train_labels))
    images = mnist.train_images[:n].reshape(n, -1).numpy()
    labels = mnist.train_labels[:n].numpy().astype(np.uint8)
    data = {"mnist": (workdir / "mnist", prepare_dataset(workdir / "mnist", labels, images, "mnist"))}
    if plan.small_files:
        sample_bytes = next(n for n in range(SEED_FILE_BYTES) if OVERHEAD + example_bytes(n) == SEED_FILE_BYTES)
        labels, samples = synthetic_samples(plan.small_files, sample_bytes, plan.seed)
        data["small"] = (workdir / "small", prepare_dataset(workdir / "small", labels, samples, "synthetic"))
    return data


def run_parameter_sweep(
    plan: SweepPlan,
    workdir: Path,
    mnist: MNIST,
    on_row: Callable[[str, int], None] | None = None,
    remove_data: bool = False,
) -> dict[str, Any]:
    """Prepare the data, measure every row of every table, and return the results section.

    `on_row(description, rows_in_total)` is called before each row (a progress bar). The prepared
    data stays under `workdir` for `dlscope pipeline run` unless `remove_data` (deleting thousands of
    small files is itself slow: unlink costs milliseconds per file on a filesystem mounted with discard)."""
    workdir.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()  # timings on a shared machine are only as good as its quiet
    try:
        data = prepare_sweep_data(workdir, mnist, plan)
        tables = plan_tables(plan, data["small" if plan.small_files else "mnist"][1].record_file_bytes)
        out_tables = []
        total = plan.repeats * sum(len(t.rows) for t in tables)
        for table in tables:
            root, manifest = data[table.dataset]
            runs: list[list[dict[str, Any]]] = [[] for _ in table.rows]
            for repeat in range(plan.repeats):  # interleaved, so a slow spell of a shared machine hits every row
                for (label, reader, cold), row_runs in zip(table.rows, runs, strict=True):
                    if on_row is not None:
                        on_row(f"{table.varied}: {label} ({repeat + 1}/{plan.repeats})", total)
                    consumer = (
                        TrainingCompute(plan.model, plan.device, manifest.sample_bytes, plan.seed, plan.threads)
                        if table.consumer == "train"
                        else SimulatedCompute(plan.compute_ms / 1000)
                    )
                    row_runs.append({"label": label, **measure_epoch(root, manifest, reader, consumer, cold).to_dict()})
            out_tables.append(
                {
                    "key": table.key,
                    "varied": table.varied,
                    "samples": manifest.samples,
                    "file_bytes": manifest.record_file_bytes,
                    "rows": [median_run(row_runs) for row_runs in runs],
                }
            )
    finally:
        if remove_data:
            for name in ("mnist", "small"):
                shutil.rmtree(workdir / name, ignore_errors=True)
    return {
        "plan": asdict(plan),
        "datasets": {
            key: {**asdict(manifest), "data_bytes": {f: manifest.data_bytes(f) for f in manifest.formats}}
            for key, (_, manifest) in data.items()
        },
        "data_kept": None if remove_data else {key: str(root) for key, (root, _) in data.items()},
        "thresholds": {"input_bound_wait": INPUT_BOUND_WAIT, "compute_bound_wait": COMPUTE_BOUND_WAIT},
        "default_read_buffer": DEFAULT_READ_BUFFER,
        "machine": {
            "cpus": os.cpu_count(),
            "load_average": [round(x, 2) for x in load_before],
            "load_after": [round(x, 2) for x in os.getloadavg()],
        },
        "tables": out_tables,
        "exactly_once": all(row["exactly_once"] for t in out_tables for row in t["rows"]),
    }


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run with the median wall time, with every run's wall time and the delivery check of all."""
    ordered = sorted(runs, key=lambda r: r["wall_s"])
    return {
        **ordered[(len(ordered) - 1) // 2],
        "wall_s_runs": [r["wall_s"] for r in runs],
        "exactly_once": all(r["exactly_once"] for r in runs),
    }
