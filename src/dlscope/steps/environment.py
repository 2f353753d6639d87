"""Step: the environment table (实验环境) the handouts ask every report to fill in."""

from __future__ import annotations

from typing import Any

from rich.table import Table as RichTable

from dlscope.console import console
from dlscope.observe.environment import collect_environment, environment_rows
from dlscope.report.blocks import Block, Table
from dlscope.steps.base import LabContext, LabStep


def run(ctx: LabContext) -> dict[str, Any]:
    env = collect_environment()
    table = RichTable(show_header=False, box=None, padding=(0, 2))
    for category, item, value in environment_rows(env):
        table.add_row(f"[dim]{category}", item, f"[metric]{value}")
    console.print(table)
    return env


def render(section: dict[str, Any]) -> list[Block]:
    rows = [list(r) for r in environment_rows(section)]
    return [Table(["", "item", "value"], rows, "实验环境 — the machine these results were measured on")]


STEP = LabStep("environment", "Environment", run, render)
