"""Section top10 (`dlscope run`): the profiler's top-10 operators over real steps of the script."""

from __future__ import annotations

from typing import Any

from dlscope.report.blocks import Block, Para, Table

TITLE = "Top-10 operators of the script"


def render(section: dict[str, Any]) -> list[Block]:
    if not section.get("rows"):
        why = {
            "no_steps": "no training step was seen, so nothing was profiled",
            "unfinished": f"the profiler had not finished when the command ended ({section.get('steps')} steps seen)",
        }
        return [Para(f"No operator profile: {why.get(section.get('why_empty', ''), 'nothing recorded')}.")]
    rows = [
        [r["name"], r["calls"], round(r["self_cpu_us"] / 1000, 3), r["self_cpu_pct"], round(r["us_per_call"], 1)]
        for r in section["rows"]
    ]
    cost = section["profiled_cost"]
    blocks: list[Block] = [
        Table(
            ["operator", "calls", "self ms", "self %", "µs/call"],
            rows,
            f"Top 10 of {section['operators']} operators over {section['active_steps']} profiled steps "
            f"(sorted by {section['sort_by']})",
        ),
        Table(
            ["profiler step", "operators"],
            [[r["step"], r["ops"]] for r in section["ops_per_step"]],
            "Operators per profiled step",
        ),
    ]
    if cost.get("ratio"):
        blocks.append(
            Para(
                f"The profiler's own cost: a profiled step took {cost['active_step_ms']:.1f} ms (median) against "
                f"{cost['unprofiled_step_ms']:.1f} ms unprofiled ({cost['ratio']:.2f}×); between steps it took "
                f"{cost['between_steps_seconds']:.2f} s in all, writing its trace {cost['export_seconds']:.2f} s of "
                "that. Steps outside the schedule run with the profiler off."
            )
        )
    blocks.append(Para(f"Profiler trace: {section['trace']}."))
    return blocks
