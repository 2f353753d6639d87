"""What the GPU clock recorded (gpuclock.py), turned into the facts of the `gpu` results section:
the step anatomy on the GPU's clock, host-device synchronisations per step and the lines that
made them, memory, model-FLOPs utilisation, and the profiled steps' GPU busy and idle time and
copies (gputrace.py). Facts only: the words are in report/sections/gpu.py."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import numpy as np

from dlscope.analysis import gputrace
from dlscope.analysis.kineto import recorded_spans

# a GPU step row (gpuclock.GpuSteps)
INDEX, STEP, DATA, LOADER, FORWARD, BACKWARD, OPTIMIZER, SYNCS, RESERVED, EXCLUDED = range(10)


def gpu_rows(records: list[dict[str, Any]]) -> np.ndarray:
    rows = [row for r in records if r.get("k") == "gpu_steps" for row in r["rows"]]
    return np.asarray(rows, dtype=np.int64).reshape(-1, EXCLUDED + 1)


def anatomy(rows: np.ndarray, unsteady: np.ndarray) -> dict[str, Any]:
    """Mean GPU-clock anatomy over the steady steps: not the first the GPU clock saw (it starts at
    its first event), not the host's unsteady ones (`unsteady`: indices; the first step, the
    profiler's warm-up and active steps), not the step whose FLOPs were counted."""
    keep = (rows[:, EXCLUDED] == 0) & ~np.isin(rows[:, INDEX], unsteady)
    if len(rows):
        keep &= rows[:, INDEX] != rows[0, INDEX]
    steady = rows[keep]
    if not len(steady):
        return {"steps_used": 0}
    loader = steady[:, LOADER] == 1
    us = {
        "data": float(steady[loader, DATA].sum()),
        "gap": float(steady[~loader, DATA].sum()),
        "forward": float(steady[:, FORWARD].sum()),
        "backward": float(steady[:, BACKWARD].sum()),
        "optimizer": float(steady[:, OPTIMIZER].sum()),
    }
    total = float(steady[:, STEP].sum())
    us["other"] = max(total - sum(us.values()), 0.0)
    n = len(steady)
    return {
        "steps_used": n,
        "step_ms": round(total / n / 1e3, 4),
        "mean_ms": {p: round(v / n / 1e3, 4) for p, v in us.items()},
        "percent": {p: round(100 * v / total, 2) if total > 0 else 0.0 for p, v in us.items()},
        "data_source": "loader" if loader.any() else "none",
        "syncs_per_step": round(float(steady[:, SYNCS].mean()), 3),
        "steps_with_syncs_pct": round(100 * float((steady[:, SYNCS] > 0).mean()), 2),
        "reserved_max_bytes": int(steady[:, RESERVED].max()) << 20,
    }


def gpu_section(records: list[dict[str, Any]], unsteady: np.ndarray) -> dict[str, Any] | None:
    """None when the GPU clock never ran (no CUDA in the script, or none on the machine)."""
    summary = next((r for r in records if r.get("k") == "gpu"), None)
    rows = gpu_rows(records)
    if summary is None and not len(rows):
        return None
    section: dict[str, Any] = {"device": (summary or {}).get("device"), "steps_seen": len(rows)}
    section["anatomy"] = anatomy(rows, unsteady)
    if summary is not None:
        section["sync_lines"] = summary["sync_lines"]
        section["sync_lines_total"] = summary["sync_lines_total"]
        section["waited"] = summary["waited"]
        section["peak_reserved_bytes"] = summary["peak_reserved_bytes"]
        section["tf32"] = summary["tf32"]
    error = next((r["error"] for r in records if r.get("k") == "gpu_error"), None)
    if error:
        section["error"] = error
    section["mfu"] = utilisation(records, section["anatomy"].get("step_ms"))
    section["memory"] = [
        {"snapshot": r["snapshot"], "sites": r["sites"]} for r in records if r.get("k") == "gpu_memory"
    ]
    section["profiled"] = profiled(records)
    return section


def utilisation(records: list[dict[str, Any]], step_ms: float | None) -> dict[str, Any] | None:
    counted = next((r for r in records if r.get("k") == "gpu_flops"), None)
    if counted is None:
        return None
    peaks = next((r["flops_per_s"] for r in records if r.get("k") == "gpu_peaks"), {})
    if not step_ms or not counted.get("by_dtype"):
        reason = {"reason": "error", "error": counted["error"]} if counted.get("error") else {"reason": "no_flops"}
        return {**reason, "peaks": peaks}
    return {
        **mfu(counted["by_dtype"], step_ms / 1e3, peaks),
        "peaks": peaks,
        "flops_by_dtype": counted["by_dtype"],
    }


def profiled(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per profiler window with GPU activity: its steps' GPU busy and idle time, copies, syncs."""
    windows = []
    for r in records:
        if r.get("k") != "profile" or not Path(r["trace"]).exists():
            continue
        opener = gzip.open if r["trace"].endswith(".gz") else open
        with opener(r["trace"], "rt") as f:
            document = json.load(f)
        spans = [(start, end, n) for n, start, end in recorded_spans(document, r["recorded"])]
        steps = gputrace.profiled_steps(document, spans)
        if steps and any(s["kernels"] for s in steps):
            windows.append({"trace": r["trace"], "steps": steps, "summary": gputrace.summary(steps)})
    return windows


def mfu(flops_by_dtype: dict[str, int], step_seconds: float, peaks: dict[str, float]) -> dict[str, Any]:
    """Model-FLOPs utilisation of a step: the seconds its FLOPs would take at the measured peaks
    (sum over dtypes of FLOPs / peak FLOP/s) over the step's measured seconds.

    Returns "flops_per_step", "step_seconds", "achieved_flops_per_s" (None without a positive step
    time), "ideal_seconds_by_dtype" (the dtypes with a peak), "no_peak" (dtypes with FLOPs and no
    positive measured peak), "ideal_seconds" and "mfu" (None, with "reason" — "no_peak", "no_flops"
    or "no_step_time" — when a dtype has no peak, no FLOPs were counted or the step time is not
    positive)."""
    counted = {dtype: int(f) for dtype, f in flops_by_dtype.items() if f}
    total = sum(counted.values())
    no_peak = sorted(dtype for dtype in counted if not (peaks.get(dtype) or 0) > 0)
    by_dtype = {dtype: f / peaks[dtype] for dtype, f in counted.items() if dtype not in no_peak}
    positive = step_seconds is not None and step_seconds > 0
    result: dict[str, Any] = {
        "flops_per_step": total,
        "step_seconds": step_seconds,
        "achieved_flops_per_s": total / step_seconds if positive else None,
        "ideal_seconds_by_dtype": by_dtype,
        "no_peak": no_peak,
        "ideal_seconds": None,
        "mfu": None,
    }
    if no_peak:
        result["reason"] = "no_peak"
    elif not total:
        result["reason"] = "no_flops"
    elif not positive:
        result["reason"] = "no_step_time"
    else:
        result["ideal_seconds"] = sum(by_dtype.values())
        result["mfu"] = result["ideal_seconds"] / step_seconds
    return result
