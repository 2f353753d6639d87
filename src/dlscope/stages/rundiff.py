"""Where step time went between two runs of `dlscope run`: part by part (data, gap, forward,
backward, optimizer, other), with a noise band from each run's own steps; the profiler's top
operators; with --trace-io in both, the system calls and files that changed most.

Stateless: `compare(run_a, run_b)` reads the two run directories and returns a section of facts
(findings as keys and numbers; report/sections/rundiff.py words them). `dlscope diff` and
`dlscope doctor` both call it.

The noise band. Each run's steady steps (steptable.steady_steps: not the first, not the
profiler's) are cut into consecutive blocks and the blocks resampled with replacement (a block
bootstrap: neighbouring steps are alike, a slow stretch of the machine moves several of them, so
resampling single steps would understate the scatter). The two runs are resampled independently;
a difference is *significant* when its 95% band excludes zero and it is at least min_change_pct
of the step (a real but negligible shift is not worth a user's attention). The band holds the
scatter within each run, not a machine that was busier during one run than the other: interleave
repeated runs to rule that out.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import numpy as np

from dlscope.analysis import steptable
from dlscope.analysis.stepfile import StepFile
from dlscope.contract.records import SCRATCH_PREFIX, steps_path
from dlscope.errors import RunDirError
from dlscope.findings import Finding
from dlscope.options import RunDiffOptions
from dlscope.rundir import load_results, processes_dir, results_path

RESAMPLES = 2000
CONFIDENCE = 0.95
MIN_CHANGE_PCT = RunDiffOptions.min_change_pct
MAX_BLOCKS = 1000  # a long run is resampled as at most this many blocks (bounded work at any length)
FEW_STEPS = 10  # fewer steady steps than this in a run: the band is wide, said so
SEED = 0  # the same two runs always give the same band
PARTS = steptable.PARTS
TOP = 10  # operators, system calls and files shown that changed most


def compare(run_a: Path, run_b: Path, min_change_pct: float = MIN_CHANGE_PCT) -> dict[str, Any]:
    """The comparison of run B against run A: a results section (JSON-ready facts). Every part's
    band is there (`beyond_noise`); `significant` also asks for a change of `min_change_pct` of
    the step or more."""
    a, b = read_run(Path(run_a)), read_run(Path(run_b))
    rng = np.random.default_rng(SEED)
    boot_a, boot_b = (bootstrap_means(r["sums"], r["sizes"], rng) for r in (a, b))
    mean_a, mean_b = (r["sums"].sum(axis=1) / r["sizes"].sum() for r in (a, b))
    step = len(PARTS)  # the row of the whole step
    floor_s = min_change_pct / 100 * max(mean_a[step], mean_b[step])
    rows = []
    for k, name in enumerate((*PARTS, "step")):
        low, high = band(boot_b[k] - boot_a[k])
        delta = mean_b[k] - mean_a[k]
        rows.append(
            {
                "part": name,
                "a_ms": ms(mean_a[k]),
                "b_ms": ms(mean_b[k]),
                "delta_ms": ms(delta),
                "low_ms": ms(low),
                "high_ms": ms(high),
                "beyond_noise": bool(low > 0 or high < 0),
                "significant": bool((low > 0 or high < 0) and abs(delta) >= floor_s),
            }
        )
    speedup = boot_a[step] / np.maximum(boot_b[step], 1e-12)
    low, high = band(speedup)
    step_row = rows.pop()
    step_row.update(speedup=round(float(mean_a[step] / mean_b[step]), 4), speedup_low=round(low, 4))
    step_row["speedup_high"] = round(high, 4)
    shown = [r for r in rows if r["part"] not in ("data", "gap") or r["a_ms"] or r["b_ms"]]
    section = {
        "a": a["facts"],
        "b": b["facts"],
        "confidence": CONFIDENCE,
        "resamples": RESAMPLES,
        "min_change_pct": min_change_pct,
        "step": step_row,
        "parts": shown,
        "operators": operators(a["results"], b["results"]),
        "io": io(a["results"], b["results"], (a["path"], b["path"])),
    }
    section["findings"] = [f.to_json() for f in findings(section)]
    return section


def ms(seconds: float) -> float:
    return round(float(seconds) * 1e3, 4)


def band(samples: np.ndarray) -> tuple[float, float]:
    tail = (1 - CONFIDENCE) / 2 * 100
    low, high = np.percentile(samples, [tail, 100 - tail])
    return float(low), float(high)


# --- one run: its steady steps, part by part --------------------------------------------------


def read_run(run: Path) -> dict[str, Any]:
    """A `dlscope run` directory's steady steps in blocks (steady_blocks), dlscope's own calibrated
    cost taken out of "other" and of the step (as the anatomy does), and its facts."""
    results = load_results(run)
    where = results_path(run) if run.is_dir() else run
    run = where.parent
    command = results.get("run", {}).get("command")
    steps = results["sections"].get("steps")
    if not isinstance(steps, dict) or "main_pid" not in steps:  # any run that observed a script (run, doctor)
        raise RunDirError(
            f"a `dlscope {command}` run holds no step records of a script: diff compares runs of `dlscope run`",
            where,
        )
    if not steps.get("count") or steps.get("main_pid") is None:
        raise RunDirError("no training step was recorded in this run: nothing to compare", where)
    path = Path(steps.get("file") or steps_path(processes_dir(run), steps["main_pid"]))
    path = path if path.is_absolute() else run / path
    if not path.is_file():
        raise RunDirError("the run's step records are missing", path)
    try:
        records = StepFile(path)
        table = steptable.open_stream(records)[1]
    except (ValueError, KeyError, TypeError) as e:  # not a step file, or a header this dlscope cannot read
        raise RunDirError(f"not a readable dlscope step file ({e})", path) from None
    own_s = (results["sections"].get("anatomy", {}).get("dlscope_us_per_step") or 0.0) / 1e6
    try:
        census = steptable.census_steps(steps.get("subnormals") or [])
    except (KeyError, TypeError, AttributeError, ValueError):
        raise RunDirError("its steps' subnormal census records are malformed (each needs step, steps)", where) from None
    sums, sizes = steady_blocks(table, records.codes, own_s, census)
    if not len(sizes):
        raise RunDirError("no steady training step in this run (only the first or profiled ones)", path)
    facts = {
        "path": str(run),
        "name": results["run"].get("name"),
        "command": results["sections"].get("run", {}).get("command", []),
        "steps": int(sizes.sum()),
        "dlscope_us_per_step": own_s * 1e6 or None,
        "trace_io": "iotrace" in results["sections"],
        "few_steps": bool(sizes.sum() < FEW_STEPS),
    }
    return {"sums": sums, "sizes": sizes, "facts": facts, "results": results, "path": run}


def steady_blocks(
    table: np.ndarray, codes: dict[str, list[str | None]], own_s: float, census: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The steady steps' parts and step, summed over blocks of consecutive steady steps: (parts…,
    step) × blocks in seconds, and each block's number of steps. Blocks of ∛n steps (longer when
    that would make more than MAX_BLOCKS), read in chunks: memory is bounded at any run length."""
    loader = codes["data_source"].index("loader")
    chunks = range(0, len(table), steptable.CHUNK)

    def steady(first: int) -> tuple[np.ndarray, np.ndarray]:
        chunk = np.asarray(table[first : first + steptable.CHUNK])
        return chunk, steptable.steady_steps(chunk, np.arange(first, first + len(chunk)), codes, census)

    count = sum(int(np.count_nonzero(steady(first)[1])) for first in chunks)
    length = max(math.ceil(count ** (1 / 3)), math.ceil(count / MAX_BLOCKS), 1)
    blocks = math.ceil(count / length)
    sums = np.zeros((len(PARTS) + 1, blocks))
    seen = 0
    for first in chunks:
        chunk, keep = steady(first)
        parts = steptable.part_seconds(chunk[keep], loader)
        step = chunk["seconds"][keep].astype(np.float64)
        own = np.minimum(own_s, step)
        parts["other"] = np.maximum(parts["other"] - own, 0.0)
        which = (seen + np.arange(len(step))) // length
        for k, values in enumerate([*(parts[p] for p in PARTS), step - own]):
            sums[k] += np.bincount(which, weights=values, minlength=blocks)
        seen += len(step)
    sizes = np.full(blocks, length)
    if blocks:
        sizes[-1] = count - length * (blocks - 1)
    return sums, sizes


def bootstrap_means(sums: np.ndarray, sizes: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """RESAMPLES block-bootstrap means of each row (rows × blocks of summed steps): rows × RESAMPLES."""
    blocks = len(sizes)
    picks = rng.integers(0, blocks, (RESAMPLES, blocks))
    # how often each resample drew each block: a matrix product then sums the draws, never
    # materialising rows × resamples × blocks
    drawn = np.bincount((np.arange(RESAMPLES)[:, None] * blocks + picks).ravel(), minlength=RESAMPLES * blocks)
    drawn = drawn.reshape(RESAMPLES, blocks).astype(np.float64)
    return (drawn @ sums.T).T / (drawn @ sizes)


# --- operators and I/O: both runs have them, or they are not compared -------------------------


def operators(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any] | None:
    """Self CPU time per profiled step of each operator in either run's top-10, the largest
    changes first. An operator outside one run's top 10 has no figure there (None)."""
    tops = [r["sections"].get("top10") or {} for r in (a, b)]
    if not all(t.get("rows") and t.get("active_steps") for t in tops):
        return None
    per_step = [{r["name"]: r["self_cpu_us"] / t["active_steps"] for r in t["rows"]} for t in tops]
    names = list(dict.fromkeys([*per_step[0], *per_step[1]]))
    rows = [
        {
            "name": name,
            "a_us": round(per_step[0][name], 2) if name in per_step[0] else None,
            "b_us": round(per_step[1][name], 2) if name in per_step[1] else None,
        }
        for name in names
    ]
    for row in rows:
        row["delta_us"] = None if None in (row["a_us"], row["b_us"]) else round(row["b_us"] - row["a_us"], 2)
    rows.sort(key=lambda r: -abs(r["delta_us"] if r["delta_us"] is not None else (r["a_us"] or r["b_us"])))
    return {"rows": rows[:TOP], "a_steps": tops[0]["active_steps"], "b_steps": tops[1]["active_steps"]}


def io(a: dict[str, Any], b: dict[str, Any], runs: tuple[Path, Path]) -> dict[str, Any] | None:
    """System calls (by kind, all phases) and files (every file of iotrace/files.csv) that changed
    most, when both runs ran with --trace-io."""
    traces = [r["sections"].get("iotrace") for r in (a, b)]
    if not all(traces):
        return None
    kinds = [syscall_kinds(t) for t in traces]
    syscalls = [
        {
            "syscall": kind,
            **{f"{side}_{k}": kinds[i].get(kind, {}).get(k, 0) for i, side in enumerate("ab") for k in KIND},
        }
        for kind in sorted({*kinds[0], *kinds[1]})
    ]
    syscalls.sort(key=lambda r: tuple(-abs(r[f"b_{k}"] - r[f"a_{k}"]) for k in KIND))
    listed = [
        trace_files(run, t, [p["pid"] for p in r["sections"].get("run", {}).get("processes", [])])
        for run, t, r in zip(runs, traces, (a, b), strict=True)
    ]
    files = None
    if all(f is not None for f in listed):
        files = []
        for path in {*listed[0], *listed[1]}:  # type: ignore[misc]
            row = {"path": path}
            for i, side in enumerate("ab"):
                row.update({f"{side}_{k}": listed[i].get(path, {}).get(k, 0) for k in FILE})  # type: ignore[union-attr]
            if any(row[f"a_{k}"] != row[f"b_{k}"] for k in ("bytes", "calls")):
                files.append(row)
        files.sort(key=lambda r: (*(-abs(r[f"b_{k}"] - r[f"a_{k}"]) for k in FILE), r["path"]))
    return {
        "syscalls": syscalls[:TOP],
        "files": None if files is None else files[:TOP],
        "files_changed": None if files is None else len(files),
        "a_files_total": traces[0].get("files_total"),
        "b_files_total": traces[1].get("files_total"),
        "a_seconds": traces[0].get("duration_seconds"),
        "b_seconds": traces[1].get("duration_seconds"),
    }


KIND = ("count", "bytes", "seconds")
FILE = ("bytes", "calls", "seconds")


def trace_files(run: Path, trace: dict[str, Any], pids: list[int]) -> dict[str, dict[str, float]] | None:
    """Every file of the job the trace saw (its files.csv): bytes, calls and seconds; None when the
    run has none. dlscope's own files (the run directory, the calibration's scratch) are left out,
    and the job's process ids are spelled <pid>, so that two runs name the same file alike."""
    import csv

    name = trace.get("exports", {}).get("files_csv")
    path = run / name if name else None
    if path is None or not path.is_file():
        return None
    own = (f"{run.resolve()}/", f"{run.absolute()}/")
    pid = re.compile(r"(?<!\d)(" + "|".join(str(p) for p in pids) + r")(?!\d)") if pids else None
    found: dict[str, dict[str, float]] = {}
    with open(path, newline="", encoding="utf-8", errors="backslashreplace") as f:
        for r in csv.DictReader(f):
            name = r["path"]
            if name.startswith(own) or f"/{SCRATCH_PREFIX}" in name:
                continue
            name = re.sub(r"^/proc/\d+/", "/proc/<pid>/", name)
            name = pid.sub("<pid>", name) if pid else name
            total = found.setdefault(name, {"bytes": 0, "calls": 0, "seconds": 0.0})
            total["bytes"] += int(r["bytes_read"]) + int(r["bytes_written"])
            total["calls"] += sum(int(r[k]) for k in ("opens", "reads", "writes", "other_calls"))
            total["seconds"] += float(r["seconds"])
    return found


def syscall_kinds(trace: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Calls, bytes and seconds of each kind of system call, summed over the trace's phases."""
    kinds: dict[str, dict[str, float]] = {}
    for phase in trace.get("phases", []):
        for kind, v in phase.get("by_kind", {}).items():
            total = kinds.setdefault(kind, {"count": 0, "bytes": 0, "seconds": 0.0})
            total["count"] += v.get("count", 0)
            total["bytes"] += v.get("bytes", 0)
            total["seconds"] = round(total["seconds"] + v.get("seconds", 0.0), 6)
    return kinds


# --- the verdict: facts for report/sections/rundiff.py ------------------------------------------


def findings(section: dict[str, Any]) -> list[Finding]:
    step = section["step"]
    parts = section["parts"]
    changed = [{"part": r["part"], "a_ms": r["a_ms"], "b_ms": r["b_ms"]} for r in parts if r["significant"]]
    changed.sort(key=lambda r: -abs(r["b_ms"] - r["a_ms"]))
    values = {
        **{k: step[k] for k in ("a_ms", "b_ms", "speedup", "speedup_low", "speedup_high")},
        "confidence": section["confidence"],
        "changed": changed,
        "unchanged": [r["part"] for r in parts if not r["significant"]],
        "min_change_pct": section["min_change_pct"],
    }
    if not step["significant"]:
        found = [Finding("rundiff.same_step", "info", values)]
    elif step["speedup"] > 1:
        found = [Finding("rundiff.faster", "good", values)]
    else:
        found = [Finding("rundiff.slower", "bad", values)]
    few = [side for side in "ab" if section[side]["few_steps"]]
    if few:
        steps = {side: section[side]["steps"] for side in "ab"}
        found.append(Finding("rundiff.few_steps", "warn", {"runs": few, "steps": steps, "fewest": FEW_STEPS}))
    return found
