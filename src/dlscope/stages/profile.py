"""Step: the profiler's top-10 operators over real training steps (lab step 5)."""

from __future__ import annotations

from typing import Any

from dlscope.instruments.profiler import profile_training, write_tables
from dlscope.stages.base import Context, Step


def run(ctx: Context) -> dict[str, Any]:
    trainer = ctx.trainer  # after the train step: the trained model; alone (`dlscope profile`): a fresh one
    assert trainer is not None
    options = ctx.steps.profile
    profile_dir = ctx.run.sub("profile")
    result = profile_training(
        trainer.model,
        trainer.optimizer,
        trainer.batches,
        wait=options.wait,
        warmup=options.warmup,
        active=options.active,
        trace_path=profile_dir / "trace.json",
        sort_by=options.sort_by,
    )
    paths = write_tables(result, profile_dir)
    flops_per_step = (ctx.section("model").get("flops") or {}).get("train_step_per_sample")
    section: dict[str, Any] = {
        "device": result.device,
        "batch_size": result.batch_size,
        "schedule": result.schedule,
        "sort_by": result.table.sort_by,
        "steps": result.table.steps,
        "step_ms": result.step_us / 1000,
        "step_parts_ms": {k: v / 1000 for k, v in result.step_parts_us.items()},
        "self_cpu_total_ms": result.table.self_cpu_total_us / 1000,
        "operators_per_step": sum(r.calls for r in result.table.rows) / max(result.table.steps, 1),
        "top10": result.table.to_records(10),
        "top10_by_total": [r["name"] for r in result.table.to_records(10, "cpu_total")],
        "trace": ctx.run.rel(result.trace_path) if result.trace_path else None,
        "tables": {k: ctx.run.rel(v) for k, v in paths.items()},
    }
    if flops_per_step:
        section["train_flops_per_step"] = flops_per_step * result.batch_size
        section["achieved_gflops"] = section["train_flops_per_step"] / (result.step_us * 1e3)
    return section


STEP = Step("profile", run, needs=("dataset", "trainer"))
