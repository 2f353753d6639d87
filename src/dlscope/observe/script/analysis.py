"""What the observed processes recorded (records.py), turned into results sections: steps,
anatomy, phases, top-10 operators. Plain data in, plain dicts out; no torch import."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from types import SimpleNamespace
from typing import Any

PARTS = ("data", "forward", "backward", "optimizer", "other")
# TensorFlow's input-pipeline analyser: a step is input-bound when ≥ 20% of it waits for input,
# moderately between 5% and 20%.
INPUT_BOUND_PCT, MODERATELY_PCT = 20.0, 5.0
Records = dict[int, list[dict[str, Any]]]


def process_info(pid: int, records: list[dict[str, Any]]) -> dict[str, Any]:
    head = next((r for r in records if r.get("k") == "process"), {})
    return {
        "pid": pid,
        "ppid": head.get("ppid"),
        "argv": head.get("argv", []),
        "rank": head.get("rank"),
        "world_size": head.get("world_size"),
        "forked": head.get("forked", False),
        "clean_exit": any(r.get("k") == "end" for r in records),
        "errors": [f"{r['where']}: {r['error']}" for r in records if r.get("k") == "error"],
    }


def steps_of(records: list[dict[str, Any]]) -> tuple[str | None, list[dict[str, Any]]]:
    """The process's steps: the optimizer's when it ever stepped, else one per backward()."""
    by_source: dict[str, list[dict[str, Any]]] = {"optimizer": [], "backward": []}
    for r in records:
        if r.get("k") == "step":
            by_source[r["src"]].append(r)
    for source in ("optimizer", "backward"):
        if by_source[source]:
            return source, by_source[source]
    return None, []


def main_process(records: Records) -> int | None:
    """The process with the most steps (the training loop), ties to the first started."""
    counts = {pid: len(steps_of(rs)[1]) for pid, rs in records.items()}
    best = max(counts.values(), default=0)
    return min(pid for pid, n in counts.items() if n == best) if best else None


def step_row(step: dict[str, Any], origin: float) -> dict[str, Any]:
    seconds = step["end"] - step["start"]
    parts = {p: step[p] for p in PARTS[:-1]}
    parts["other"] = max(seconds - sum(parts.values()), 0.0)
    return {
        "step": step["i"],
        "start_s": round(step["start"] - origin, 6),
        "ms": round(seconds * 1000, 3),
        **{f"{p}_ms": round(v * 1000, 3) for p, v in parts.items()},
        "data_source": step["data_source"],
        "peak_rss_bytes": step.get("peak_rss"),
        "peak_cuda_bytes": step.get("peak_cuda"),
        "profiled": step.get("profiled"),
        "profiler_step": step.get("profiler_step"),
        "profiler_ms": round(step.get("profiler_seconds", 0.0) * 1000, 3),
    }


def steps_section(records: Records, origin: float) -> dict[str, Any]:
    main = main_process(records)
    processes = []
    for pid, rs in records.items():
        source, steps = steps_of(rs)
        processes.append({"pid": pid, "rank": process_info(pid, rs)["rank"], "source": source, "count": len(steps)})
    source, steps = steps_of(records[main]) if main is not None else (None, [])
    return {
        "main_pid": main,
        "source": source,
        "count": len(steps),
        "processes": processes,
        "rows": [step_row(s, origin) for s in steps],
    }


def classify(input_pct: float) -> str:
    if input_pct >= INPUT_BOUND_PCT:
        return "highly"
    return "moderately" if input_pct >= MODERATELY_PCT else "not"


def anatomy_section(steps: dict[str, Any]) -> dict[str, Any]:
    """Mean step anatomy over the steady steps: not the first (start-up, first batch), not the
    profiler's warm-up and active steps (their recording cost is reported with the top-10)."""
    rows = steps["rows"]
    steady = [r for r in rows[1:] if r["profiled"] in (None, "wait")]
    used = "steady steps (not the first, not profiled)"
    if not steady:
        steady, used = rows, "all steps (too few to leave out the first and the profiled ones)"
    if not steady:
        return {"steps_used": 0, "note": "no training step was seen"}
    mean_ms = {p: statistics.fmean(r[f"{p}_ms"] for r in steady) for p in PARTS}
    step_ms = statistics.fmean(r["ms"] for r in steady)
    pct = {p: 100.0 * v / step_ms if step_ms else 0.0 for p, v in mean_ms.items()}
    input_pct = pct["data"]
    level = classify(input_pct)
    source = "time inside DataLoader.__next__" if steady[-1]["data_source"] == "loader" else "the gap before forward"
    verdict = (
        f"{'Your program is ' + level.upper() if level != 'not' else 'Your program is NOT'} input-bound: "
        f"{input_pct:.1f}% of the mean step ({step_ms:.1f} ms over {len(steady)} steps) waits for input "
        f"({source}); thresholds ≥ {INPUT_BOUND_PCT:.0f}% highly, {MODERATELY_PCT:.0f}–{INPUT_BOUND_PCT:.0f}% "
        "moderately (TensorFlow's input-pipeline analyser)."
    )
    if steps["source"] == "backward" and steady[-1]["data_source"] == "gap":
        verdict += (
            " An upper bound: with no torch optimizer a step ends at backward(), so the gap before the next "
            "forward also holds the weight update (Keras's optimizer, a hand-written SGD)."
        )
    peaks = [r["peak_rss_bytes"] for r in rows if r["peak_rss_bytes"] is not None]
    cuda = [r["peak_cuda_bytes"] for r in rows if r["peak_cuda_bytes"] is not None]
    return {
        "steps_used": len(steady),
        "used": used,
        "mean_ms": {p: round(v, 3) for p, v in mean_ms.items()},
        "step_ms": round(step_ms, 3),
        "percent": {p: round(v, 2) for p, v in pct.items()},
        "input_bound_pct": round(input_pct, 2),
        "input_bound": level,
        "data_source": steady[-1]["data_source"],
        "verdict": verdict,
        "peak_rss_bytes": max(peaks, default=None),
        "peak_cuda_bytes": max(cuda, default=None),
    }


def phase_slices(pid: int, records: list[dict[str, Any]], origin: float) -> list[dict[str, Any]]:
    """Begin/end records paired into slices; a phase a kill left open ends at the last record."""
    last = max((r.get("end", r.get("ts", 0.0)) for r in records), default=origin)
    slices, open_ = [], []
    for r in records:
        if r.get("k") == "B":
            open_.append(r)
        elif r.get("k") == "E" and open_:
            begin = open_.pop()
            slices.append(_slice(pid, begin, r["ts"], origin, len(open_), closed=True, files=r.get("files")))
    while open_:
        slices.append(_slice(pid, open_.pop(), last, origin, len(open_), closed=False))
    return sorted(slices, key=lambda s: (s["start_s"], s["depth"]))


def _slice(
    pid: int, begin: dict[str, Any], end: float, origin: float, depth: int, closed: bool, files: list[str] | None = None
) -> dict[str, Any]:
    """`files`: on a checkpoint phase's end, every file written inside it (a trainer's save)."""
    return {
        "pid": pid,
        "tid": begin.get("tid", pid),
        "phase": begin["name"],
        "start_s": round(begin["ts"] - origin, 6),
        "seconds": round(end - begin["ts"], 6),
        "depth": depth,
        "file": begin.get("file"),
        "files": files or ([begin["file"]] if begin.get("file") else []),
        "closed": closed,
        "begin_ts": begin["ts"],
        "end_ts": end,
    }


def phases_section(records: Records, origin: float) -> dict[str, Any]:
    rows = [s for pid, rs in records.items() for s in phase_slices(pid, rs, origin)]
    totals: dict[str, dict[str, Any]] = {}
    for s in rows:
        t = totals.setdefault(s["phase"], {"phase": s["phase"], "count": 0, "seconds": 0.0, "files": []})
        t["count"] += 1
        t["seconds"] = round(t["seconds"] + s["seconds"], 6)
        t["files"] += [f for f in s["files"] if f not in t["files"]]
    return {"rows": rows, "totals": list(totals.values())}


def ops_per_step(trace_path: Path) -> list[dict[str, Any]]:
    """Operators (cpu_op slices) inside each ProfilerStep#N slice of a profiler trace."""
    events = json.loads(trace_path.read_text()).get("traceEvents", [])
    steps = [e for e in events if e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep#")]
    ops = sorted(e["ts"] for e in events if e.get("ph") == "X" and e.get("cat") == "cpu_op")
    rows = []
    for s in sorted(steps, key=lambda e: e["ts"]):
        start, end = s["ts"], s["ts"] + s["dur"]
        rows.append({"step": s["name"].split("#")[1], "ops": sum(1 for t in ops if start <= t <= end)})
    return rows


def top10_section(records: Records, steps: dict[str, Any], sort_by: str) -> dict[str, Any]:
    from dlscope.observe.profiler import table_from_events  # torch: only once the command is done

    main = steps["main_pid"]
    profile = next((r for r in records.get(main, []) if r.get("k") == "profile"), None) if main else None
    if profile is None:
        return {"rows": [], "note": _why_no_profile(steps)}
    events = [SimpleNamespace(**op) for op in profile["ops"]]
    active = sum(e.count for e in events if e.key.startswith("ProfilerStep"))  # one per recorded step
    table = table_from_events(events, active, sort_by)
    profiled = [r["ms"] for r in steps["rows"] if r["profiled"] == "active"]
    plain = [r["ms"] for r in steps["rows"][1:] if r["profiled"] is None]
    cost = {
        "active_step_ms": round(statistics.median(profiled), 3) if profiled else None,
        "unprofiled_step_ms": round(statistics.median(plain), 3) if plain else None,
        "export_seconds": profile["export_seconds"],
        "between_steps_seconds": round(sum(r["profiler_ms"] for r in steps["rows"]) / 1000, 3),
    }
    if cost["active_step_ms"] and cost["unprofiled_step_ms"]:
        cost["ratio"] = round(cost["active_step_ms"] / cost["unprofiled_step_ms"], 3)
    trace = Path(profile["trace"])
    return {
        "pid": main,
        "active_steps": active,
        "sort_by": sort_by,
        "rows": table.to_records(10, sort_by),
        "operators": len(table.rows),
        "self_cpu_total_us": round(table.self_cpu_total_us, 3),
        "ops_per_step": ops_per_step(trace) if trace.exists() else [],
        "profiled_cost": cost,
        "trace": str(trace),
    }


def _why_no_profile(steps: dict[str, Any]) -> str:
    if not steps["count"]:
        return "no training step was seen, so nothing was profiled"
    return f"the profiler had not finished when the command ended ({steps['count']} steps seen)"


def run_section(records: Records, main: int | None) -> dict[str, Any]:
    processes = [process_info(pid, rs) for pid, rs in sorted(records.items())]
    sizes = [p["world_size"] for p in processes if p["world_size"] is not None]
    return {
        "processes": processes,
        "main_pid": main,
        "world_size": max(sizes, default=None),
        "ranks": sorted(p["rank"] for p in processes if p["rank"] is not None),
        "hook_errors": [e for p in processes for e in p["errors"]],
    }


def sections(records: Records, origin: float, sort_by: str = "self_cpu") -> dict[str, dict[str, Any]]:
    steps = steps_section(records, origin)
    return {
        "run": run_section(records, steps["main_pid"]),
        "steps": steps,
        "anatomy": anatomy_section(steps),
        "top10": top10_section(records, steps, sort_by),
        "phases": phases_section(records, origin),
    }
