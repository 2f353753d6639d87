"""Step: input-pipeline experiments — read buffer, small files against shards, cold and warm
cache, workers and prefetch (the lab runs a short sweep; `dlscope pipeline sweep` the full one)."""

from __future__ import annotations

from typing import Any

from rich.table import Table as RichTable

from dlscope.console import console, step_progress
from dlscope.data.mnist import load_mnist
from dlscope.data.pipeline.sweep import (
    COLUMNS,
    ENGINE_COLUMNS,
    SweepPlan,
    engine_cells,
    findings,
    own_rows,
    ratio_text,
    row_cells,
    run_sweep,
    table_pairs,
)
from dlscope.report import plots
from dlscope.report.blocks import Block, Figure, Findings, Para, Table
from dlscope.steps.base import LabContext, LabStep

VERDICT_STYLE = {"input-bound": "bad", "balanced": "warn", "compute-bound": "good"}
FINDING_STYLE = {"good": "good", "info": "metric", "warn": "warn", "bad": "bad"}


def run(ctx: LabContext) -> dict[str, Any]:
    plan: SweepPlan = ctx.options.extra.get("pipeline_plan") or SweepPlan.short()
    data = ctx.data or load_mnist(ctx.options.data_dir)
    with step_progress(ctx.options.progress) as progress:
        task = progress.add_task("preparing small files, shards and array", total=None)

        finished = 0

        def on_row(description: str, total: int) -> None:
            nonlocal finished
            progress.update(task, description=description, total=total, completed=finished)
            finished += 1

        section = run_sweep(
            plan,
            ctx.run.sub("pipeline"),
            data,
            on_row,
            remove_data=ctx.options.extra.get("pipeline_remove_data", False),
        )
    machine = section["machine"]
    console.print(
        f"[dim]{machine['cpus']} CPUs, load average {machine['load_average'][0]:.1f} before and "
        f"{machine['load_after'][0]:.1f} after; each row: median of {plan.repeats} interleaved run(s)[/]"
    )
    for table in section["tables"]:
        console.print(rich_table(table))
    for table in section["tables"]:
        if table_pairs(table):
            console.print(rich_engine_table(table))
    for level, text in findings(section):
        console.print(f"[{FINDING_STYLE[level]}]{'✔' if level == 'good' else '•'}[/] {text}")
    return section


TERMINAL_COLUMNS = ["cache", "wall s", "wait s", "compute s", "read s", "reads", "reads:steps", "samples/s", "AU %"]


def rich_table(table: dict[str, Any]) -> RichTable:
    """A compact terminal version of the report table (the report adds MB, MB/s and disk bytes)."""
    out = RichTable(
        title=f"[phase]{table['title']}[/] — {table['samples']:,} samples",
        title_justify="left",
        box=None,
        padding=(0, 1),
    )
    out.add_column(table["varied"])
    for column in TERMINAL_COLUMNS:
        out.add_column(column, justify="left" if column == "cache" else "right")
    out.add_column("verdict")
    for row in own_rows(table):
        cold_mark = {True: "✔", False: "[bad]✘[/]", None: "?"}[row["cold_verified"]]
        out.add_row(
            row["label"],
            f"cold{cold_mark}" if row["cache"] == "cold" else "warm",
            f"{row['wall_s']:.2f}",
            f"{row['wait_s']:.2f}",
            f"{row['compute_s']:.2f}",
            f"{row['read_s']:.2f}" if row["read_s"] is not None else "—",
            f"{row['reads']:,}",
            ratio_text(row["reads_per_step"]),
            f"{row['samples_per_s'] or 0:,.0f}",
            f"{100 * row['au']:.0f}",
            f"[{VERDICT_STYLE[row['verdict']]}]{row['verdict']}[/]",
        )
    return out


def rich_engine_table(table: dict[str, Any]) -> RichTable:
    """dlscope's stages and tf.data on the same rows, side by side."""
    out = RichTable(
        title=f"[phase]{table['title']}[/]: dlscope / tf.data", title_justify="left", box=None, padding=(0, 1)
    )
    out.add_column(table["varied"])
    for column in ENGINE_COLUMNS:
        out.add_column(column, justify="right")
    for label, dl, tf in table_pairs(table):
        out.add_row(label, *engine_cells(dl, tf))
    return out


def time_split_figure(table: dict[str, Any]) -> bytes:
    """Wall time split into waiting for data and computing, AU on top of each bar."""
    fig, axes = plots.subplots(1, width=max(3.6, 1.1 * len(table["rows"]) + 1.5), height=2.8)
    ax = axes[0][0]
    rows = own_rows(table)
    labels = [r["label"] for r in rows]
    wait = [r["wait_s"] for r in rows]
    compute = [r["compute_s"] for r in rows]
    ax.bar(labels, wait, color="#d62728", label="waiting for data")
    ax.bar(labels, compute, bottom=wait, color="#1f77b4", label="compute")
    for i, row in enumerate(rows):
        ax.annotate(f"AU {100 * row['au']:.0f}%", (i, row["wait_s"] + row["compute_s"]), ha="center", va="bottom")
    ax.set_xlabel(table["varied"])
    ax.set_ylabel("seconds per epoch")
    ax.set_title(table["title"])
    ax.tick_params(axis="x", labelsize=7)
    ax.legend(fontsize=7)
    return plots.png(fig)


def render(section: dict[str, Any]) -> list[Block]:
    plan = section["plan"]
    machine = section["machine"]
    sets = "; ".join(
        f"{key}: {d['samples']:,} samples of {d['sample_bytes']} B ({d['source']})"
        for key, d in section["datasets"].items()
    )
    blocks: list[Block] = [
        Para(
            "Seed 003 measured how reading, shuffling and batching shape training time. The same samples are "
            "written as one file per sample, as TFRecord shards and as one memory-mapped array, then read by "
            "tf.data-like stages (read buffer → CRC-checked records → shuffle buffer → batch → decode) with "
            "optional DataLoader workers and prefetch, and fed to a consumer: the real training step, or a "
            f"simulated compute time per batch ({plan['compute_ms']:g} ms, as DLIO does). Datasets — {sets}. "
            "Wait is the time the consumer blocked on the next batch; AU (accelerator utilisation) is compute ÷ wall. "
            f"Verdicts: input-bound when ≥ {100 * section['thresholds']['input_bound_wait']:.0f}% of the wall time "
            f"waits for data, compute-bound below {100 * section['thresholds']['compute_bound_wait']:.0f}%, "
            "balanced between. Read time and read calls are summed over all readers (workers included). "
            f"Each row is the median wall time of {plan['repeats']} interleaved run(s). Machine: {machine['cpus']} "
            f"CPUs, load average {machine['load_average'][0]:.1f} before the sweep and "
            f"{machine['load_after'][0]:.1f} after (above the CPU count, other work competed for the cores)."
        ),
        Findings(findings(section)),
    ]
    for table in section["tables"]:
        blocks += [
            Para(f"{table['title']}. {table['note']}"),
            Table([table["varied"], *COLUMNS[1:]], [row_cells(r) for r in own_rows(table)]),
            Figure(f"pipeline_{table['key']}", time_split_figure(table), f"{table['title']}: where the wall time went"),
        ]
        if table_pairs(table):
            blocks += [
                Para(
                    f"{table['title']}, the same rows through tf.data (TFRecordDataset(buffer_size), interleave, "
                    "shuffle, batch, parse_example, prefetch) against dlscope's stages: dlscope / tf.data."
                ),
                Table(
                    [table["varied"], *ENGINE_COLUMNS],
                    [[label, *engine_cells(dl, tf)] for label, dl, tf in table_pairs(table)],
                ),
            ]
    return blocks


STEP = LabStep("pipeline", "Input pipeline", run, render)
