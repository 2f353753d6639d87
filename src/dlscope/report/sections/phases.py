"""Section phases (`dlscope run`): startup, first batch, train steps, eval, checkpoints of the script."""

from __future__ import annotations

from typing import Any

from dlscope.report.blocks import Block, Para, Table

TITLE = "Phases"


def render(section: dict[str, Any]) -> list[Block]:
    rows = [[t["phase"], t["count"], round(t["seconds"], 3), ", ".join(t["files"])[-30:]] for t in section["totals"]]
    return [
        Para(
            "Phases found without changing the script, emitted as dlscope phase markers (so --trace-io sees them): "
            "startup until the first batch, first_batch until the first step ends, then train_steps; eval and "
            "checkpoint_save/checkpoint_load inside them."
        ),
        Table(["phase", "times", "s", "files (end)"], rows, "Phases, all processes"),
    ]
