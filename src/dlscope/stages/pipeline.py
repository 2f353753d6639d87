"""Step: input-pipeline experiments — read buffer, small files against shards, cold and warm
cache, workers and prefetch (the lab runs a short sweep; `dlscope pipeline sweep` the full one)."""

from __future__ import annotations

from typing import Any

from dlscope.experiments.pipeline.parameter_sweep import run_parameter_sweep
from dlscope.stages.base import Context, Step


def run(ctx: Context) -> dict[str, Any]:
    assert ctx.data is not None
    options = ctx.steps.pipeline
    with ctx.task("preparing small files, shards and array") as task:
        finished = 0

        def on_row(description: str, total: int) -> None:
            nonlocal finished
            task.update(description=description, total=total, advance=1 if finished else 0)
            finished += 1

        return run_parameter_sweep(
            options.plan, ctx.run.sub("pipeline"), ctx.data, on_row, remove_data=options.remove_data
        )


STEP = Step("pipeline", run, needs=("dataset",))
