"""Step: the profiler's top-10 operators over real training steps (lab step 5)."""

from __future__ import annotations

from typing import Any

from rich.table import Table as RichTable

from dlscope.console import console
from dlscope.observe.profiler import TopOpsTable, profile_training, write_tables
from dlscope.report import plots
from dlscope.report.blocks import Block, Figure, Findings, Para, Table
from dlscope.steps.base import LabContext, LabStep
from dlscope.train import Trainer


def print_top(table: TopOpsTable, n: int = 10, sort_by: str | None = None) -> None:
    rich_table = RichTable(
        title=f"top {n} operators by {sort_by or table.sort_by} (sum over {table.steps} steps)", title_justify="left"
    )
    for column in ("operator", "calls", "self CPU", "self %", "CPU total", "µs/call", "GFLOP"):
        if column == "operator":
            rich_table.add_column(column, no_wrap=True, min_width=30)
        else:
            rich_table.add_column(column, justify="right")
    for row in table.top(n, sort_by):
        rich_table.add_row(
            row.name,
            f"{row.calls}",
            f"{row.self_cpu_us / 1000:.2f} ms",
            f"{table.share(row):.1f}%",
            f"{row.cpu_total_us / 1000:.2f} ms",
            f"{row.us_per_call:.1f}",
            f"{row.flops / 1e9:.3f}" if row.flops else "",
        )
    console.print(rich_table)


def run(ctx: LabContext) -> dict[str, Any]:
    assert ctx.data is not None, "the dataset step runs first"
    # after the train step: the trained model; alone (`dlscope profile`): a fresh one
    trainer = ctx.trainer or Trainer(ctx.config, ctx.data)
    options = ctx.options
    profile_dir = ctx.run.sub("profile")
    result = profile_training(
        trainer.model,
        trainer.optimizer,
        trainer.batches,
        wait=options.profile_wait,
        warmup=options.profile_warmup,
        active=options.profile_active,
        trace_path=profile_dir / "trace.json",
        sort_by=options.profile_sort,
    )
    print_top(result.table)
    paths = write_tables(result, profile_dir)
    flops_per_step = (ctx.run.results["sections"].get("model", {}).get("flops", {}) or {}).get("train_step_per_sample")
    section: dict[str, Any] = {
        "device": result.device,
        "batch_size": result.batch_size,
        "schedule": result.schedule,
        "sort_by": result.table.sort_by,
        "steps": result.table.steps,
        "step_ms": result.step_us / 1000,
        "step_parts_ms": {k: v / 1000 for k, v in result.step_parts_us.items()},
        "self_cpu_total_ms": result.table.self_cpu_total_us / 1000,
        "operators_per_step": sum(r.calls for r in result.table.rows) / max(result.table.steps, 1),
        "top10": result.table.to_records(10),
        "top10_by_total": [r["name"] for r in result.table.to_records(10, "cpu_total")],
        "trace": ctx.run.rel(result.trace_path) if result.trace_path else None,
        "tables": {k: ctx.run.rel(v) for k, v in paths.items()},
    }
    if flops_per_step:
        section["train_flops_per_step"] = flops_per_step * result.batch_size
        section["achieved_gflops"] = section["train_flops_per_step"] / (result.step_us * 1e3)
    console.print(
        f"{section['step_ms']:.2f} ms per training step at batch {result.batch_size}, "
        f"{section['operators_per_step']:.0f} operator calls per step; trace [path]{section['trace']}[/] "
        "(open in ui.perfetto.dev or chrome://tracing)"
    )
    return section


def top_chart(section: dict[str, Any]) -> bytes:
    rows = section["top10"][::-1]
    fig, axes = plots.subplots(1, width=7.5, height=3.4)
    ax = axes[0][0]
    ax.barh(
        [r["name"].replace("aten::", "") for r in rows],
        [r["self_cpu_us"] / 1000 / section["steps"] for r in rows],
        color="#2f5bd3",
    )
    ax.set(xlabel="self CPU time per step (ms)", title=f"Top-10 operators, batch {section['batch_size']}")
    return plots.png(fig)


def render(section: dict[str, Any]) -> list[Block]:
    steps = section["steps"]
    rows = [
        [
            r["name"],
            r["calls"] // steps if steps else r["calls"],
            r["self_cpu_us"] / 1000,
            r["self_cpu_pct"],
            r["cpu_total_us"] / 1000,
            r["us_per_call"],
            r["flops"] / 1e6 if r["flops"] else None,
        ]
        for r in section["top10"]
    ]
    parts = section.get("step_parts_ms") or {}
    items = []
    top = section["top10"][0] if section["top10"] else None
    if top:
        items.append(
            (
                "info",
                f"{top['name']} takes {top['self_cpu_pct']:.1f}% of operator self time — "
                f"the largest single cost of a training step at batch {section['batch_size']}.",
            )
        )
    if parts:
        total = sum(parts.values())
        share = ", ".join(f"{k.split('/')[1]} {v:.2f} ms ({100 * v / total:.0f}%)" for k, v in parts.items())
        items.append(("info", f"A step splits into {share}."))
    if section.get("achieved_gflops"):
        items.append(
            (
                "info",
                f"Achieved {section['achieved_gflops']:.1f} GFLOP/s over whole training "
                f"steps ({section['train_flops_per_step'] / 1e6:.0f} MFLOP per step).",
            )
        )
    blocks: list[Block] = [
        Para(
            f"torch.profiler over {steps} real training steps (forward, backward, optimizer) at batch "
            f"{section['batch_size']} on {section['device']}, after {section['schedule']['wait']} skipped "
            f"and {section['schedule']['warmup']} warm-up steps — not one forward pass of one sample "
            "before warm-up as the reference script did. Times are summed over the active steps; "
            f"a step took {section['step_ms']:.2f} ms with {section['operators_per_step']:.0f} operator calls."
        ),
        Findings(items),
        Table(
            ["operator", "calls/step", "self CPU ms", "self %", "CPU total ms", "µs/call", "MFLOP"],
            rows,
            f"使用率前十名的操作 — top 10 by {section['sort_by']} (sum over {steps} steps)",
        ),
        Figure("profile_top10", top_chart(section), "Self CPU time per step of the top-10 operators"),
        Para(f"Full tables: {', '.join(section['tables'].values())}; Chrome/Perfetto trace: {section['trace']}."),
    ]
    return blocks


STEP = LabStep("profile", "Profiler: top-10 operators", run, render)
