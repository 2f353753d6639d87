"""Step: the job's per-rank anatomy, communication, overlap and stragglers, from each rank's Kineto
trace (trace.json in its rank folder) through dlscope.analysis.ranks."""

from __future__ import annotations

from typing import Any

from dlscope.analysis.ranks import analyze_ranks
from dlscope.errors import DlscopeError
from dlscope.rundir import rank_files
from dlscope.stages.base import Context, Step


def run(ctx: Context) -> dict[str, Any]:
    assert ctx.trainer is not None  # needs "trained"
    traces = rank_files(ctx.run.path, "trace.json")
    if not traces:
        raise DlscopeError("no rank wrote a profiler trace (trace.json in its folder under ranks/)", ctx.run.path)
    grad_bytes = sum(p.numel() * p.element_size() for p in ctx.trainer.model.parameters() if p.requires_grad)
    section = analyze_ranks(traces, grad_bytes=grad_bytes)
    section["traces"] = {rank: ctx.run.rel(path) for rank, path in section["traces"].items()}
    return section


STEP = Step("distributed", run, needs=("trained",))
