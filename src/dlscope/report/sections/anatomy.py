"""Section anatomy (`dlscope run`): the mean step split into data, forward, backward, optimizer and
other, and the input-bound verdict."""

from __future__ import annotations

from typing import Any

from dlscope.report.blocks import Block, Findings, Para, Table
from dlscope.report.sections.steps import PARTS, mebibytes

TITLE = "Step anatomy"


def render(section: dict[str, Any]) -> list[Block]:
    if not section.get("steps_used"):
        return [Para(section.get("note", "No steps."))]
    level = {"highly": "bad", "moderately": "warn", "not": "good"}[section["input_bound"]]
    rows = [[p, section["mean_ms"][p], section["percent"][p]] for p in PARTS]
    memory = f"Peak RSS in a step: {mebibytes(section['peak_rss_bytes'])} MB."
    if section.get("peak_cuda_bytes") is not None:
        memory += f" Peak CUDA memory: {mebibytes(section['peak_cuda_bytes'])} MB."
    return [
        Findings([(level, section["verdict"])]),
        Table(["part", "mean ms", "% of step"], rows, f"Mean step anatomy over {section['used']}"),
        Para(memory),
    ]
