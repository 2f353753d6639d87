"""Step: the environment table (实验环境) the handouts ask every report to fill in."""

from __future__ import annotations

from typing import Any

from dlscope.instruments.environment import collect_environment
from dlscope.stages.base import Context, Step


def run(ctx: Context) -> dict[str, Any]:
    return collect_environment()


STEP = Step("environment", run)
