"""Per-rank Kineto traces in, the `distributed` results section out — a pure function, as
HolisticTraceAnalysis's analysers are, but on CPU threads as well as GPU streams (HTA's are built
on GPU kernels and come out empty on gloo/CPU traces).

    section = analyze_ranks({0: Path("rank0.json"), 1: Path("rank1.json")})

Per rank and profiled step (ProfilerStep#N) the step's span S splits into
    data       DataLoader fetches                          D
    compute    CPU operators that are not communication    C − D
    exposed    communication while nothing else runs       M − C − D
    idle       the rest                                    S − (C ∪ D ∪ M)
where M is every communication interval: c10d ops and gloo's work items on its own threads (or NCCL
kernels' GPU time). Overlap is HTA's |M ∩ C| / |M| from a line sweep over the merged sets.
Stragglers: the k-th collective of a step is matched across ranks; the rank that enqueues it last
made the others wait (HTA's normalised start time: lateness ÷ the mean step).
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dlscope.analysis.intervals import Intervals, clip, intersect, length, merge, subtract
from dlscope.analysis.kineto import RankTrace, read_rank
from dlscope.errors import DlscopeError
from dlscope.findings import Finding

# A rank is named the straggler when it is last at ≥ this share of the collectives and, at its
# median, late by ≥ this share of the mean step (and ≥ 1 ms): below that, arrival order is noise.
STRAGGLER_SHARE, STRAGGLER_STEP_PCT, STRAGGLER_MIN_MS = 0.75, 5.0, 1.0
# The old torch profiler plugin flagged communication above 10% of the step.
COMM_HIGH_PCT = 10.0


def analyze_ranks(
    traces: Mapping[int, Path], grad_bytes: int | None = None, recorded: Mapping[int, list[list[Any]]] | None = None
) -> dict[str, Any]:
    """The `distributed` section from one Kineto trace per rank. `grad_bytes`: the model's gradient
    bytes (else taken from the traces' AccumulateGrad inputs). `recorded`: per rank, the training
    steps `dlscope run` recorded in its trace (kineto.recorded_spans), else its ProfilerStep marks."""
    if not traces:
        raise DlscopeError("no per-rank trace to analyse")
    ranks = [
        read_rank(Path(path), int(rank), (recorded or {}).get(int(rank)))
        for rank, path in sorted(traces.items(), key=lambda kv: int(kv[0]))
    ]
    left_out = [row for r in ranks for row in drop_steps_without_collectives(r)]
    steps = [row for r in ranks for row in step_rows(r)]
    by_rank = [rank_summary(r, [s for s in steps if s["rank"] == r.rank], grad_bytes) for r in ranks]
    stragglers = straggler_table(ranks, steps)
    found_grad = next((r.grad_bytes for r in ranks if r.grad_bytes), None)
    section = {
        "world_size": ranks[0].world_size or len(ranks),
        "backend": ranks[0].backend,
        "ranks_traced": [r.rank for r in ranks],
        "traces": {str(r.rank): str(r.path) for r in ranks},
        "grad_bytes": grad_bytes if grad_bytes is not None else found_grad,
        "grad_bytes_source": "given" if grad_bytes is not None else ("trace" if found_grad else None),
        "ranks": by_rank,
        "steps": steps,
        "left_out_steps": left_out,
        "stragglers": stragglers,
    }
    section["findings"] = findings(section)
    return section


def drop_steps_without_collectives(trace: RankTrace) -> list[dict[str, Any]]:
    """A profiled span in which a rank that does communicate launched no collective is no data-parallel
    training step (the profiler stopped at exit, an evaluation): left out of the tables, and listed."""
    if not trace.collectives:
        return []
    kept, dropped = [], []
    for n, start, end in trace.steps:
        launched = any(start <= c.start <= end for c in trace.collectives)
        (kept if launched else dropped).append((n, start, end))
    if not kept:
        return []
    trace.steps = kept
    return [{"rank": trace.rank, "step": n, "ms": round((end - start) / 1e3, 3)} for n, start, end in dropped]


def step_rows(trace: RankTrace) -> list[dict[str, Any]]:
    busy = merge([*trace.compute, *trace.data, *trace.comm])
    rows = []
    for n, start, end in trace.steps:
        data = clip(trace.data, start, end)
        compute = subtract(clip(trace.compute, start, end), data)
        comm = clip(trace.comm, start, end)
        exposed = subtract(comm, merge([*compute, *data]))
        span_ms = (end - start) / 1e3
        row = {
            "rank": trace.rank,
            "step": n,
            "ms": round(span_ms, 3),
            "compute_ms": ms(compute),
            "comm_ms": ms(comm),
            "exposed_comm_ms": ms(exposed),
            "data_ms": ms(data),
            "idle_ms": round(span_ms - length(clip(busy, start, end)) / 1e3, 3),
            "overlap_pct": overlap_pct(comm, compute),
            "collectives": sum(1 for c in trace.collectives if start <= c.start <= end),
            "comm_bytes": _bytes_in(trace, start, end),
        }
        if trace.gpu_comm or trace.gpu_compute:
            gpu_comm, gpu_compute = clip(trace.gpu_comm, start, end), clip(trace.gpu_compute, start, end)
            row.update(gpu_comm_ms=ms(gpu_comm), gpu_overlap_pct=overlap_pct(gpu_comm, gpu_compute))
        rows.append(row)
    return rows


def ms(intervals: Intervals) -> float:
    return round(length(intervals) / 1e3, 3)


def overlap_pct(comm: Intervals, compute: Intervals) -> float | None:
    """HTA's comm/compute overlap; None when there is no communication to overlap."""
    total = length(comm)
    return round(100.0 * length(intersect(comm, compute)) / total, 2) if total else None


def _bytes_in(trace: RankTrace, start: float, end: float) -> int | None:
    """Payload of the collectives launched in the span; None when one's size is unknown."""
    sizes = [c.bytes for c in trace.collectives if start <= c.start <= end]
    known = [b for b in sizes if b is not None]
    return sum(known) if len(known) == len(sizes) else None


PARTS_MS = ("compute_ms", "exposed_comm_ms", "data_ms", "idle_ms")  # they partition the step


def rank_summary(trace: RankTrace, rows: list[dict[str, Any]], grad_bytes: int | None) -> dict[str, Any]:
    """Means over the rank's profiled steps; overlap over all of them together."""
    mean = {key: round(statistics.fmean(r[key] for r in rows), 3) for key in (*PARTS_MS, "ms")}
    spans = [(s, e) for _, s, e in trace.steps]
    comm = intersect(trace.comm, merge(spans))
    compute = subtract(intersect(trace.compute, merge(spans)), trace.data)
    per_step = [r["comm_bytes"] for r in rows if r["comm_bytes"] is not None]
    reference = grad_bytes if grad_bytes is not None else trace.grad_bytes
    summary = {
        "rank": trace.rank,
        "steps": len(rows),
        "step_ms": mean["ms"],
        **{key: mean[key] for key in PARTS_MS},
        "comm_ms": round(statistics.fmean(r["comm_ms"] for r in rows), 3),
        "exposed_comm_pct": round(100.0 * mean["exposed_comm_ms"] / mean["ms"], 2) if mean["ms"] else None,
        "overlap_pct": overlap_pct(comm, compute),
        "collectives_per_step": round(statistics.fmean(r["collectives"] for r in rows), 2),
        "comm_bytes_per_step": round(statistics.median(per_step)) if per_step else None,
        # which collectives, launched how often a step: DDP's all-reduces, FSDP's all-gathers and reduce-scatters
        "collective_kinds": {
            kind: round(n / len(rows), 2)
            for kind, n in Counter(collective_kind(c.name) for c in trace.collectives).most_common()
        },
        "grad_bytes": reference,
    }
    if summary["comm_bytes_per_step"] is not None and reference:
        summary["bytes_vs_grad"] = round(summary["comm_bytes_per_step"] / reference, 3)
    if trace.gpu_comm or trace.gpu_compute:
        summary["gpu_overlap_pct"] = overlap_pct(intersect(trace.gpu_comm, merge(spans)), trace.gpu_compute)
    return summary


def collective_kind(name: str) -> str:
    """A collective's kind from its launch's name: c10d::allreduce_ -> allreduce,
    c10d::_allgather_base_ (or record_param_comms' _allgather_base) -> allgather."""
    return name.removeprefix("c10d::").strip("_").removesuffix("_base")


def straggler_table(ranks: list[RankTrace], steps: list[dict[str, Any]]) -> dict[str, Any]:
    """Match the k-th collective of each common step across ranks; who enqueued it last, by how much."""
    common = set.intersection(*({n for n, _, _ in r.steps} for r in ranks))
    mean_step_ms = statistics.fmean(s["ms"] for s in steps if s["step"] in common) if common else 0.0
    scale = 1e3 * mean_step_ms  # µs: a launch's lateness as a share of the mean step
    rows = []
    for n in sorted(common):
        per_rank = {r.rank: [c for c in r.collectives if _in_step(r, n, c.start)] for r in ranks}
        for k in range(min(len(cs) for cs in per_rank.values())):
            arrivals = {rank: cs[k].start for rank, cs in per_rank.items()}
            order = sorted(arrivals, key=lambda rank: arrivals[rank])
            first, last = arrivals[order[0]], arrivals[order[-1]]
            second_last = arrivals[order[-2]] if len(order) > 1 else last
            rows.append(
                {
                    "step": n,
                    "index": k,
                    "name": per_rank[order[-1]][k].name,
                    "bytes": per_rank[order[-1]][k].bytes,
                    "last_rank": order[-1],
                    "late_ms": round((last - first) / 1e3, 3),
                    "gap_ms": round((last - second_last) / 1e3, 3),
                    "normalised": {str(rank): round((t - first) / scale, 4) for rank, t in arrivals.items()}
                    if scale
                    else {},
                }
            )
    return {
        "mean_step_ms": round(mean_step_ms, 3),
        "collectives": rows,
        "by_rank": _by_rank(ranks, rows),
        "straggler": _straggler(rows, mean_step_ms) if len(ranks) > 1 else None,
    }


def _in_step(trace: RankTrace, n: int, t: float) -> bool:
    return any(m == n and start <= t <= end for m, start, end in trace.steps)


def _by_rank(ranks: list[RankTrace], rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for r in ranks:
        mine = [row for row in rows if row["last_rank"] == r.rank]
        starts = [row["normalised"][str(r.rank)] for row in rows if row["normalised"]]
        out.append(
            {
                "rank": r.rank,
                "last": len(mine),
                "of": len(rows),
                "median_late_ms": round(statistics.median(row["late_ms"] for row in mine), 3) if mine else None,
                "max_late_ms": max((row["late_ms"] for row in mine), default=None),
                "mean_normalised_start": round(statistics.fmean(starts), 4) if starts else None,
            }
        )
    return out


def _straggler(rows: list[dict[str, Any]], mean_step_ms: float) -> dict[str, Any] | None:
    if not rows:
        return None
    rank, count = Counter(row["last_rank"] for row in rows).most_common(1)[0]
    gaps = [row["gap_ms"] for row in rows if row["last_rank"] == rank]
    gap = statistics.median(gaps)
    late = statistics.median(row["late_ms"] for row in rows if row["last_rank"] == rank)
    pct = 100.0 * gap / mean_step_ms if mean_step_ms else 0.0
    if count / len(rows) < STRAGGLER_SHARE or gap < STRAGGLER_MIN_MS or pct < STRAGGLER_STEP_PCT:
        return None
    return {
        "rank": rank,
        "last": count,
        "of": len(rows),
        "median_gap_ms": round(gap, 3),
        "median_late_ms": round(late, 3),
        "step_pct": round(pct, 1),
    }


def findings(section: dict[str, Any]) -> list[dict[str, Any]]:
    """The section's findings (dlscope.findings, as JSON), each with the numbers it cites; worded in
    report.sections.distributed."""
    out = []
    s = section["stragglers"]
    if s["straggler"]:
        g = s["straggler"]
        values = {k: g[k] for k in ("rank", "last", "of", "median_gap_ms", "step_pct")}
        out.append(Finding("distributed.straggler", "bad", {**values, "mean_step_ms": s["mean_step_ms"]}))
    elif s["collectives"] and len(section["ranks"]) > 1:
        last = {str(r["rank"]): r["last"] for r in s["by_rank"]}
        out.append(Finding("distributed.no_straggler", "good", {"last_by_rank": last, "of": len(s["collectives"])}))
    late = s["straggler"]["rank"] if s["straggler"] else None
    for r in section["ranks"]:
        share = r["exposed_comm_pct"]
        if share is not None and share >= COMM_HIGH_PCT:
            values = {k: r[k] for k in ("rank", "exposed_comm_pct", "step_ms", "exposed_comm_ms", "overlap_pct")}
            waits_for = late if late is not None and late != r["rank"] else None
            values.update(straggler=waits_for, comm_high_pct=COMM_HIGH_PCT)
            out.append(Finding("distributed.exposed_comm", "warn", values))
    if not any(r["collectives_per_step"] for r in section["ranks"]):
        # the run section's first finding says why (ranks_apart): no 0 B "against the gradients" here
        out.append(Finding("distributed.no_collectives", "warn", {"ranks": len(section["ranks"])}))
        return [f.to_json() for f in out]
    if any(r["collectives_per_step"] and r["comm_bytes_per_step"] is None for r in section["ranks"]):
        out.append(Finding("distributed.comm_bytes_unknown", "info"))
    ratios = [r.get("bytes_vs_grad") for r in section["ranks"] if r.get("bytes_vs_grad") is not None]
    if ratios and section["grad_bytes"]:
        first = section["ranks"][0]
        values = {
            "comm_bytes_per_step": first["comm_bytes_per_step"],
            "bytes_vs_grad": ratios[0],
            "grad_bytes": section["grad_bytes"],
            "collectives_per_step": first["collectives_per_step"],
            "kinds": first["collective_kinds"],
        }
        out.append(Finding("distributed.comm_bytes", "info", values))
    return [f.to_json() for f in out]


# the frameworks a script may train through, most specific first: the Trainer imports accelerate
FRAMEWORKS = ("transformers", "lightning", "accelerate")


def ranks_apart(ranks: list[dict[str, Any]], distributed: dict[str, Any] | None) -> Finding | None:
    """A job started as distributed whose ranks trained without ever communicating: each trained a
    model of its own (no process group joined, or one joined and no gradient ever all-reduced).
    `ranks`: each process with a rank — rank, world_size, steps, joined (it called
    init_process_group), collectives (entered over the whole run, its live file's count), frameworks
    (those it imported). `distributed`: the section from the ranks' traces, when they left some
    (a collective there that the count missed — DDP with a hook of its own that is not Python's —
    is communication all the same). None when the ranks communicated, or fewer than two stepped."""
    stepped = [r for r in ranks if r["steps"]]
    sizes = [r["world_size"] for r in stepped if r["world_size"]]
    if len(stepped) < 2 or max(sizes, default=1) < 2:
        return None
    traced = [r["collectives_per_step"] for r in (distributed or {}).get("ranks", [])]
    if any(r["collectives"] for r in stepped) or any(traced):
        return None
    imported = {name for r in stepped for name in r["frameworks"]}
    values = {
        "ranks": len(stepped),
        "world_size": max(sizes),
        "steps": {str(r["rank"]): r["steps"] for r in stepped},
        "joined": sum(1 for r in stepped if r["joined"]),
        "framework": next((name for name in FRAMEWORKS if name in imported), "torch"),
        "profiled": bool(traced),
    }
    return Finding("distributed.ranks_apart", "warn", values)


def scaling_table(runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Samples/s of several runs against ideal scaling. Each run: ranks, threads (per rank),
    samples_per_s; optionally exposed_comm_pct (exposed communication, % of the step) and step_ms (its
    mean profiled step) for a several-rank run, gemm_efficiency_pct (a GEMM on its threads against as
    many single-thread GEMMs) for a one-rank run. The baseline is the run on the fewest cores
    (ranks × threads); ideal = baseline × cores ÷ baseline cores."""
    if not runs:
        raise DlscopeError("no run to compare for scaling")
    base = min(runs, key=lambda r: (r["ranks"] * r["threads"], r["ranks"]))
    base_cores = base["ranks"] * base["threads"]
    rows = []
    for r in sorted(runs, key=lambda r: (r["ranks"] * r["threads"], r["ranks"])):
        cores = r["ranks"] * r["threads"]
        speedup = r["samples_per_s"] / base["samples_per_s"]
        rows.append(
            {
                "ranks": r["ranks"],
                "threads": r["threads"],
                "cores": cores,
                "samples_per_s": round(r["samples_per_s"], 1),
                "speedup": round(speedup, 3),
                "ideal": round(cores / base_cores, 3),
                "efficiency_pct": round(100.0 * speedup * base_cores / cores, 1),
                "exposed_comm_pct": r.get("exposed_comm_pct"),
                "step_ms": r.get("step_ms"),
                "gemm_efficiency_pct": r.get("gemm_efficiency_pct"),
            }
        )
    baseline = {"ranks": base["ranks"], "threads": base["threads"]}
    return {"baseline": baseline, "rows": rows, "findings": _same_cores(rows)}


def _same_cores(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Ranks against threads on the same cores: which split is faster, and the communication it pays
    (findings as JSON, worded in report.sections.scaling)."""
    out = []
    for cores in sorted({r["cores"] for r in rows}):
        alike = sorted((r for r in rows if r["cores"] == cores), key=lambda r: -r["samples_per_s"])
        if len(alike) < 2 or alike[0]["ranks"] == alike[-1]["ranks"]:
            continue
        fast, slow = alike[0], alike[-1]
        multi, single = (fast, slow) if fast["ranks"] > slow["ranks"] else (slow, fast)
        values = {
            "cores": cores,
            **{f"fast.{k}": fast[k] for k in ("ranks", "threads", "samples_per_s")},
            **{f"slow.{k}": slow[k] for k in ("ranks", "threads", "samples_per_s")},
            **{f"multi.{k}": multi[k] for k in ("ranks", "exposed_comm_pct", "step_ms")},
            **{f"single.{k}": single[k] for k in ("threads", "efficiency_pct", "gemm_efficiency_pct")},
        }
        out.append(Finding("scaling.same_cores", "info", values).to_json())
    return out
