"""Step run (`dlscope run`): the user's command, observed from inside its Python processes. It
records the sections drawn from what they left (steps, anatomy, top10, phases, distributed,
iotrace) and returns the "run" section: the command, its exit status and the signal that
interrupted it."""

from __future__ import annotations

from typing import Any

from dlscope.errors import ConfigError
from dlscope.stages.base import Context, Step


def run(ctx: Context) -> dict[str, Any]:
    from dlscope.supervise.session import observe_command

    if ctx.steps.script is None:
        raise ConfigError("the run step needs a command")
    return observe_command(ctx.run, ctx.steps.script, ctx.say)


STEP = Step(
    "run", run, also=("steps", "anatomy", "gpu", "top10", "phases", "distributed", "iotrace", "hang", "batches")
)
