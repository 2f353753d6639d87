"""Section steps: every training step of the script `dlscope run` observed, its anatomy in ms."""

from __future__ import annotations

from typing import Any

from dlscope.report.blocks import Block, Para, Table

TITLE = "Training steps"
PARTS = ("data", "forward", "backward", "optimizer", "other")


def mebibytes(value: int | None) -> float | None:
    return None if value is None else round(value / 2**20, 1)


def render(section: dict[str, Any]) -> list[Block]:
    source = {"optimizer": "optimizer steps (torch.optim step hooks)", "backward": "backward() calls (no optimizer)"}
    per_process = ", ".join(f"pid {p['pid']}: {p['count']}" for p in section["processes"] if p["count"])
    rows = [
        [r["step"], r["ms"], *(r[f"{p}_ms"] for p in PARTS), mebibytes(r["peak_rss_bytes"]), r["profiled"] or ""]
        for r in section["rows"]
    ]
    shown = rows if len(rows) <= 20 else [*rows[:10], *rows[-10:]]
    caption = "Per step (ms; data = DataLoader wait or the gap before forward; MB = peak RSS in the step)"
    if len(rows) > 20:
        caption += f"; first and last 10 of {len(rows)}"
    if not rows:
        return [Para("No training step was seen: no process ran a backward() or an optimizer step.")]
    return [
        Para(
            f"{section['count']} steps in the training process (pid {section['main_pid']}), counted from "
            f"{source[section['source']]}. All processes with steps: {per_process}."
        ),
        Table(["step", "ms", "data", "fwd", "bwd", "opt", "other", "MB", "profiler"], shown, caption),
    ]
