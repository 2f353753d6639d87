"""Every rank's per-step records as one Parquet dataset (Arrow schemas below; docs/run-directory.md
documents them for users), written by `dlscope merge` from the ranks' record files and read by
pandas, polars, DuckDB, Spark or Trino without dlscope:

    <run>/parquet/steps/host=<host>/rank=<rank>/part-0.parquet        one row per training step
    <run>/parquet/collectives/host=<host>/rank=<rank>/part-0.parquet  one row per collective
    <run>/parquet/ranks.parquet                                       one row per rank

`host` and `rank` are Hive partition keys (in the path, not in the files). Times are the host's
CLOCK_REALTIME seconds as recorded, not corrected: each host's clock offset is in results.json.
Every file carries its table's name and schema version in its key-value metadata; a reader refuses
a version newer than its own. A rank is written by one call, its records read once, one rank at a
time: memory stays that of one rank's rows at any number of ranks.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from dlscope.analysis import steptable
from dlscope.analysis.stepfile import CollectiveFile, StepFile
from dlscope.contract.records import NONE_U4
from dlscope.errors import RunDirError

SCHEMA_VERSION = 1
TABLE_KEY, VERSION_KEY = b"dlscope.table", b"dlscope.schema_version"
STEPS, COLLECTIVES, RANKS = "steps", "collectives", "ranks"
PART = "part-0.parquet"
_PARTS = steptable.PARTS  # data, gap, forward, backward, optimizer, other

STEPS_SCHEMA = pa.schema(
    [
        ("step", pa.uint32()),  # the step's index in the rank's stream of steps
        ("start", pa.float64()),  # CLOCK_REALTIME s on the rank's host
        ("seconds", pa.float32()),
        *((part, pa.float32()) for part in _PARTS),  # the step's anatomy (s): they add up to `seconds`
        ("profiler_seconds", pa.float32()),  # dlscope's profiler's own time after the step
        ("steady", pa.bool_()),  # not the first, not profiled: the steps the summaries count
        ("profiled", pa.dictionary(pa.int8(), pa.string())),  # null, wait, warmup, active
        ("profiler_step", pa.uint32()),  # N of ProfilerStep#N; null: none
        ("peak_rss_kib", pa.uint32()),  # null: not measured
        ("peak_cuda_kib", pa.uint32()),
        ("backwards", pa.uint16()),
        ("forwards", pa.uint16()),
    ]
)
COLLECTIVES_SCHEMA = pa.schema(
    [
        ("seq", pa.uint32()),  # the rank's n-th collective, from 1
        ("step", pa.uint32()),  # the step it was launched in (steps.step)
        ("index", pa.uint16()),  # its place among the step's collectives, from 0
        ("op", pa.dictionary(pa.int8(), pa.string())),  # all_reduce, broadcast, ...
        ("launch", pa.float64()),  # CLOCK_REALTIME s on the rank's host: entered
        ("done", pa.float64()),  # completed on this rank; null: never (stopped inside it)
    ]
)
RANKS_SCHEMA = pa.schema(
    [
        ("rank", pa.int32()),
        ("host", pa.string()),  # the partition's name: the machine's, with "-node<N>" when nodes share one
        ("hostname", pa.string()),
        ("node", pa.int32()),  # torchrun's node (GROUP_RANK); null outside torchrun
        ("local_rank", pa.int32()),
        ("pid", pa.int64()),
        ("world_size", pa.int32()),
        ("steps", pa.int64()),
        ("collectives", pa.int64()),
        ("source", pa.string()),  # the run directory its records came from
    ]
)
SCHEMAS = {STEPS: STEPS_SCHEMA, COLLECTIVES: COLLECTIVES_SCHEMA, RANKS: RANKS_SCHEMA}


def table_dir(root: Path, table: str) -> Path:
    return root / table


def partition(root: Path, table: str, host: str, rank: int) -> Path:
    return root / table / f"host={host}" / f"rank={rank}" / PART


def _metadata(table: str) -> dict[bytes, bytes]:
    return {TABLE_KEY: table.encode(), VERSION_KEY: str(SCHEMA_VERSION).encode()}


def _write(table: pa.Table, path: Path, name: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table.replace_schema_metadata(_metadata(name)), path, compression="zstd")


def steps_table(steps: StepFile) -> pa.Table:
    """One rank's steps (the stream that counts: steptable.open_stream) as a STEPS_SCHEMA table."""
    _, stream = steptable.open_stream(steps)
    rows = np.asarray(stream)
    codes = steps.codes
    parts = steptable.part_seconds(rows, codes["data_source"].index("loader"))
    none = codes["profiled"].index(None)
    columns: dict[str, Any] = {
        "step": rows["i"],
        "start": rows["start"],
        "seconds": rows["seconds"],
        **{part: parts[part].astype(np.float32) for part in _PARTS},
        "profiler_seconds": rows["profiler_seconds"],
        "steady": steptable.steady_steps(rows, np.arange(len(rows)), codes),
        "profiled": pa.DictionaryArray.from_arrays(
            pa.array(rows["profiled"].astype(np.int8), mask=rows["profiled"] == none),
            pa.array([value or "" for value in codes["profiled"]], pa.string()),
        ),
    }
    for name in ("profiler_step", "peak_rss_kib", "peak_cuda_kib"):
        columns[name] = pa.array(rows[name], pa.uint32(), mask=rows[name] == NONE_U4)
    columns["backwards"], columns["forwards"] = rows["backwards"], rows["forwards"]
    return pa.table(columns, schema=STEPS_SCHEMA)


def collectives_table(collectives: CollectiveFile) -> pa.Table:
    """One rank's collectives as a COLLECTIVES_SCHEMA table (index: the place in its step)."""
    rows = collectives.read()
    return collectives_from_arrays(rows["seq"], rows["step"], rows["op"], collectives.ops, rows["launch"], rows["done"])


def collectives_from_arrays(
    seq: np.ndarray, step: np.ndarray, op: np.ndarray, ops: list[str], launch: np.ndarray, done: np.ndarray
) -> pa.Table:
    """A COLLECTIVES_SCHEMA table from arrays in launch order (`op`: codes into `ops`; `done`: NaN
    where it never completed)."""
    index = _index_in_step(np.asarray(step))
    return pa.table(
        {
            "seq": np.asarray(seq, np.uint32),
            "step": np.asarray(step, np.uint32),
            "index": index.astype(np.uint16),
            "op": pa.DictionaryArray.from_arrays(pa.array(np.asarray(op, np.int8)), pa.array(ops, pa.string())),
            "launch": np.asarray(launch, np.float64),
            "done": pa.array(done, pa.float64(), mask=np.isnan(done)),
        },
        schema=COLLECTIVES_SCHEMA,
    )


def _index_in_step(step: np.ndarray) -> np.ndarray:
    """Each row's place among the rows of its step (rows in launch order, steps non-decreasing)."""
    if not len(step):
        return np.zeros(0, np.int64)
    first = np.r_[True, step[1:] != step[:-1]]
    starts = np.flatnonzero(first)
    return np.arange(len(step)) - np.repeat(starts, np.diff(np.r_[starts, len(step)]))


def write_rank(root: Path, host: str, rank: int, steps: pa.Table | None, collectives: pa.Table | None) -> None:
    if steps is not None:
        _write(steps, partition(root, STEPS, host, rank), STEPS)
    if collectives is not None:
        _write(collectives, partition(root, COLLECTIVES, host, rank), COLLECTIVES)


def write_ranks(root: Path, rows: list[dict[str, Any]]) -> None:
    _write(pa.Table.from_pylist(rows, schema=RANKS_SCHEMA), root / f"{RANKS}.parquet", RANKS)


def read_ranks(root: Path) -> list[dict[str, Any]]:
    path = root / f"{RANKS}.parquet"
    check_file(path, RANKS)
    return pq.read_table(path).to_pylist()


def check_file(path: Path, table: str) -> None:
    """A Parquet file of this dataset that can be read: whole (its footer is there), the table it
    says it is, of a schema version this dlscope reads. One line naming the file otherwise."""
    try:
        metadata = pq.read_metadata(path).metadata or {}
    except FileNotFoundError:
        raise RunDirError("missing from the Parquet dataset", path) from None
    except (OSError, pa.ArrowException) as e:
        raise RunDirError(f"not a readable Parquet file, cut short or damaged ({e})", path) from None
    if metadata.get(TABLE_KEY) != table.encode():
        raise RunDirError(f"not dlscope's {table} table (its metadata names {metadata.get(TABLE_KEY)!r})", path)
    version = metadata.get(VERSION_KEY, b"").decode()
    if not version.isdigit() or int(version) > SCHEMA_VERSION:
        raise RunDirError(
            f"{table} schema version {version or '?'} is newer than this dlscope reads ({SCHEMA_VERSION})", path
        )


def dataset_files(root: Path, table: str) -> list[tuple[str, int, Path]]:
    """(host, rank, file) of each partition of `table` under `root`."""
    out = []
    for path in sorted(table_dir(root, table).glob(f"host=*/rank=*/{PART}")):
        host, rank = path.parent.parent.name.removeprefix("host="), path.parent.name.removeprefix("rank=")
        out.append((host, int(rank), path))
    return out


def link_or_copy(source: Path, target: Path) -> None:
    """The file in a second dataset: a hard link where the file system allows, else a copy."""
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)


@dataclass
class Written:
    """What a dataset holds, for the queries: where, and which tables have rows."""

    root: Path
    tables: set[str]


def tables_present(root: Path, names: Iterable[str] = (STEPS, COLLECTIVES)) -> Written:
    return Written(root, {name for name in names if dataset_files(root, name)})


# a trace names a collective by its c10d op (analysis/ranks.collective_kind): the Python API's name
_OP_OF_KIND = {
    "allreduce": "all_reduce",
    "allgather": "all_gather",
    "allgather_into_tensor": "all_gather_into_tensor",
    "reduce_scatter": "reduce_scatter",
    "reduce_scatter_tensor": "reduce_scatter_tensor",
    "broadcast": "broadcast",
    "barrier": "barrier",
    "alltoall": "all_to_all",
    "alltoall_base": "all_to_all_single",
    "reduce": "reduce",
    "gather": "gather",
    "scatter": "scatter",
    "send": "send",
    "recv": "recv",
}


def collectives_from_trace(trace: Path, rank: int, steps: pa.Table | None) -> pa.Table | None:
    """A rank's profiled steps' collectives from its profiler trace (read, reduced, dropped: one
    trace in memory at a time), where the rank has no collectives file. Their step is the step row
    whose ProfilerStep#N holds the launch; seq counts within the trace."""
    from dlscope.analysis.kineto import read_rank
    from dlscope.analysis.ranks import collective_kind

    if steps is None:
        return None
    known = steps.filter(steps["profiler_step"].is_valid())
    step_of = dict(zip(known["profiler_step"].to_pylist(), known["step"].to_pylist(), strict=True))
    reduced = read_rank(trace, rank)
    spans = [(step_of.get(n), start, end) for n, start, end in reduced.steps]
    ops: list[str] = []
    rows: list[tuple[int, int, float, float]] = []
    for c in reduced.collectives:
        step = next((s for s, start, end in spans if start <= c.start <= end), None)
        if step is None:
            continue
        op = _OP_OF_KIND.get(collective_kind(c.name), collective_kind(c.name))
        if op not in ops:
            ops.append(op)
        rows.append((step, ops.index(op), c.start / 1e6, c.done / 1e6 if c.done is not None else np.nan))
    if not rows:
        return None
    step, op, launch, done = (np.array(column) for column in zip(*rows, strict=True))
    return collectives_from_arrays(np.arange(1, len(rows) + 1), step, op, ops, launch, done)
