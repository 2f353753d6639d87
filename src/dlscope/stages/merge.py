"""Step merge (`dlscope merge RUN_DIR... --out DIR`): the run directories one job's launchers wrote,
one per machine (or an earlier merge), joined into one run directory: every rank's per-step records
and collectives as one Parquet dataset (analysis/columnar), then the cross-rank analysis as DuckDB
queries over it (analysis/crossrank) and the hang's verdict across hosts (analysis/hangverdict).

The inputs are read and checked before the run directory exists (check(): two jobs, no run, a
Parquet file cut short or of a newer schema: one line, nothing written). The dataset is built in a
folder of its own and renamed into place whole. Each rank's records are read once, one rank at a
time (its profiler trace too, where it has no collectives file): memory holds one rank's rows.
"""

from __future__ import annotations

import os
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dlscope.analysis import columnar, crossrank
from dlscope.analysis.hangverdict import across_hosts
from dlscope.analysis.job import Job, Rank, read_job
from dlscope.errors import ConfigError, DlscopeError
from dlscope.findings import Finding
from dlscope.options import MergeOptions
from dlscope.rundir import load_results, node_parts, parquet_dir, results_path
from dlscope.stages.base import Context, Step

_checked: dict[tuple[str, ...], Job] = {}  # what check() read, for the run that follows it


def check(options: MergeOptions) -> Job:
    """Every input read and checked: a bad one raises one line before anything is created. The
    records read are kept for the step (read once, not once to check and once to merge)."""
    job = read_job([Path(p) for p in options.runs])
    _checked[tuple(options.runs)] = job
    return job


def run(ctx: Context) -> dict[str, Any]:
    options = ctx.steps.merge
    if options is None:
        raise ConfigError("the merge step needs run directories")
    started = time.perf_counter()
    job = _checked.pop(tuple(options.runs), None) or check(options)
    root = parquet_dir(ctx.run.path)
    building = ctx.run.path / f".{root.name}-{os.getpid()}"
    shutil.rmtree(building, ignore_errors=True)
    notes = write_dataset(job, building, options.threads)
    shutil.rmtree(root, ignore_errors=True)
    building.rename(root)
    written = round(time.perf_counter() - started, 3)
    spill = ctx.run.path / f".duckdb-{os.getpid()}"
    try:
        tables = crossrank.analyse(root, spill, options.threads)
    finally:
        shutil.rmtree(spill, ignore_errors=True)
    section = {
        "job": {"run_id": job.job.run_id, "master": job.job.master, "world_size": job.world_size},
        "inputs": [
            {"path": str(part.path), "kind": part.kind, "ranks": [r.rank for r in part.ranks]} for part in job.parts
        ],
        "missing_ranks": job.missing,
        "parquet": ctx.run.rel(root),
        "notes": notes,
        **tables,
        "hang": across_hosts(hang_captures(job), job.world_size),
        "write_seconds": written,
    }
    section["findings"] = findings(section)
    return section


def write_dataset(job: Job, root: Path, threads: int | None) -> list[dict[str, Any]]:
    """Every rank's records into the dataset under `root`, a few ranks at a time; the notes of the
    ranks whose records could not all be read (a trace cut short by a kill)."""
    notes: list[dict[str, Any]] = []
    with ThreadPoolExecutor(max_workers=threads or os.cpu_count() or 1) as pool:
        rows = list(pool.map(lambda r: write_rank(r, root, notes), job.ranks))
    columnar.write_ranks(root, rows)
    return sorted(notes, key=lambda n: n["rank"])


def write_rank(rank: Rank, root: Path, notes: list[dict[str, Any]]) -> dict[str, Any]:
    """One rank's steps and collectives written (or linked, from an earlier merge); its ranks row."""
    row = {
        "rank": rank.rank,
        "host": rank.host,
        "hostname": rank.hostname,
        "node": rank.node,
        "local_rank": rank.local_rank,
        "pid": rank.pid,
        "world_size": rank.world_size,
        "source": str(rank.source),
    }
    if rank.merged is not None:
        for table in (columnar.STEPS, columnar.COLLECTIVES):
            if rank.merged[table] is not None:
                columnar.link_or_copy(rank.merged[table], columnar.partition(root, table, rank.host, rank.rank))
        return {**row, "steps": rank.merged["row"]["steps"], "collectives": rank.merged["row"]["collectives"]}
    steps = columnar.steps_table(rank.steps) if rank.steps is not None and rank.steps.count else None
    collectives = None
    if rank.collectives is not None and rank.collectives.count:
        collectives = columnar.collectives_table(rank.collectives)
    elif rank.trace is not None:
        try:
            collectives = columnar.collectives_from_trace(rank.trace, rank.rank, steps)
        except DlscopeError as e:  # a trace a killed rank left cut short: a note, not a lost merge
            notes.append({"rank": rank.rank, "note": str(e)})
    columnar.write_rank(root, rank.host, rank.rank, steps, collectives)
    return {
        **row,
        "steps": steps.num_rows if steps is not None else 0,
        "collectives": collectives.num_rows if collectives is not None else 0,
    }


def hang_captures(job: Job) -> list[tuple[str, dict[str, Any]]]:
    """Each input's last hang capture, named by the host(s) of its ranks."""
    out = []
    for part in job.parts:
        hang = part.hang
        if part.kind == "run" and hang and hang.get("captures"):
            hosts = sorted({r.host for r in part.ranks})
            out.append((", ".join(hosts), hang["captures"][-1]["verdict"]))
    return out


@dataclass
class Whole:
    """What a launcher finds in its job directory when its own run is done: the node parts to merge
    (none while a rank is missing or a launcher still runs, or when they are merged already)."""

    parts: list[Path] | None
    ranks: int = 0
    world_size: int | None = None
    merged_already: bool = False
    error: str | None = None  # the parts cannot be merged (two jobs in one --out)


def whole_job(job: Path) -> Whole:
    parts = node_parts(job)
    try:
        found = read_job(parts)
    except DlscopeError as e:
        return Whole(None, error=str(e))
    running = [p for p in found.parts if p.results["run"].get("status") == "running"]
    if found.missing or running:
        return Whole(None, len(found.ranks), found.world_size)
    if results_path(job).is_file():
        done = load_results(job)["sections"].get("merge") or {}
        if sorted(i["path"] for i in done.get("inputs", [])) == sorted(str(p) for p in parts):
            return Whole(None, len(found.ranks), found.world_size, merged_already=True)
    return Whole(parts, len(found.ranks), found.world_size)


def findings(section: dict[str, Any]) -> list[dict[str, Any]]:
    """The merge's findings (facts; worded in report/sections/merge.py)."""
    out = []
    if section["missing_ranks"]:
        out.append(Finding("merge.missing_ranks", "warn", {"ranks": section["missing_ranks"]}))
    hang = section["hang"]
    if hang is not None:
        values = {k: hang[k] for k in ("seq", "op", "reached", "not_captured")}
        values["never_arrived"] = [{k: r[k] for k in ("rank", "host", "died", "where")} for r in hang["never_arrived"]]
        out.append(Finding("merge.hang", "bad", values))
    found = section["collectives"]
    if found["straggler"]:
        s = found["straggler"]
        out.append(
            Finding(
                "merge.straggler",
                "bad",
                {k: s[k] for k in ("rank", "host", "last", "of", "cost_ms", "step_pct", "others", "others_step_ms")},
            )
        )
    elif found["matched"]:
        out.append(
            Finding(
                "merge.no_straggler", "good", {"matched": found["matched"], "last_by_rank": found["last_by_rank"][:4]}
            )
        )
    elif found["ranks"] < 2:
        out.append(Finding("merge.no_collectives", "info", {"ranks": found["ranks"]}))
    offsets = section["offsets"]
    if offsets:
        far = max(offsets.items(), key=lambda kv: abs(kv[1]["ms"]))
        out.append(
            Finding(
                "merge.clock_offsets",
                "info",
                {"reference": section["reference_host"], "hosts": len(offsets), "farthest": far[0], "ms": far[1]["ms"]},
            )
        )
    return [f.to_json() for f in out]


STEP = Step("merge", run)
