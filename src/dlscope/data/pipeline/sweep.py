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
from dlscope.data.pipeline.consumer import SimulatedCompute, TrainingCompute
from dlscope.data.pipeline.example import example_bytes
from dlscope.data.pipeline.measure import COMPUTE_BOUND_WAIT, INPUT_BOUND_WAIT, measure_epoch
from dlscope.data.pipeline.prepare import Manifest, prepare_dataset, synthetic_samples
from dlscope.data.pipeline.stages import AUTOTUNE, ENGINES, ReaderConfig
from dlscope.data.pipeline.tfrecord import OVERHEAD
from dlscope.errors import ConfigError

DEFAULT_READ_BUFFER = 262_144  # tf.data's TFRecordDataset buffer, and DLIO's transfer size
SEED_FILE_BYTES = 550  # seed 003: a million 550-byte files


@dataclass(frozen=True)
class SweepPlan:
    mnist_samples: int = 5_000
    small_files: int | None = 10_000  # 550-byte files; None: the small-file tables use MNIST files
    compute_ms: float = 5.0  # simulated compute per batch (about 100k samples/s at batch 500)
    model: str = "mlp"  # the training consumer of the batch and shuffle tables
    device: str = "auto"
    threads: int | None = 1  # torch threads of the training consumer: leave the other core to the readers
    seed: int = 0
    batch_size: int = 500  # of every table but the batch-size one
    batch_sizes: tuple[int, ...] = (32, 500, 5000)
    shuffle_buffers: tuple[int, ...] = (0, 500)  # and the whole dataset (a full shuffle)
    workers: tuple[tuple[int, int], ...] = ((0, 0), (0, 2), (2, 2), (4, 2))  # (workers, prefetch)
    training_tables: bool = True
    repeats: int = 3  # each table's rows run round-robin this often; the median wall time is reported
    engines: tuple[str, ...] = ("dlscope",)  # with "tfdata", every TFRecord row also runs through tf.data

    @classmethod
    def short(cls) -> SweepPlan:
        """The lab's default (a few seconds): read buffer, layout, workers and prefetch on 1,500 MNIST files."""
        return cls(
            mnist_samples=1_500,
            small_files=None,
            batch_size=100,
            compute_ms=1.0,  # the same 100k samples/s as 5 ms per 500
            workers=((0, 0), (0, 2), (2, 2)),
            training_tables=False,
            repeats=1,
        )

    def __post_init__(self) -> None:
        if self.mnist_samples < 1 or (self.small_files is not None and self.small_files < 1):
            raise ConfigError("sample counts must be ≥ 1")
        if self.compute_ms < 0:
            raise ConfigError("simulated compute time must be ≥ 0")
        if self.repeats < 1:
            raise ConfigError("repeats must be ≥ 1")
        if not self.engines or set(self.engines) - set(ENGINES):
            raise ConfigError(f"engines must be a comma-separated subset of {','.join(ENGINES)}")


@dataclass
class TableSpec:
    key: str
    title: str
    note: str  # how it maps to the seed, and what is held fixed
    varied: str  # the column that changes
    dataset: str  # "mnist" or "small"
    consumer: str  # "train" or "simulated"
    rows: list[tuple[str, ReaderConfig, bool]] = field(default_factory=list)  # label, reader, cold


def plan_tables(plan: SweepPlan, file_bytes: int) -> list[TableSpec]:
    small = "small" if plan.small_files else "mnist"
    tables: list[TableSpec] = []
    if plan.training_tables:
        tables.append(
            TableSpec(
                "batch",
                "Batch size",
                f"Seed table 1: TFRecord shards, read buffer {DEFAULT_READ_BUFFER:,} B, no shuffle, warm cache; "
                f"the consumer is the real training step of `{plan.model}`.",
                "batch size",
                "mnist",
                "train",
                [(str(b), ReaderConfig("tfrecord", batch_size=b, seed=plan.seed), False) for b in plan.batch_sizes],
            )
        )
        tables.append(
            TableSpec(
                "shuffle",
                "Shuffle buffer",
                f"Seed table 2: batch {plan.batch_size}, TFRecord shards, warm cache, training consumer. "
                "A buffer as large as the dataset is a full shuffle; 500 only shuffles locally.",
                "shuffle buffer",
                "mnist",
                "train",
                [
                    (
                        f"{s:,}",
                        ReaderConfig("tfrecord", shuffle_buffer=s, batch_size=plan.batch_size, seed=plan.seed),
                        False,
                    )
                    for s in (*plan.shuffle_buffers, plan.mnist_samples)
                ],
            )
        )
    buffers = (file_bytes // 2, file_bytes, DEFAULT_READ_BUFFER)
    tables.append(
        TableSpec(
            "read_buffer",
            "Read buffer on small files",
            f"Seed table 3: one {file_bytes}-byte file per sample, batch {plan.batch_size}; read buffers of "
            f"half a file, one file and {DEFAULT_READ_BUFFER:,} B, each cold (page cache evicted) and warm. "
            f"No shuffle, so the rows differ only in the read calls; simulated compute {plan.compute_ms:g} ms/batch.",
            "read buffer (B)",
            small,
            "simulated",
            [
                (
                    f"{b:,}, {'cold' if cold else 'warm'}",
                    ReaderConfig("files", read_buffer=b, batch_size=plan.batch_size, seed=plan.seed),
                    cold,
                )
                for b in buffers
                for cold in (True, False)
            ],
        )
    )
    tables.append(
        TableSpec(
            "layout",
            "Small files against shards, cold and warm",
            f"The same samples as one file each, as 8 TFRecord shards and as one memory-mapped array; "
            f"read buffer {DEFAULT_READ_BUFFER:,} B, batch {plan.batch_size}, "
            f"simulated compute {plan.compute_ms:g} ms/batch.",
            "layout",
            small,
            "simulated",
            [
                (
                    f"{fmt}, {'cold' if cold else 'warm'}",
                    ReaderConfig(fmt, batch_size=plan.batch_size, seed=plan.seed),
                    cold,
                )
                for fmt in ("files", "tfrecord", "array")
                for cold in (True, False)
            ],
        )
    )
    tables.append(
        TableSpec(
            "workers",
            "Workers and prefetch",
            "Small files, cold cache (reads wait on the disk, so readers can overlap), "
            f"batch {plan.batch_size}, simulated compute. Workers are DataLoader processes, each reading its "
            "own files; without workers, prefetch is a background thread.",
            "workers / prefetch",
            small,
            "simulated",
            [
                (
                    f"{w} / {p}",
                    ReaderConfig("files", batch_size=plan.batch_size, workers=w, prefetch=p, seed=plan.seed),
                    True,
                )
                for w, p in plan.workers
            ],
        )
    )
    if "tfdata" in plan.engines:
        tables[-1].rows.append(
            (
                "AUTOTUNE",
                ReaderConfig("files", batch_size=plan.batch_size, workers=AUTOTUNE, prefetch=AUTOTUNE, engine="tfdata"),
                True,
            )
        )
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


def run_sweep(
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
                        on_row(f"{table.title}: {label} ({repeat + 1}/{plan.repeats})", total)
                    consumer = (
                        TrainingCompute(plan.model, plan.device, manifest.sample_bytes, plan.seed, plan.threads)
                        if table.consumer == "train"
                        else SimulatedCompute(plan.compute_ms / 1000)
                    )
                    row_runs.append({"label": label, **measure_epoch(root, manifest, reader, consumer, cold).to_dict()})
            out_tables.append(
                {
                    "key": table.key,
                    "title": table.title,
                    "note": table.note,
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


def ratio_text(reads_per_step: float | None) -> str:
    """Seed 003's read_times:train_times, e.g. 150:1 or 1:10."""
    if not reads_per_step:
        return "—"
    return f"{reads_per_step:.0f}:1" if reads_per_step >= 1 else f"1:{1 / reads_per_step:.0f}"


def cache_text(row: dict[str, Any]) -> str:
    if row["cache"] == "warm":
        return "warm"
    if row["cold_verified"] is None:
        return "cold (unverified)"
    disk_mb = (row["disk_bytes"] or 0) / 1e6
    return f"cold, {disk_mb:.1f} MB from disk" if row["cold_verified"] else f"NOT cold: {disk_mb:.1f} MB from disk"


COLUMNS = [
    "",
    "cache",
    "wall s",
    "wait s",
    "compute s",
    "read s",
    "read calls",
    "reads:steps",
    "MB read",
    "samples/s",
    "MB/s",
    "AU %",
    "verdict",
]


def row_cells(row: dict[str, Any]) -> list[Any]:
    """One measured epoch as the cells of COLUMNS (numbers stay numbers)."""
    return [
        row["label"],
        cache_text(row),
        round(row["wall_s"], 3),
        round(row["wait_s"], 3),
        round(row["compute_s"], 3),
        round(row["read_s"], 3) if row["read_s"] is not None else "—",
        row["reads"],
        ratio_text(row["reads_per_step"]),
        round(row["bytes_read"] / 1e6, 2),
        round(row["samples_per_s"] or 0),
        round(row["mb_per_s"] or 0, 1),
        round(100 * row["au"]),
        row["verdict"],
    ]


def findings(section: dict[str, Any]) -> list[tuple[str, str]]:
    """Verdicts and recommendations, each with the numbers it rests on (from the section alone)."""
    # the seed's findings read dlscope's own rows; tf.data's are compared with them at the end
    tables = {t["key"]: {**t, "rows": own_rows(t)} for t in section["tables"]}
    items: list[tuple[str, str]] = []
    if "batch" in tables:
        items.append(_batch_finding(tables["batch"]["rows"]))
    if "shuffle" in tables:
        items.append(_shuffle_finding(tables["shuffle"]["rows"]))
    if "read_buffer" in tables:
        items.append(_read_buffer_finding(tables["read_buffer"]))
    if "layout" in tables:
        items.extend(_layout_findings(tables["layout"]["rows"]))
    if "workers" in tables:
        items.append(_workers_finding(tables["workers"]["rows"]))
    if any(r.get("engine") == "tfdata" for t in section["tables"] for r in t["rows"]):
        items.extend(engine_findings(section["tables"]))
    input_bound = [
        f"{t['title'].lower()} ({sum(r['verdict'] == 'input-bound' for r in t['rows'])} of {len(t['rows'])})"
        for t in section["tables"]
        if any(r["verdict"] == "input-bound" for r in t["rows"])
    ]
    if input_bound:
        items.append(
            (
                "warn",
                f"Input-bound (≥ {100 * section['thresholds']['input_bound_wait']:.0f}% of the wall time waiting for "
                f"data) in {'; '.join(input_bound)}. Remedies, in the order the tables "
                "support them: shards instead of small files, a warm cache, workers and prefetch.",
            )
        )
    samples = sum(r["samples"] for t in section["tables"] for r in t["rows"])
    if section["exactly_once"]:
        items.append(
            ("good", f"Every row delivered every sample exactly once ({samples:,} deliveries checked by index).")
        )
    else:
        bad = [f"{t['title']}: {r['label']}" for t in section["tables"] for r in t["rows"] if not r["exactly_once"]]
        items.append(("bad", f"Samples lost or duplicated in: {'; '.join(bad)}."))
    return items


def _by_value(rows: list[dict[str, Any]], key: str) -> list[dict[str, Any]]:
    return sorted(rows, key=lambda r: r[key])


def _batch_finding(rows: list[dict[str, Any]]) -> tuple[str, str]:
    rows = _by_value(rows, "batch_size")
    per_sample = ", ".join(f"{r['batch_size']:,}: {1e6 * r['compute_s'] / r['samples']:.0f} µs" for r in rows)
    per_step = ", ".join(f"{r['batch_size']:,}: {1e3 * r['compute_s'] / r['steps']:.1f} ms" for r in rows)
    fastest = max(rows, key=lambda r: r["samples_per_s"] or 0)
    return (
        "info",
        f"Training time per sample by batch size — {per_sample}; per step — {per_step}. Fastest: batch "
        f"{fastest['batch_size']:,} at {fastest['samples_per_s'] or 0:,.0f} samples/s. Every step pays a fixed "
        "cost (Python, operator dispatch, the optimizer over every parameter) that small batches pay more often "
        "(the seed: batch 32 took 4× as long as 500); very large batches lose again once activations leave the "
        "CPU caches. Reads per step: "
        + ", ".join(f"{r['batch_size']:,}: {ratio_text(r['reads_per_step'])}" for r in rows)
        + ".",
    )


def _shuffle_finding(rows: list[dict[str, Any]]) -> tuple[str, str]:
    rows = _by_value(rows, "shuffle_buffer")
    none, full = rows[0], rows[-1]
    costs = ", ".join(f"{r['shuffle_buffer']:,}: {100 * (r['wall_s'] / none['wall_s'] - 1):+.0f}%" for r in rows[1:])
    return (
        "info",
        f"Shuffle buffers cost wall time against none ({none['wall_s']:.2f} s): {costs}. Only a buffer as large as "
        f"the dataset ({full['shuffle_buffer']:,}) shuffles globally; it also delays the first batch until it is "
        "full. The seed measured ×1.9 for its 500 and 50,000 buffers (graph time, TF 1.x).",
    )


def _read_buffer_finding(table: dict[str, Any]) -> tuple[str, str]:
    rows = _by_value(table["rows"], "read_buffer")
    per_file = ", ".join(
        f"{r['read_buffer']:,} B: {r['reads'] / max(r['opens'], 1):.0f}" for r in rows if r["cache"] == "warm"
    )
    by = {(r["read_buffer"], r["cache"]): r for r in rows}
    small, big = rows[0]["read_buffer"], rows[-1]["read_buffer"]
    text = (
        f"Read calls per {table['file_bytes']}-byte file — {per_file}: ceil(size / buffer) + 1, the last read "
        "finding the end of the file; beyond one file the buffer size changes nothing."
    )
    level = "info"
    for cache in ("warm", "cold"):
        a, b = by.get((small, cache)), by.get((big, cache))
        if a and b:
            text += (
                f" {cache.capitalize()}: {a['reads']:,} calls take {a['read_s']:.2f} s in open/read/close against "
                f"{b['reads']:,} in {b['read_s']:.2f} s ({100 * (a['read_s'] / max(b['read_s'], 1e-9) - 1):+.0f}%)."
            )
            level = "warn" if cache == "warm" and a["read_s"] > 1.1 * b["read_s"] else level
    text += " The seed saw 150:1 against 100:1 and equal times: opening a file costs more than reading it."
    return level, text


def _layout_findings(rows: list[dict[str, Any]]) -> list[tuple[str, str]]:
    by = {(r["fmt"], r["cache"]): r for r in rows}
    items = []
    files, shards = by.get(("files", "cold")), by.get(("tfrecord", "cold"))
    if files and shards:
        items.append(
            (
                "warn" if files["wall_s"] > 1.5 * shards["wall_s"] else "info",
                f"Cold, one file per sample takes {files['wall_s'] / shards['wall_s']:.1f}× the wall time of shards "
                f"({files['wall_s']:.2f} s against {shards['wall_s']:.2f} s; {files['mb_per_s'] or 0:.1f} against "
                f"{shards['mb_per_s'] or 0:.1f} MB/s; {files['opens']:,} opens and {files['reads']:,} reads against "
                f"{shards['opens']:,} and {shards['reads']:,}). AU {100 * files['au']:.0f}% against "
                f"{100 * shards['au']:.0f}%: pack small samples into shards. The disk delivered "
                f"{(files['disk_bytes'] or 0) / 1e6:.1f} MB for {files['bytes_read'] / 1e6:.1f} MB of small files "
                f"against {(shards['disk_bytes'] or 0) / 1e6:.1f} MB for {shards['bytes_read'] / 1e6:.1f} MB of "
                "shards: a file occupies at least one 4 KiB page.",
            )
        )
    warm = by.get(("files", "warm"))
    if files and warm:
        items.append(
            (
                "info",
                f"The page cache: small files read warm in {warm['wall_s']:.2f} s against {files['wall_s']:.2f} s "
                f"cold ({files['wall_s'] / warm['wall_s']:.1f}×); read time {warm['read_s']:.2f} s against "
                f"{files['read_s']:.2f} s. Cold runs evict file data with posix_fadvise(DONTNEED), checked by the "
                "bytes the kernel fetched from the disk; directory entries and inodes stay cached, so a first-ever "
                "read is slower still (the seed's 120 µs directory look-ups).",
            )
        )
    array = by.get(("array", "cold"))
    if array and shards:
        items.append(
            (
                "info",
                f"The memory-mapped array makes no read calls at all (page faults instead): {array['wall_s']:.2f} s "
                f"cold against {shards['wall_s']:.2f} s for shards, and it allows a true global shuffle by index.",
            )
        )
    return items


def _workers_finding(rows: list[dict[str, Any]]) -> tuple[str, str]:
    base = next((r for r in rows if r["workers"] == 0 and r["prefetch"] == 0), rows[0])
    best = min(rows, key=lambda r: r["wall_s"])
    listing = ", ".join(f"{r['label']}: {100 * r['au']:.0f}% ({r['wall_s']:.2f} s)" for r in rows)
    text = f"AU by workers / prefetch — {listing}. "
    if best is base or best["wall_s"] > 0.95 * base["wall_s"]:
        return (
            "warn",
            text + "Neither helped here: readers of small files need CPU for every open and read, extra processes "
            "compete for the same cores (see the load average), and each worker's start-up (a few hundred ms, "
            "paid every epoch without persistent workers) is not repaid on an epoch this short.",
        )
    return (
        "good",
        text + f"Best: {best['label']}, {base['wall_s'] / best['wall_s']:.1f}× faster than neither (wait "
        f"{best['wait_s']:.2f} s against {base['wait_s']:.2f} s): prefetching makes a step cost max(read, compute) "
        "instead of their sum, and workers overlap the waits on the disk.",
    )


def own_rows(table: dict[str, Any]) -> list[dict[str, Any]]:
    """dlscope's rows of a table (the seed's tables); tf.data's are shown against them separately."""
    return [{**r, "label": base_label(r)} for r in table["rows"] if r.get("engine", "dlscope") == "dlscope"]


def base_label(row: dict[str, Any]) -> str:
    """The row's label without the engine suffix (engine_label)."""
    return row["label"].rsplit(" · ", 1)[0] if " · " in row["label"] else row["label"]


def table_pairs(table: dict[str, Any]) -> list[tuple[str, dict[str, Any] | None, dict[str, Any]]]:
    """(row label, dlscope's row or None, tf.data's row) for every row tf.data ran."""
    by_label = {(base_label(r), r.get("engine", "dlscope")): r for r in table["rows"]}
    return [
        (label, by_label.get((label, "dlscope")), row)
        for (label, engine), row in by_label.items()
        if engine == "tfdata"
    ]


def engine_pairs(tables: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(table: row, dlscope's row, tf.data's row) for every row both engines ran."""
    return [
        (f"{t['title'].lower()}: {label}", dl, tf) for t in tables for label, dl, tf in table_pairs(t) if dl is not None
    ]


ENGINE_COLUMNS = ["wall s", "1st batch s", "wait s", "read calls", "AU %"]


def engine_cells(dl: dict[str, Any] | None, tf: dict[str, Any]) -> list[str]:
    """dlscope / tf.data, one cell per ENGINE_COLUMNS."""

    def pair(fmt: str, key: str, scale: int = 1) -> str:
        left = format(dl[key] * scale, fmt) if dl is not None else "—"
        return f"{left} / {format(tf[key] * scale, fmt)}"

    return [
        pair(".2f", "wall_s"),
        pair(".2f", "first_batch_s"),
        pair(".2f", "wait_s"),
        pair(",", "reads"),
        pair(".0f", "au", 100),
    ]


def engine_findings(tables: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """Where tf.data and dlscope's own stages differ on the same rows, and why."""
    pairs = engine_pairs(tables)
    if not pairs:
        return []
    ratios = [(name, tf["wall_s"] / dl["wall_s"]) for name, dl, tf in pairs if dl["wall_s"]]
    start_dl = sorted(dl["first_batch_s"] for _, dl, _ in pairs)[len(pairs) // 2]
    start_tf = sorted(tf["first_batch_s"] for _, _, tf in pairs)[len(pairs) // 2]
    start_share = sorted(tf["first_batch_s"] / tf["wall_s"] for _, _, tf in pairs if tf["wall_s"])
    faster = [f"{name} {r:.2f}×" for name, r in ratios if r < 0.9]
    slower = [f"{name} {r:.2f}×" for name, r in ratios if r > 1.1]
    same_reads = [name for name, dl, tf in pairs if dl["reads"] <= tf["reads"] <= dl["reads"] * 1.01 + 16]
    items = [
        (
            "info",
            f"tf.data against dlscope's stages on the same files, rows and consumer — wall time ratio "
            f"(tf.data ÷ dlscope) below 0.9 in {len(faster)} of {len(ratios)} rows"
            + (f" ({'; '.join(faster)})" if faster else "")
            + f", above 1.1 in {len(slower)}"
            + (f" ({'; '.join(slower)})" if slower else "")
            + f". Start-up differs: the median first batch arrives after {start_tf:.2f} s with tf.data against "
            f"{start_dl:.2f} s with dlscope (tf.data builds its dataset graph and traces the parse function for "
            f"every new pipeline), {100 * start_share[len(start_share) // 2]:.0f}% of tf.data's median wall "
            "time here — short epochs pay it in full. Past the start, tf.data reads, parses "
            "(tf.io.parse_example on a whole batch) and batches in C++ threads that do not hold Python's GIL, "
            "while dlscope parses each tf.train.Example in Python; dlscope's workers are DataLoader processes "
            "started every epoch, tf.data's interleave runs threads in one process.",
        ),
        (
            "info",
            f"Read calls agree in {len(same_reads)} of {len(pairs)} rows: both engines read a file in "
            "buffer-sized calls until one returns nothing, ceil(size / buffer) + 1 per file (tf.data with "
            "pread64, dlscope with read). tf.data's counts are the process's read calls during the epoch, so "
            "they include a few reads of its runtime's own (/proc, /sys) on top of the data reads.",
        ),
    ]
    au = [(name, dl["au"], tf["au"]) for name, dl, tf in pairs if abs(tf["au"] - dl["au"]) >= 0.1]
    if au:
        items.append(
            (
                "info",
                "AU differs by 10 points or more in: "
                + "; ".join(f"{name} {100 * a:.0f}% (dlscope) against {100 * b:.0f}% (tf.data)" for name, a, b in au)
                + ".",
            )
        )
    return items
