"""The profiled steps on the GPU, from a Kineto (torch.profiler) Chrome trace: trace in, table out.

Stateless: `profiled_steps(trace)` takes the dict that json.load gives for a torch.profiler export
and returns one row of facts per ProfilerStep#N; `summary(steps)` takes those rows and returns
their means. Nothing is printed or worded here. Times in the trace are µs; the rows give ms.

What a step is, and the rules:

* The host's step is the CPU-side `user_annotation` span ProfilerStep#N (`host_ms`), or, in a
  `dlscope run` trace, the training step the window recorded as ProfilerStep#N (the mark runs
  from one `prof.step()` to the next: an evaluation between two steps is in it, not in the step).
* A GPU activity (a `kernel`, `gpu_memcpy` or `gpu_memset` event) belongs to the step whose CPU
  span holds the start of the runtime or driver call that launched it, matched by the
  `correlation` id. Why not by time on the GPU: the GPU runs behind the host (by tens of ms in a
  loop that never synchronises), so the kernels running during a step's CPU span were mostly
  launched by earlier steps. Why not the `gpu_user_annotation` ProfilerStep span: Kineto builds it
  from the launches made under the annotation on the annotating thread only, and autograd runs
  backward on its own thread, so that span leaves out the backward kernels (seen on H100 traces:
  it covers a fraction of the step's work). Launches from any thread count, by time: the main
  thread is inside the step while the autograd thread launches the backward.
  Activities whose launch is not in the trace (launched before the profiler's active window) or
  falls outside every step belong to none.
* `gpu_span_ms`: from the first of the step's activities' start to the last one's end.
* `gpu_busy_ms`: the union of the step's activity intervals on all streams, overlaps counted once.
* `gpu_period_ms`: from this step's GPU start to the next step's (the next step with GPU work),
  so that the periods of consecutive steps tile the GPU's timeline and the gaps between steps are
  charged to the step before them; the last step's period is its span. A period is never shorter
  than the step's own span (a step's work on a side stream can outlast the next step's start),
  so busy <= span <= period always holds.
* `gpu_idle_ms` = period - busy; `busy_pct` = 100 * busy / period.
* `gpu_lag_ms`: the step's GPU start minus its host start: how far the device runs behind.
* `sync_calls`: host calls that wait for the device, started inside the step's CPU span:
  cudaStreamSynchronize, cudaDeviceSynchronize, cudaEventSynchronize, the blocking cudaMemcpy
  family (not ...Async) and the driver's cuStreamSynchronize, cuCtxSynchronize,
  cuEventSynchronize.
* `copies`: the step's memcpys grouped by direction (h2d, d2h, d2d; p2p, h2h if any) and the
  memory on the host's side (pageable, pinned; device for d2d), with count, bytes and ms (the
  sum of their durations).

Steps without GPU work have zero span and busy and None for the period, idle, busy % and lag.
One pass over the events; then per step a sort of its own intervals.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from typing import Any

STEP_PREFIX = "ProfilerStep#"
# older torch versions put record_function spans under cpu_op
HOST_STEP_CATS = frozenset({"user_annotation", "cpu_op"})
LAUNCH_CATS = frozenset({"cuda_runtime", "cuda_driver"})
GPU_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
# The trace holds no driver calls that the runtime makes on its own behalf (~100 cudaLaunchKernel
# a trace beside only the ~10 cuLaunchKernel that Triton makes), so a driver sync in the trace is
# the program's own and is not a runtime sync counted twice.
SYNC_CALLS = frozenset(
    {
        "cudaStreamSynchronize",
        "cudaDeviceSynchronize",
        "cudaEventSynchronize",
        "cudaThreadSynchronize",
        "cuStreamSynchronize",
        "cuCtxSynchronize",
        "cuEventSynchronize",
    }
)
MEMCPY_NAME = re.compile(r"Memcpy (\w+) \((\w+) -> (\w+)\)")
DIRECTIONS = {"HtoD": "h2d", "DtoH": "d2h", "DtoD": "d2d", "PtoP": "p2p", "HtoH": "h2h"}


def is_sync(name: str) -> bool:
    # cudaMemcpy, cudaMemcpy2D, cudaMemcpyToSymbol...: the blocking copies return when done
    return name in SYNC_CALLS or (name.startswith("cudaMemcpy") and "Async" not in name)


def copy_kind(name: str) -> tuple[str, str]:
    """(direction, memory) of a Kineto memcpy name such as "Memcpy HtoD (Pageable -> Device)":
    the memory is the host's side of the copy, the one that decides whether it can be async."""
    m = MEMCPY_NAME.match(name)
    if m is None:
        return "other", "unknown"
    kind, src, dst = m.groups()
    direction = DIRECTIONS.get(kind, kind.lower())
    if direction == "h2d":
        return direction, src.lower()
    if direction == "d2h":
        return direction, dst.lower()
    return direction, src.lower() if src == dst else f"{src.lower()}-{dst.lower()}"


def union_us(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of [start, end) intervals."""
    total = 0.0
    cur_start = cur_end = None
    for start, end in sorted(intervals):
        if cur_end is None or start > cur_end:
            if cur_end is not None:
                total += cur_end - cur_start
            cur_start, cur_end = start, end
        elif end > cur_end:
            cur_end = end
    if cur_end is not None:
        total += cur_end - cur_start
    return total


def _ms(us: float) -> float:
    return round(us / 1e3, 4)


def profiled_steps(
    trace: dict[str, Any] | list[dict[str, Any]], steps: list[tuple[float, float, int]] | None = None
) -> list[dict[str, Any]]:
    """One row of facts per ProfilerStep#N of a Kineto trace, in order of time; [] when the trace
    has no ProfilerStep spans. `steps`: the host's steps as (start, end, N) in the trace's µs (the
    training steps `dlscope run` recorded: a ProfilerStep mark also holds what ran between two
    steps), in place of the marks. The rules are in the module's docstring."""
    events = (trace.get("traceEvents") or []) if isinstance(trace, dict) else trace
    host_steps: list[tuple[float, float, int]] = []
    launches: dict[Any, float] = {}  # correlation id -> start of the launching call (µs)
    syncs: list[float] = []
    activities: list[dict[str, Any]] = []
    for e in events:
        if e.get("ph") != "X":
            continue
        cat = e.get("cat")
        if cat in GPU_CATS:
            activities.append(e)
        elif cat in LAUNCH_CATS:
            args = e.get("args") or {}
            if "correlation" in args:
                launches[args["correlation"]] = e["ts"]
            if is_sync(e.get("name", "")):
                syncs.append(e["ts"])
        elif cat in HOST_STEP_CATS and steps is None:
            name = e.get("name", "")
            if name.startswith(STEP_PREFIX) and name[len(STEP_PREFIX) :].isdigit():
                host_steps.append((e["ts"], e["ts"] + e.get("dur", 0.0), int(name[len(STEP_PREFIX) :])))
    if steps is not None:
        host_steps = list(steps)
    if not host_steps:
        return []
    host_steps.sort()
    starts = [s[0] for s in host_steps]

    def step_of(ts: float) -> int | None:
        i = bisect_right(starts, ts) - 1
        return i if i >= 0 and ts <= host_steps[i][1] else None

    n = len(host_steps)
    intervals: list[list[tuple[float, float]]] = [[] for _ in range(n)]
    kernels = [0] * n
    kernel_us = [0.0] * n
    copies: list[dict[tuple[str, str], list[float]]] = [{} for _ in range(n)]
    sync_calls = [0] * n
    for ts in syncs:
        i = step_of(ts)
        if i is not None:
            sync_calls[i] += 1
    for a in activities:
        args = a.get("args") or {}
        launched = launches.get(args.get("correlation"))
        if launched is None:
            continue
        i = step_of(launched)
        if i is None:
            continue
        start = a["ts"]
        dur = a.get("dur", 0.0)
        intervals[i].append((start, start + dur))
        cat = a["cat"]
        if cat == "kernel":
            kernels[i] += 1
            kernel_us[i] += dur
        elif cat == "gpu_memcpy":
            c = copies[i].setdefault(copy_kind(a.get("name", "")), [0, 0, 0.0])
            c[0] += 1
            c[1] += int(args.get("bytes", 0))
            c[2] += dur

    gpu_start = [min(s for s, _ in iv) if iv else None for iv in intervals]
    rows = []
    following: float | None = None  # the GPU start of the next step with GPU work
    for i in reversed(range(n)):
        host_start, host_end, number = host_steps[i]
        row: dict[str, Any] = {"profiler_step": number, "host_ms": _ms(host_end - host_start)}
        start = gpu_start[i]
        if start is None:
            row.update(gpu_span_ms=0.0, gpu_busy_ms=0.0, gpu_period_ms=None, gpu_idle_ms=None, busy_pct=None)
            row["gpu_lag_ms"] = None
        else:
            span = max(e for _, e in intervals[i]) - start
            busy = union_us(intervals[i])
            period = span if following is None else max(following - start, span)
            row.update(
                gpu_span_ms=_ms(span),
                gpu_busy_ms=_ms(busy),
                gpu_period_ms=_ms(period),
                gpu_idle_ms=_ms(period - busy),
                busy_pct=round(100 * busy / period, 2) if period > 0 else None,
                gpu_lag_ms=_ms(start - host_start),
            )
            following = start
        row["kernels"] = kernels[i]
        row["kernel_ms"] = _ms(kernel_us[i])
        row["sync_calls"] = sync_calls[i]
        row["copies"] = [
            {"direction": d, "memory": m, "count": c[0], "bytes": c[1], "ms": _ms(c[2])}
            for (d, m), c in sorted(copies[i].items())
        ]
        rows.append(row)
    rows.reverse()
    return rows


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def summary(steps: list[dict[str, Any]]) -> dict[str, Any]:
    """The means per step of `profiled_steps`' rows. Busy %, idle and lag are averaged over the
    steps with GPU work; `h2d_pageable_pct` is the share of all the bytes copied host to device
    that came from pageable memory (None when nothing was copied to the device); MB = 1e6 bytes."""
    n = len(steps)
    with_gpu = [s for s in steps if s.get("busy_pct") is not None]

    def mean(key: str, rows: list[dict[str, Any]] = steps, digits: int = 4) -> float | None:
        m = _mean([s[key] for s in rows])
        return None if m is None else round(m, digits)

    by_kind: dict[tuple[str, str], list[float]] = {}
    for s in steps:
        for c in s["copies"]:
            acc = by_kind.setdefault((c["direction"], c["memory"]), [0, 0, 0.0])
            acc[0] += c["count"]
            acc[1] += c["bytes"]
            acc[2] += c["ms"]
    h2d = sum(acc[1] for (d, _), acc in by_kind.items() if d == "h2d")
    pageable = sum(acc[1] for (d, m), acc in by_kind.items() if d == "h2d" and m == "pageable")
    per_step = n or 1
    return {
        "steps": n,
        "host_ms": mean("host_ms"),
        "gpu_busy_ms": mean("gpu_busy_ms"),
        "gpu_idle_ms": mean("gpu_idle_ms", with_gpu),
        "busy_pct": mean("busy_pct", with_gpu, 2),
        "gpu_lag_ms": mean("gpu_lag_ms", with_gpu),
        "kernels_per_step": mean("kernels", digits=2),
        "syncs_per_step": mean("sync_calls", digits=3),
        "copies_per_step": round(sum(a[0] for a in by_kind.values()) / per_step, 3) if n else None,
        "copy_bytes_per_step": round(sum(a[1] for a in by_kind.values()) / per_step) if n else None,
        "copies": [
            {
                "direction": d,
                "memory": m,
                "count": round(a[0] / per_step, 3),
                "bytes": round(a[1] / per_step),
                "ms": round(a[2] / per_step, 4),
            }
            for (d, m), a in sorted(by_kind.items())
        ],
        "h2d_bytes_per_step": round(h2d / per_step) if n else None,
        "h2d_mb_per_step": round(h2d / per_step / 1e6, 4) if n else None,
        "h2d_pageable_pct": round(100 * pageable / h2d, 2) if h2d else None,
    }
