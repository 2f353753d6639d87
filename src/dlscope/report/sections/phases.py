"""Section phases (`dlscope run`): startup, first batch, train steps, eval, checkpoints of the script."""

from __future__ import annotations

import os
from typing import Any

from dlscope.report.blocks import Block, Para, Table

TITLE = "Phases"


def files_cell(files: list[str]) -> str:
    """Every file, never cut: names under their common directory when they share one (the table
    wraps the cell at narrow widths)."""
    if len(files) < 2:
        return ", ".join(files)
    common = os.path.commonpath(files)
    if common in ("", "/") or common in files:
        return ", ".join(files)
    return f"{common}/: " + ", ".join(os.path.relpath(f, common) for f in files)


def render(section: dict[str, Any]) -> list[Block]:
    rows = [[t["phase"], t["count"], round(t["seconds"], 3), files_cell(t["files"])] for t in section["totals"]]
    return [
        Para(
            "Phases found without changing the script, emitted as dlscope phase markers (so --trace-io sees them): "
            "startup until the first batch, first_batch until the first step ends, then train_steps; eval and "
            "checkpoint_save/checkpoint_load inside them."
        ),
        Table(["phase", "times", "s", "files"], rows, "Phases, all processes"),
    ]
