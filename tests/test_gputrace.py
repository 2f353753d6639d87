"""gputrace: the profiled steps' GPU busy and idle time, copies and syncs, from Kineto traces.

The fixtures are real H100 traces of tests/scripts/cuda_truth.py (tests/data/gpu/README.md); the
assertions are what each loop must show, not the numbers it happened to show."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from dlscope.analysis import gputrace

DATA = Path(__file__).parent / "data" / "gpu"
MiB = 1 << 20


def load(mode: str) -> dict[str, Any]:
    with gzip.open(DATA / f"{mode}.json.gz", "rt") as f:
        return json.load(f)


@pytest.fixture(scope="module", params=["item", "pageable", "compute"])
def real(request: pytest.FixtureRequest) -> tuple[str, list[dict[str, Any]]]:
    return request.param, gputrace.profiled_steps(load(request.param))


def step_spans(trace: dict[str, Any]) -> list[int]:
    return [
        int(e["name"].removeprefix("ProfilerStep#"))
        for e in sorted(trace["traceEvents"], key=lambda e: e["ts"])
        if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#")
    ]


# --- the real traces ---------------------------------------------------------------------------


def test_one_row_per_profiler_step_in_order(real: tuple[str, list[dict[str, Any]]]) -> None:
    mode, steps = real
    assert [s["profiler_step"] for s in steps] == step_spans(load(mode))
    assert all(s["kernels"] > 0 for s in steps)


def test_time_invariants(real: tuple[str, list[dict[str, Any]]]) -> None:
    _, steps = real
    for s in steps:
        assert 0 < s["gpu_busy_ms"] <= s["gpu_span_ms"] <= s["gpu_period_ms"]
        assert s["kernel_ms"] <= s["gpu_busy_ms"] + 1e-3  # one stream: kernels do not overlap
        assert s["gpu_idle_ms"] == pytest.approx(s["gpu_period_ms"] - s["gpu_busy_ms"], abs=1e-3)
        assert 0 < s["busy_pct"] <= 100
        assert s["busy_pct"] == pytest.approx(100 * s["gpu_busy_ms"] / s["gpu_period_ms"], abs=0.01)
        assert s["gpu_lag_ms"] >= 0  # the GPU cannot run work before the host launched it
    assert steps[-1]["gpu_period_ms"] == steps[-1]["gpu_span_ms"]


def test_periods_tile_the_gpu_timeline(real: tuple[str, list[dict[str, Any]]]) -> None:
    """Consecutive periods run from one step's GPU start to the next's: their sum is the time
    from the first step's GPU start to the last step's GPU end (one stream, no overlap)."""
    mode, steps = real
    trace = load(mode)
    launched = {e["args"]["correlation"] for e in trace["traceEvents"] if e.get("cat") in gputrace.LAUNCH_CATS}
    gpu = [
        e for e in trace["traceEvents"] if e.get("cat") in gputrace.GPU_CATS and e["args"]["correlation"] in launched
    ]
    first = min(e["ts"] for e in gpu)
    last = max(e["ts"] + e["dur"] for e in gpu)
    assert sum(s["gpu_period_ms"] for s in steps) == pytest.approx((last - first) / 1e3, abs=0.01)


def test_pageable_copies_every_batch_from_pageable_memory() -> None:
    steps = gputrace.profiled_steps(load("pageable"))
    for s in steps:
        h2d = [c for c in s["copies"] if c["direction"] == "h2d"]
        assert {c["memory"] for c in h2d} == {"pageable"}
        assert h2d[0]["count"] >= 1 and h2d[0]["bytes"] >= 32 * MiB
        assert s["sync_calls"] >= 1  # a blocking copy from pageable memory waits on the stream
    summary = gputrace.summary(steps)
    assert summary["h2d_pageable_pct"] == pytest.approx(100.0)
    assert summary["h2d_bytes_per_step"] >= 32 * MiB
    assert summary["h2d_mb_per_step"] == pytest.approx(summary["h2d_bytes_per_step"] / 1e6, abs=1e-3)


def test_pageable_batch_is_one_32mib_copy() -> None:
    """The batch of 4096 x 2048 float32 is one 32 MiB copy per step, beside the labels' small one."""
    trace = load("pageable")
    copies = [e for e in trace["traceEvents"] if e.get("cat") == "gpu_memcpy"]
    assert len([e for e in copies if e["args"]["bytes"] == 32 * MiB]) == len(gputrace.profiled_steps(trace))
    assert {gputrace.copy_kind(e["name"]) for e in copies} == {("h2d", "pageable")}


def test_compute_keeps_the_gpu_busy_without_syncs() -> None:
    steps = gputrace.profiled_steps(load("compute"))
    assert all(s["busy_pct"] > 95 for s in steps)
    assert all(s["sync_calls"] == 0 for s in steps)
    assert all(s["copies"] == [] for s in steps)
    # the host queues work far ahead of the GPU: each step's work starts later after its launch
    lags = [s["gpu_lag_ms"] for s in steps]
    assert lags == sorted(lags) and lags[-1] > lags[0]
    assert all(s["host_ms"] < s["gpu_span_ms"] for s in steps)
    summary = gputrace.summary(steps)
    assert summary["busy_pct"] > 95 and summary["syncs_per_step"] == 0
    assert summary["h2d_pageable_pct"] is None


def test_compute_leaves_out_work_launched_before_the_window() -> None:
    """Kernels that ran in the window but were launched before it (their launch is not in the
    trace) belong to no step."""
    trace = load("compute")
    launched = {e["args"]["correlation"] for e in trace["traceEvents"] if e.get("cat") in gputrace.LAUNCH_CATS}
    kernels = [e for e in trace["traceEvents"] if e.get("cat") == "kernel"]
    orphans = [e for e in kernels if e["args"]["correlation"] not in launched]
    assert orphans  # the trace has them: the point of the test
    steps = gputrace.profiled_steps(trace)
    assert sum(s["kernels"] for s in steps) == len(kernels) - len(orphans)


def test_item_syncs_every_step() -> None:
    steps = gputrace.profiled_steps(load("item"))
    for s in steps:
        assert s["sync_calls"] >= 1
        d2h = [c for c in s["copies"] if c["direction"] == "d2h"]
        assert d2h and d2h[0]["bytes"] == 4  # the float32 loss
    summary = gputrace.summary(steps)
    assert summary["syncs_per_step"] >= 1
    # the host waits on the GPU each step, so the GPU is idle much of the time
    assert summary["busy_pct"] < gputrace.summary(gputrace.profiled_steps(load("compute")))["busy_pct"]


def test_the_gpu_user_annotation_misses_backward_work() -> None:
    """Why the steps' GPU side comes from correlation ids: the GPU ProfilerStep span leaves out
    the kernels the autograd thread launched."""
    trace = load("item")
    annotated = {
        e["name"]: e["dur"] / 1e3
        for e in trace["traceEvents"]
        if e.get("cat") == "gpu_user_annotation" and e["name"].startswith("ProfilerStep#")
    }
    for s in gputrace.profiled_steps(trace):
        assert s["gpu_span_ms"] > annotated[f"ProfilerStep#{s['profiler_step']}"]


# --- synthetic traces ---------------------------------------------------------------------------


def X(cat: str, name: str, ts: float, dur: float, **args: Any) -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": 0, "ts": ts, "dur": dur, "args": args}


def launch(corr: int, ts: float, name: str = "cudaLaunchKernel") -> dict[str, Any]:
    return X("cuda_runtime", name, ts, 1.0, correlation=corr)


def test_overlapping_kernels_on_two_streams_count_once() -> None:
    trace = {
        "traceEvents": [
            X("user_annotation", "ProfilerStep#0", 0, 100),
            launch(1, 10),
            launch(2, 11),
            X("kernel", "a", 1000, 400, stream=7, correlation=1),  # [1000, 1400)
            X("kernel", "b", 1200, 400, stream=8, correlation=2),  # [1200, 1600): 200 µs shared
        ]
    }
    (s,) = gputrace.profiled_steps(trace)
    assert s["kernels"] == 2
    assert s["kernel_ms"] == pytest.approx(0.8)  # the sum
    assert s["gpu_busy_ms"] == pytest.approx(0.6)  # the union
    assert s["gpu_span_ms"] == pytest.approx(0.6)
    assert s["gpu_idle_ms"] == pytest.approx(0.0) and s["busy_pct"] == pytest.approx(100.0)
    assert s["gpu_lag_ms"] == pytest.approx(1.0)


def test_idle_is_the_gap_to_the_next_step() -> None:
    trace = {
        "traceEvents": [
            X("user_annotation", "ProfilerStep#4", 0, 100),
            X("user_annotation", "ProfilerStep#5", 100, 100),
            launch(1, 10),
            launch(2, 20, "cudaMemcpyAsync"),
            launch(3, 30, "cudaMemsetAsync"),
            launch(4, 110),
            X("kernel", "a", 200, 100, correlation=1),
            X("gpu_memcpy", "Memcpy HtoD (Pinned -> Device)", 350, 50, correlation=2, bytes=1000),
            X("gpu_memset", "Memset (Device)", 400, 50, correlation=3, bytes=8),
            X("kernel", "b", 1000, 100, correlation=4),
        ]
    }
    first, second = gputrace.profiled_steps(trace)
    assert [first["profiler_step"], second["profiler_step"]] == [4, 5]
    assert first["gpu_span_ms"] == pytest.approx(0.25)
    assert first["gpu_busy_ms"] == pytest.approx(0.2)  # kernel + memcpy + memset
    assert first["gpu_period_ms"] == pytest.approx(0.8)  # 200 -> 1000, the next step's GPU start
    assert first["gpu_idle_ms"] == pytest.approx(0.6)
    assert first["busy_pct"] == pytest.approx(25.0)
    assert first["kernels"] == 1
    assert first["copies"] == [{"direction": "h2d", "memory": "pinned", "count": 1, "bytes": 1000, "ms": 0.05}]
    assert second["gpu_period_ms"] == second["gpu_span_ms"] == pytest.approx(0.1)  # the last: its span


def test_syncs_counted_in_the_step_that_made_them() -> None:
    trace = {
        "traceEvents": [
            X("user_annotation", "ProfilerStep#0", 0, 100),
            X("user_annotation", "ProfilerStep#1", 100, 100),
            launch(1, 10),
            X("kernel", "a", 20, 10, correlation=1),
            X("cuda_runtime", "cudaStreamSynchronize", 50, 5, correlation=2),
            X("cuda_runtime", "cudaMemcpy", 150, 5, correlation=3),
            X("cuda_runtime", "cudaEventSynchronize", 160, 5, correlation=4),
            X("cuda_runtime", "cudaMemcpyAsync", 170, 5, correlation=5),  # not a sync
            X("cuda_runtime", "cudaDeviceSynchronize", 500, 5, correlation=6),  # after every step
        ]
    }
    first, second = gputrace.profiled_steps(trace)
    assert first["sync_calls"] == 1 and second["sync_calls"] == 2
    assert second["kernels"] == 0 and second["busy_pct"] is None and second["gpu_span_ms"] == 0
    summary = gputrace.summary([first, second])
    assert summary["syncs_per_step"] == pytest.approx(1.5)
    assert summary["busy_pct"] == first["busy_pct"]  # the step without GPU work is left out


def test_work_launched_outside_every_step_belongs_to_none() -> None:
    trace = {
        "traceEvents": [
            X("user_annotation", "ProfilerStep#0", 100, 100),
            launch(1, 50),  # before the step
            launch(2, 150),
            X("kernel", "early", 300, 100, correlation=1),
            X("kernel", "mine", 400, 100, correlation=2),
            X("kernel", "unknown", 500, 100, correlation=99),  # its launch is not in the trace
        ]
    }
    (s,) = gputrace.profiled_steps(trace)
    assert s["kernels"] == 1 and s["gpu_busy_ms"] == pytest.approx(0.1)


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("Memcpy HtoD (Pageable -> Device)", ("h2d", "pageable")),
        ("Memcpy HtoD (Pinned -> Device)", ("h2d", "pinned")),
        ("Memcpy DtoH (Device -> Pageable)", ("d2h", "pageable")),
        ("Memcpy DtoH (Device -> Pinned)", ("d2h", "pinned")),
        ("Memcpy DtoD (Device -> Device)", ("d2d", "device")),
        ("something else", ("other", "unknown")),
    ],
)
def test_copy_kind(name: str, kind: tuple[str, str]) -> None:
    assert gputrace.copy_kind(name) == kind


def test_no_profiler_steps() -> None:
    trace = {"traceEvents": [launch(1, 0), X("kernel", "a", 10, 10, correlation=1)]}
    assert gputrace.profiled_steps(trace) == []
    assert gputrace.profiled_steps({}) == []
    summary = gputrace.summary([])
    assert summary["steps"] == 0 and summary["busy_pct"] is None and summary["copies"] == []


def test_summary_means_and_pageable_share() -> None:
    def step(copies: list[dict[str, Any]], busy_pct: float, idle: float, syncs: int) -> dict[str, Any]:
        return {
            "host_ms": 1.0,
            "gpu_busy_ms": 1.0,
            "gpu_idle_ms": idle,
            "busy_pct": busy_pct,
            "gpu_lag_ms": 0.0,
            "kernels": 1,
            "sync_calls": syncs,
            "copies": copies,
        }

    pageable = {"direction": "h2d", "memory": "pageable", "count": 1, "bytes": 300, "ms": 1.0}
    pinned = {"direction": "h2d", "memory": "pinned", "count": 2, "bytes": 100, "ms": 1.0}
    back = {"direction": "d2h", "memory": "pageable", "count": 1, "bytes": 4, "ms": 0.5}
    summary = gputrace.summary([step([pageable, back], 40.0, 3.0, 2), step([pinned], 60.0, 1.0, 0)])
    assert summary["busy_pct"] == pytest.approx(50.0)
    assert summary["gpu_idle_ms"] == pytest.approx(2.0)
    assert summary["syncs_per_step"] == pytest.approx(1.0)
    assert summary["copies_per_step"] == pytest.approx(2.0)
    assert summary["copy_bytes_per_step"] == 202
    assert summary["h2d_bytes_per_step"] == 200
    assert summary["h2d_pageable_pct"] == pytest.approx(75.0)  # d2h bytes do not count
    kinds = {(c["direction"], c["memory"]): c for c in summary["copies"]}
    assert kinds["h2d", "pinned"]["count"] == pytest.approx(1.0)
    assert kinds["d2h", "pageable"]["bytes"] == 2


def test_an_evaluation_in_a_profiler_step_mark_is_not_the_steps_gpu_work() -> None:
    """torch's ProfilerStep#1 runs from the end of step 0 to the end of step 1, over an
    evaluation between them: given the step's own span (what `dlscope run` recorded), the
    evaluation's kernel and its sync are no step's."""
    trace = {
        "traceEvents": [
            X("user_annotation", "ProfilerStep#0", 0, 100),
            X("user_annotation", "ProfilerStep#1", 100, 400),  # the evaluation 110-300, step 1 from 350
            launch(1, 10),
            launch(2, 120),  # the evaluation's forward
            launch(3, 200, "cudaStreamSynchronize"),  # its .item()
            launch(4, 360),
            X("kernel", "train0", 150, 50, correlation=1),
            X("kernel", "eval", 250, 500, correlation=2),
            X("kernel", "train1", 800, 50, correlation=4),
        ]
    }
    marks = gputrace.profiled_steps(trace)
    assert [s["kernels"] for s in marks] == [1, 2] and marks[1]["sync_calls"] == 1
    first, second = gputrace.profiled_steps(trace, [(0, 100, 0), (350, 500, 1)])
    assert [first["kernels"], second["kernels"], second["sync_calls"]] == [1, 1, 0]
    assert second["kernel_ms"] == pytest.approx(0.05) and second["host_ms"] == pytest.approx(0.15)
