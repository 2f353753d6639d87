"""Step: what each rank of a torchrun job did — its process, threads, steps, samples and step times.

Reads each rank's rank.json as the workers wrote them (dlscope.distributed.worker)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from dlscope.errors import DlscopeError
from dlscope.measure.stats import percentile
from dlscope.rundir import rank_dir, rank_files
from dlscope.stages.base import Context, Step


def step_ms(record: dict[str, Any]) -> tuple[float | None, float | None]:
    """Median and 90th percentile (measure.stats) of the rank's steps, in ms: its first and profiled steps left out."""
    skip = {0, *record["profiled_steps"]}
    times = [1000 * t for i, t in enumerate(record["step_seconds"]) if i not in skip]
    if not times:
        return None, None
    return statistics.median(times), percentile(times, 90)


def rank_row(record: dict[str, Any], run_path: Any) -> dict[str, Any]:
    median, p90 = step_ms(record)
    directory = rank_dir(Path(), record["rank"]).as_posix()  # relative to the run
    return {
        **{k: record[k] for k in ("rank", "local_rank", "node_rank", "host", "pid", "restart", "threads", "device")},
        **{k: record[k] for k in ("status", "steps", "samples", "train_seconds", "samples_per_s")},
        "step_ms_median": median,
        "step_ms_p90": p90,
        "trace": f"{directory}/{record['trace']}" if record["trace"] else None,
        "record": f"{directory}/rank.json",
    }


def run(ctx: Context) -> dict[str, Any]:
    launch = ctx.section("train").get("launch")
    if launch is None:
        raise DlscopeError("the ranks step follows a train step run in several ranks (--nproc-per-node)")
    records = []
    for path in rank_files(ctx.run.path, "rank.json").values():
        try:
            records.append(json.loads(path.read_text()))
        except (OSError, json.JSONDecodeError) as e:
            raise DlscopeError(f"a rank's record is unreadable ({e})", path) from None
    records.sort(key=lambda r: r["rank"])
    rows = [rank_row(r, ctx.run.path) for r in records]
    medians = [r["step_ms_median"] for r in rows if r["step_ms_median"] is not None]
    return {
        **launch,
        "backend": records[0]["backend"] if records else None,
        "restarts": max((r["restart"] for r in records), default=0),
        "ranks": rows,
        "slowest_rank": max(rows, key=lambda r: r["step_ms_median"] or 0)["rank"] if medians else None,
        "step_ms_spread": (max(medians) / min(medians)) if medians else None,
    }


STEP = Step("ranks", run, needs=("trained",))
