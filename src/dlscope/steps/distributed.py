"""Step: the job's per-rank anatomy, communication, overlap and stragglers, from each rank's Kineto
trace (ranks/rank<k>/trace.json) through dlscope.observe.distributed.analysis."""

from __future__ import annotations

from typing import Any

from dlscope.errors import DlscopeError
from dlscope.observe.distributed.analysis import analyze_ranks
from dlscope.steps.base import Context, Step


def run(ctx: Context) -> dict[str, Any]:
    assert ctx.trainer is not None  # needs "trained"
    traces = {
        int(path.parent.name.removeprefix("rank")): path for path in (ctx.run.path / "ranks").glob("rank*/trace.json")
    }
    if not traces:
        raise DlscopeError("no rank wrote a profiler trace (ranks/rank<k>/trace.json)", ctx.run.path)
    grad_bytes = sum(p.numel() * p.element_size() for p in ctx.trainer.model.parameters() if p.requires_grad)
    section = analyze_ranks(traces, grad_bytes=grad_bytes)
    section["traces"] = {rank: ctx.run.rel(path) for rank, path in section["traces"].items()}
    return section


STEP = Step("distributed", run, needs=("trained",))
