"""Statistics over one process's step rows (records.py's `<pid>.steps`), read as numpy arrays in
chunks: never a Python object per step, and a summary of fixed size whatever the run's length —
percentiles, percentiles over windows of the run, the slowest steps, the steps where the step
time changed, and the sums the anatomy is drawn from."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from dlscope.analysis.stepfile import StepFile
from dlscope.contract.records import NONE_U4

# data: inside a data source (DataLoader.__next__); gap: from a step's start to its first forward
# when no data source was seen; other: the rest of the step
PARTS = ("data", "gap", "forward", "backward", "optimizer", "other")
WINDOWS = 100  # percentiles over time: this many windows of equal step counts
CHANGE_WINDOWS = 400  # finer windows for finding where the step time changed
CHANGE_MIN_RATIO = 1.2  # a change smaller than 20% is not reported
CHANGE_MIN_T = 6.0  # nor one the noise between windows could make
MAX_CHANGES = 8
CHANGE_SAMPLE = 20_000  # a change point's parts: medians over at most this many steps a side
SLOWEST = 10
EDGE = 10  # the first and the last steps kept as rows
TIMELINE_STEPS = 4000  # step slices on the timeline: the first and last half each, profiled, slowest
CHUNK = 1 << 16


def open_stream(steps: StepFile) -> tuple[str | None, np.ndarray]:
    """The process's steps: the optimizer's when it ever stepped, else one per backward()
    (memory-mapped: pages come from the file, a copy only when the two streams mix)."""
    if steps.count == 0:
        return None, np.zeros(0, steps.dtype)
    table = np.memmap(steps.path, steps.dtype, "r", steps.offset, (steps.count,))
    optimizer = steps.codes["src"].index("optimizer")
    chosen = table["src"] == optimizer
    found = int(np.count_nonzero(chosen))
    if found == len(table):
        return "optimizer", table
    if found:
        return "optimizer", table[chosen]
    return "backward", table[table["src"] == steps.codes["src"].index("backward")]


def part_seconds(chunk: np.ndarray, loader: int) -> dict[str, np.ndarray]:
    """Each part of each step of `chunk`, seconds (float64)."""
    data = chunk["data"].astype(np.float64)
    from_loader = chunk["data_source"] == loader
    parts = {
        "data": np.where(from_loader, data, 0.0),
        "gap": np.where(from_loader, 0.0, np.maximum(data, 0.0)),
        "forward": chunk["forward"].astype(np.float64),
        "backward": chunk["backward"].astype(np.float64),
        "optimizer": chunk["optimizer"].astype(np.float64),
    }
    measured = sum(parts.values())
    parts["other"] = np.maximum(chunk["seconds"].astype(np.float64) - measured, 0.0)
    return parts


NO_STEPS = np.zeros(0, np.int64)


def census_steps(censuses: list[dict[str, Any]]) -> np.ndarray:
    """The indices of the steps a subnormal census ran in (its records' `step` and `steps`)."""
    spans = [np.arange(c["step"], c["step"] + c["steps"]) for c in censuses if c.get("steps")]
    return np.concatenate(spans) if spans else NO_STEPS


def steady_steps(
    chunk: np.ndarray, positions: np.ndarray, codes: dict[str, list[str | None]], census: np.ndarray = NO_STEPS
) -> np.ndarray:
    """Which steps of `chunk` (at `positions` in the stream) are steady: not the first (start-up,
    first batch), not the profiler's warm-up and active ones, not those a subnormal census ran in
    (`census`, stream indices): their recording and counting cost is dlscope's."""
    unprofiled = (chunk["profiled"] == codes["profiled"].index(None)) | (
        chunk["profiled"] == codes["profiled"].index("wait")
    )
    steady = (positions >= 1) & unprofiled
    if len(census):  # most runs have none: no pass over the chunk for them
        steady &= ~np.isin(chunk["i"], census)
    return steady


def row(
    step: Any, origin: float, codes: dict[str, list[str | None]], loader: int, census: np.ndarray = NO_STEPS
) -> dict[str, Any]:
    """One step as the report shows it (ms); `census`: whether a subnormal census ran in it."""
    parts = {name: float(value[0]) for name, value in part_seconds(np.asarray([step]), loader).items()}
    return {
        "step": int(step["i"]),
        "start_s": round(float(step["start"]) - origin, 6),
        "ms": round(float(step["seconds"]) * 1e3, 3),
        **{f"{p}_ms": round(v * 1e3, 3) for p, v in parts.items()},
        "data_source": codes["data_source"][int(step["data_source"])],
        "peak_rss_bytes": _bytes(int(step["peak_rss_kib"])),
        "peak_cuda_bytes": _bytes(int(step["peak_cuda_kib"])),
        "profiled": codes["profiled"][int(step["profiled"])],
        "profiler_step": None if int(step["profiler_step"]) == NONE_U4 else int(step["profiler_step"]),
        "profiler_ms": round(float(step["profiler_seconds"]) * 1e3, 3),
        "census": bool(np.isin(int(step["i"]), census)),
    }


def _bytes(kib: int) -> int | None:
    return None if kib == NONE_U4 else kib * 1024


def _peak(column: np.ndarray) -> int | None:
    measured = column[column != NONE_U4]
    return _bytes(int(measured.max())) if len(measured) else None


def summarise(
    table: np.ndarray, origin: float, codes: dict[str, list[str | None]], census: np.ndarray = NO_STEPS
) -> dict[str, Any]:
    """The summary of a stream of steps: what results.json keeps of them (`census`: the indices of
    the steps a subnormal census ran in, left out of the steady ones and marked in the rows)."""
    n = len(table)
    loader = codes["data_source"].index("loader")
    profiled = {name: codes["profiled"].index(name) for name in ("wait", "warmup", "active")}
    none = codes["profiled"].index(None)
    seconds = np.empty(n, np.float64)
    steady_at = np.zeros(n, bool)
    windows = min(WINDOWS, n)
    bounds = (np.arange(windows + 1) * n) // windows if n else np.zeros(1, np.int64)
    window_sums = {p: np.zeros(windows) for p in PARTS}
    sums = {kind: dict.fromkeys(PARTS, 0.0) for kind in ("steady", "all")}
    steady_seconds, steady_count, loader_steps, census_count = 0.0, 0, 0, 0
    profiler_seconds, rss, cuda = 0.0, [], []
    for first in range(0, n, CHUNK):
        chunk = np.asarray(table[first : first + CHUNK])
        positions = np.arange(first, first + len(chunk))
        seconds[first : first + len(chunk)] = chunk["seconds"]
        parts = part_seconds(chunk, loader)
        which = np.searchsorted(bounds, positions, side="right") - 1
        steady = steady_at[first : first + len(chunk)] = steady_steps(chunk, positions, codes, census)
        for p in PARTS:
            window_sums[p] += np.bincount(which, weights=parts[p], minlength=windows)
            sums["steady"][p] += float(parts[p][steady].sum())
            sums["all"][p] += float(parts[p].sum())
        steady_seconds += float(chunk["seconds"][steady].astype(np.float64).sum())
        steady_count += int(np.count_nonzero(steady))
        loader_steps += int(np.count_nonzero(chunk["data_source"] == loader))
        if len(census):
            census_count += int(np.count_nonzero(np.isin(chunk["i"], census)))
        profiler_seconds += float(chunk["profiler_seconds"].astype(np.float64).sum())
        rss.append(_peak(chunk["peak_rss_kib"]))
        cuda.append(_peak(chunk["peak_cuda_kib"]))
    active = table["profiled"] == profiled["active"]
    plain = (table["profiled"] == none) & (np.arange(n) >= 1)
    top = np.argpartition(seconds, -SLOWEST)[-SLOWEST:] if n > SLOWEST else np.arange(n)
    slowest_at = top[np.argsort(seconds[top])[::-1]]
    edge = sorted({*range(min(EDGE, n)), *range(max(n - EDGE, 0), n)})
    return {
        "count": n,
        "seconds_total": round(float(seconds.sum()), 3),
        "percentiles_ms": _percentiles(seconds),
        "windows": [
            {
                "first": int(table["i"][bounds[w]]),
                "last": int(table["i"][bounds[w + 1] - 1]),
                "start_s": round(float(table["start"][bounds[w]]) - origin, 3),
                **_percentiles(seconds[bounds[w] : bounds[w + 1]], ("p50", "p90", "max")),
                **{f"{p}_ms": round(window_sums[p][w] * 1e3 / (bounds[w + 1] - bounds[w]), 4) for p in PARTS},
            }
            for w in range(windows)
        ],
        "slowest": [row(table[k], origin, codes, loader, census) for k in slowest_at],
        "edge_rows": [row(table[k], origin, codes, loader, census) for k in edge],
        "change_points": change_points(seconds, table, origin, loader, np.flatnonzero(steady_at)),
        # the sums the anatomy is drawn from (not kept in results.json)
        "steady": {"count": steady_count, "seconds": steady_seconds, "parts_seconds": sums["steady"]},
        "census_steps": census_count,
        "all": {"count": n, "seconds": float(seconds.sum()), "parts_seconds": sums["all"]},
        "loader_steps": loader_steps,
        "profiler": {
            "active_step_ms": _median_ms(seconds[active]),
            "unprofiled_step_ms": _median_ms(seconds[plain]),
            "between_steps_seconds": round(profiler_seconds, 3),
        },
        "peak_rss_bytes": max((v for v in rss if v is not None), default=None),
        "peak_cuda_bytes": max((v for v in cuda if v is not None), default=None),
    }


def _median_ms(values: np.ndarray) -> float | None:
    return round(float(np.median(values)) * 1e3, 3) if len(values) else None


def _percentiles(seconds: np.ndarray, names: tuple[str, ...] = ("min", "p50", "p90", "p99", "max")) -> dict:
    if not len(seconds):
        return {}
    q = {"min": 0, "p50": 50, "p90": 90, "p99": 99, "max": 100}
    values = np.percentile(seconds, [q[n] for n in names])
    result = {f"{n}_ms": round(float(v) * 1e3, 3) for n, v in zip(names, values, strict=True)}
    if "min" in names:
        result["mean_ms"] = round(float(seconds.mean()) * 1e3, 3)
    return result


def change_points(
    seconds: np.ndarray, table: np.ndarray, origin: float, loader: int, steady: np.ndarray
) -> list[dict[str, Any]]:
    """Where the step time changed and stayed changed, over the `steady` steps (positions: the
    first step and the profiler's warm-up and active ones slowed by dlscope's own recording, not
    by the job, are left out): binary segmentation of the log of window medians (a split is kept
    when the two sides differ by ≥ CHANGE_MIN_RATIO and by CHANGE_MIN_T times what the windows'
    own scatter explains), then the exact step found inside the two windows around it. A lone
    slow step is not a change (the slowest list holds those). Each change has its parts' medians
    on either side (`parts_ms`: part -> [before, after])."""
    kept = seconds[steady]
    n = len(kept)
    windows = min(CHANGE_WINDOWS, n // 5)
    if windows < 8:
        return []
    bounds = (np.arange(windows + 1) * n) // windows
    medians = np.log(np.maximum([np.median(kept[bounds[w] : bounds[w + 1]]) for w in range(windows)], 1e-9))
    noise = float(np.median(np.abs(np.diff(medians)))) / 0.6745 / math.sqrt(2) or 1e-6
    found: list[int] = []
    _split(medians, 0, windows, noise, found)
    steps = sorted(_refine(np.log(np.maximum(kept, 1e-9)), bounds, w) for w in found)
    edges = [0, *steps, n]
    result = []
    for j, at in enumerate(steps):
        before = float(np.median(kept[edges[j] : at]))
        after = float(np.median(kept[at : edges[j + 2]]))
        if max(before, after) < CHANGE_MIN_RATIO * min(before, after):
            continue  # the exact step moved the split: the two sides' medians are too close now
        sides = [
            _side_medians(table, steady[edges[j] : at], loader),
            _side_medians(table, steady[at : edges[j + 2]], loader),
        ]
        step = table[steady[at]]
        result.append(
            {
                "step": int(step["i"]),
                "start_s": round(float(step["start"]) - origin, 3),
                "before_ms": round(before * 1e3, 3),
                "after_ms": round(after * 1e3, 3),
                "parts_ms": {p: [sides[0][p], sides[1][p]] for p in PARTS},
                "forwards": [sides[0]["forwards"], sides[1]["forwards"]],
            }
        )
    return result


def _side_medians(table: np.ndarray, side: np.ndarray, loader: int) -> dict[str, float]:
    """Each part's median (ms) and the median forwards a step over the steps at positions `side`,
    from at most CHANGE_SAMPLE of them evenly spaced (a side of a million steps is read as 20,000
    rows)."""
    sample = np.unique(np.linspace(0, len(side) - 1, min(len(side), CHANGE_SAMPLE)).astype(np.int64))
    rows = np.asarray(table[side[sample]])
    medians = {p: round(float(np.median(v)) * 1e3, 4) for p, v in part_seconds(rows, loader).items()}
    return {**medians, "forwards": float(np.median(rows["forwards"]))}


def _split(y: np.ndarray, a: int, b: int, noise: float, found: list[int]) -> None:
    length = b - a
    if length < 4 or len(found) >= MAX_CHANGES:
        return
    segment = np.cumsum(y[a:b])
    k = np.arange(2, length - 1)
    left = segment[k - 1] / k
    right = (segment[-1] - segment[k - 1]) / (length - k)
    t = np.abs(left - right) / (noise * np.sqrt(1 / k + 1 / (length - k)))
    best = int(np.argmax(t))
    if t[best] < CHANGE_MIN_T or abs(left[best] - right[best]) < math.log(CHANGE_MIN_RATIO):
        return
    at = a + int(k[best])
    found.append(at)
    _split(y, a, at, noise, found)
    _split(y, at, b, noise, found)


def _refine(log_seconds: np.ndarray, bounds: np.ndarray, window: int) -> int:
    """The step inside the windows either side of a window boundary that best splits them."""
    lo, hi = int(bounds[window - 1]), int(bounds[min(window + 1, len(bounds) - 1)])
    y = log_seconds[lo:hi]
    if len(y) < 3:
        return int(bounds[window])
    total = np.cumsum(y)
    k = np.arange(1, len(y))
    gain = k * (len(y) - k) * (total[k - 1] / k - (total[-1] - total[k - 1]) / (len(y) - k)) ** 2
    return lo + int(k[int(np.argmax(gain))])


def timeline_positions(table: np.ndarray, unprofiled: int, slowest: int = SLOWEST) -> np.ndarray:
    """Which steps become slices on the timeline: all of them up to TIMELINE_STEPS, else the first
    and the last half each, the profiled ones and the slowest."""
    n = len(table)
    if n <= TIMELINE_STEPS:
        return np.arange(n)
    half = TIMELINE_STEPS // 2
    seconds = np.asarray(table["seconds"])
    chosen = [np.arange(half), np.arange(n - half, n), np.flatnonzero(table["profiled"] != unprofiled)[:100]]
    chosen.append(np.argpartition(seconds, -slowest)[-slowest:])
    return np.unique(np.concatenate(chosen))


def stride_positions(n: int, most: int) -> np.ndarray:
    """At most `most` evenly spaced positions (TensorBoard scalars of a long run)."""
    return np.arange(0, n, max(1, math.ceil(n / most)))
