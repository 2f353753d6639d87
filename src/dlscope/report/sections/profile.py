"""Section profile: the profiler's top-10 operators over real training steps (lab step 5)."""

from __future__ import annotations

from functools import partial
from typing import Any

from dlscope.report.blocks import Block, Figure, Findings, Para, Table

TITLE = "Profiler: top-10 operators"


def top_chart(section: dict[str, Any]) -> bytes:
    from dlscope.report import plots  # matplotlib: only when a report draws

    rows = section["top10"][::-1]
    fig, (ax,) = plots.subplots(1, width=7.5, height=3.4)
    ax.barh(
        [r["name"].replace("aten::", "") for r in rows],
        [r["self_cpu_us"] / 1000 / section["steps"] for r in rows],
        color="#2f5bd3",
    )
    ax.set(xlabel="self CPU time per step (ms)", title=f"Top-10 operators, batch {section['batch_size']}")
    return plots.png(fig)


def render(section: dict[str, Any]) -> list[Block]:
    steps = section["steps"]
    per_step = max(steps, 1)
    rows = [
        [
            r["name"].removeprefix("aten::"),
            round(r["calls"] / per_step),
            r["self_cpu_us"] / 1000 / per_step,
            r["self_cpu_pct"],
            r["cpu_total_us"] / 1000 / per_step,
            r["us_per_call"],
            r["flops"] / 1e6 / per_step if r["flops"] else None,
        ]
        for r in section["top10"]
    ]
    parts = section.get("step_parts_ms") or {}
    items = []
    top = section["top10"][0] if section["top10"] else None
    if top:
        largest = f"the largest single cost of a training step at batch {section['batch_size']}"
        items.append(("info", f"{top['name']} takes {top['self_cpu_pct']:.1f}% of operator self time — {largest}."))
    if parts:
        total = sum(parts.values())
        share = ", ".join(f"{k.split('/')[1]} {v:.2f} ms ({100 * v / total:.0f}%)" for k, v in parts.items())
        items.append(("info", f"A step splits into {share}."))
    if section.get("achieved_gflops"):
        per_step = f"{section['train_flops_per_step'] / 1e6:.0f} MFLOP per step"
        text = f"Achieved {section['achieved_gflops']:.1f} GFLOP/s over whole training steps ({per_step})."
        items.append(("info", text))
    blocks: list[Block] = [
        Para(
            f"torch.profiler over {steps} real training steps (forward, backward, optimizer) at batch "
            f"{section['batch_size']} on {section['device']}, after {section['schedule']['wait']} skipped "
            f"and {section['schedule']['warmup']} warm-up steps — not one forward pass of one sample "
            "before warm-up as the reference script did. Every figure is per training step, the mean over "
            f"the active steps; a step took {section['step_ms']:.2f} ms with "
            f"{section['operators_per_step']:.0f} operator calls."
        ),
        Findings(items),
        Table(
            ["operator", "calls", "self ms", "self %", "total ms", "µs/call", "MFLOP"],
            rows,
            f"使用率前十名的操作 — top 10 operators by {section['sort_by']}, per training step",
            legend="aten:: omitted from names. self: time in the operator itself; total: with the operators it "
            "calls; MFLOP: counted for matmul and convolution only.",
            optional=("total ms", "MFLOP"),
        ),
        Figure("profile_top10", partial(top_chart, section), "Self CPU time per step of the top-10 operators"),
        Para(f"Full tables: {', '.join(section['tables'].values())}; Chrome/Perfetto trace: {section['trace']}."),
    ]
    return blocks
