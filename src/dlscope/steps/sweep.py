"""Step: batch size × device sweep — throughput, latency, operator shift, overhead and roofline (lab steps 6–7)."""

from __future__ import annotations

from typing import Any

import torch
from rich.table import Table as RichTable

from dlscope.console import console, step_progress
from dlscope.data.loaders import normalise
from dlscope.experiments.sweep import (
    COLD_RATIO_WARN,
    OVERHEAD_BOUND_PCT,
    SweepPoint,
    SweepSettings,
    available_devices,
    rows_csv,
    run_sweep,
    sweep_grid,
)
from dlscope.report import plots
from dlscope.report.blocks import Block, Figure, Findings, Para, Table
from dlscope.steps.base import LabContext, LabStep

# What `dlscope lab` runs (≤ 12 s on a 2-core CPU); `dlscope sweep` passes its own in options.extra["sweep"].
LAB_SWEEP = {
    "batch_sizes": [1, 16, 64],
    "devices": None,  # every available device
    "threads": None,  # torch's current intra-op threads
    "cudnn_benchmark": [False, True],
    "steps": 16,
    "warmup": 3,
    "profile_steps": 2,
    "rounds": 4,
    "gemm_n": 1536,
    "copy_mbytes": 64,
}
TERMINAL_TABLE = {"box": None, "pad_edge": False, "padding": (0, 1), "header_style": "bold underline"}  # 80 columns
SAMPLES = 1024  # training images the sweep slices its batches from (resident on each device)
SERIES_COLOURS = ["#2f5bd3", "#d9480f", "#12805c", "#9c36b5", "#e67700", "#495057"]


def print_rows(rows: list[dict[str, Any]]) -> None:
    """Two narrow tables (speed, then where the time goes) so an 80-column terminal shows them whole.

    ovh µs: framework overhead per operator call (µs outside compute kernels ÷ operator calls).
    """
    speed = RichTable(title="one training step (forward, backward, optimizer)", title_justify="left", **TERMINAL_TABLE)
    for column in ("config", "samples/s", "p50 ms", "p95 ms", "µs/sample", "cold ms", "cold×"):
        speed.add_column(column, justify="left" if column == "config" else "right", no_wrap=True)
    for r in rows:
        cold_style = "warn" if r["cold_ratio"] >= COLD_RATIO_WARN else "dim"
        speed.add_row(
            r["config"],
            f"[metric]{r['samples_per_s']:,.0f}",
            f"{r['step_p50_ms']:.2f}",
            f"{r['step_p95_ms']:.2f}",
            f"{r['per_sample_us']:,.1f}",
            f"{r['cold_step_ms']:.1f}",
            f"[{cold_style}]{r['cold_ratio']:.1f}",
        )
    console.print(speed)
    console.print()
    where = RichTable(title="where the step's time goes", title_justify="left", **TERMINAL_TABLE)
    for column in ("config", "GFLOP/s", "%peak", "FLOP/B", "MiB", "kernel%", "ops", "µs/op", "ovh µs"):
        where.add_column(column, justify="left" if column == "config" else "right", no_wrap=True)
    for r in rows:
        style = "bad" if r["overhead_pct"] >= OVERHEAD_BOUND_PCT else "warn" if r["overhead_pct"] >= 20 else "good"
        where.add_row(
            r["config"],
            f"{r['achieved_gflops']:.1f}",
            f"{r['pct_of_peak']:.1f}",
            f"{r['intensity']:.1f}",
            f"{r['step_memory_bytes'] / 2**20:.1f}" if r["step_memory_bytes"] is not None else "—",
            f"[{style}]{r['kernel_pct']:.0f}",
            f"{r['ops_per_step']:.0f}",
            f"{r['us_per_op']:.1f}",
            f"{r['overhead_us_per_op']:.1f}",
        )
    console.print(where)


def print_shift(section: dict[str, Any], n: int = 12) -> None:
    configs = [r["config"] for r in section["rows"]]
    table = RichTable(title="operator shift: rank by kernel time", title_justify="left", **TERMINAL_TABLE)
    table.add_column("kernel", no_wrap=True)
    for config in configs:
        table.add_column(config.replace("/", "/\n"), justify="right")
    for shift in section["shift"][:n]:
        table.add_row(
            shift["operator"].removeprefix("aten::"),
            *(f"{shift['ranks'][c]}" if shift["ranks"][c] else "[dim]—" for c in configs),
        )
    console.print(table)


def run(ctx: LabContext) -> dict[str, Any]:
    assert ctx.data is not None, "the dataset step runs first"
    options = {**LAB_SWEEP, **ctx.options.extra.get("sweep", {})}
    devices = options["devices"] or available_devices()
    threads = options["threads"] or [torch.get_num_threads()]
    points = sweep_grid(options["batch_sizes"], devices, threads, options["cudnn_benchmark"])
    settings = SweepSettings(
        model=ctx.config.model,
        steps=options["steps"],
        warmup=options["warmup"],
        profile_steps=options["profile_steps"],
        rounds=options["rounds"],
        optimizer=ctx.config.optimizer,
        lr=ctx.config.lr,
        seed=ctx.config.seed,
    )
    n = max(SAMPLES, max(options["batch_sizes"]))
    images, labels = normalise(ctx.data.train_images[:n]), ctx.data.train_labels[:n]
    with step_progress(ctx.options.progress) as progress:
        task = progress.add_task(
            "sweep", total=2 * len(points) + settings.rounds + 2 + any(p.device == "cpu" for p in points)
        )

        def on_phase(point: SweepPoint | None, phase: str) -> None:
            progress.update(task, description=f"{phase} {point.key}" if point else phase)
            progress.advance(task)

        peak_sizes = (options["gemm_n"], options["copy_mbytes"])
        section = run_sweep(points, settings, images, labels, peak_sizes, on_phase)
    print_rows(section["rows"])
    console.print()
    print_shift(section)
    for device, peak in section["peaks"].items():
        console.print(
            f"measured peaks on {device}: [metric]{peak['gemm_gflops']:.1f}[/] GFLOP/s "
            f"(fp32 GEMM {peak['gemm']['size']}³), [metric]{peak['copy_gbps']:.1f}[/] GB/s (copy)"
        )
    marks = {"good": "[good]✔[/]", "info": "•", "warn": "[warn]⚠[/]", "bad": "[bad]✘[/]"}
    for finding in section["findings"]:
        console.print(f"{marks[finding['level']]} {finding['text']}")
    out = ctx.run.sub("sweep")
    (out / "sweep.csv").write_text(rows_csv(section["rows"]))
    section["csv"] = ctx.run.rel(out / "sweep.csv")
    section["grid"] = {
        "batch_sizes": options["batch_sizes"],
        "devices": devices,
        "threads": threads,
        "cudnn_benchmark": options["cudnn_benchmark"],
    }
    console.print(f"table as CSV: [path]{section['csv']}[/]")
    return section


def _series(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    series: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        series.setdefault(row["series"], []).append(row)
    return {name: sorted(group, key=lambda r: r["batch_size"]) for name, group in series.items()}


def throughput_chart(rows: list[dict[str, Any]]) -> bytes:
    fig, axes = plots.subplots(2)
    rate_ax, latency_ax = axes[0]
    for colour, (name, group) in zip(SERIES_COLOURS * 4, _series(rows).items(), strict=False):
        batch = [r["batch_size"] for r in group]
        rate_ax.plot(batch, [r["samples_per_s"] for r in group], "o-", color=colour, label=name)
        latency_ax.plot(batch, [r["step_p50_ms"] for r in group], "o-", color=colour, label=f"{name} p50")
        latency_ax.fill_between(
            batch, [r["step_p50_ms"] for r in group], [r["step_p95_ms"] for r in group], color=colour, alpha=0.15
        )
    rate_ax.set(xscale="log", yscale="log", xlabel="batch size", ylabel="samples/s", title="Training throughput")
    latency_ax.set(xscale="log", yscale="log", xlabel="batch size", ylabel="ms per step", title="Step latency p50–p95")
    rate_ax.legend()
    latency_ax.legend()
    return plots.png(fig)


def shares_chart(rows: list[dict[str, Any]]) -> bytes:
    fig, axes = plots.subplots(1, width=max(4.5, 0.9 * len(rows) + 1.5), height=3.2)
    ax = axes[0][0]
    labels = [r["config"] for r in rows]
    kernel = [r["kernel_pct"] for r in rows]
    overhead = [r["overhead_pct"] for r in rows]
    ax.bar(labels, kernel, color="#2f5bd3", label="compute kernels")
    ax.bar(labels, overhead, bottom=kernel, color="#adb5bd", label="framework overhead")
    for i, r in enumerate(rows):
        ax.text(i, 101, f"{r['step_p50_ms']:.2f} ms", ha="center", va="bottom", fontsize=7)
    ax.set(ylabel="% of step time", ylim=(0, 112), title="Where a training step's time goes")
    ax.tick_params(axis="x", labelrotation=30)
    ax.legend(loc="lower right", fontsize=7)
    return plots.png(fig)


def roofline_chart(section: dict[str, Any]) -> bytes:
    fig, axes = plots.subplots(1, width=6.0, height=4.0)
    ax = axes[0][0]
    rows = section["rows"]
    ridges = [p["gemm_gflops"] / p["copy_gbps"] for p in section["peaks"].values()]
    spots = [r["intensity"] for r in rows if r["intensity"]] + ridges
    lo, hi = min(spots) / 4, max(spots) * 4
    for colour, (device, peak) in zip(SERIES_COLOURS, section["peaks"].items(), strict=False):
        ridge = peak["gemm_gflops"] / peak["copy_gbps"]
        xs = [lo, ridge, hi]
        ax.plot(xs, [min(peak["gemm_gflops"], x * peak["copy_gbps"]) for x in xs], color=colour, lw=1.5)
        ax.annotate(
            f"{device}: {peak['gemm_gflops']:.0f} GFLOP/s, {peak['copy_gbps']:.0f} GB/s",
            (ridge, peak["gemm_gflops"]),
            textcoords="offset points",
            xytext=(4, 4),
            fontsize=7,
            color=colour,
        )
        for r in (r for r in rows if r["device"] == device and r["intensity"]):
            ax.plot(r["intensity"], r["achieved_gflops"], "o", color=colour)
            ax.annotate(
                r["config"].split("/", 1)[1],
                (r["intensity"], r["achieved_gflops"]),
                textcoords="offset points",
                xytext=(4, -10),
                fontsize=7,
            )
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="arithmetic intensity (FLOP per byte moved)",
        ylabel="GFLOP/s",
        title="Roofline: each configuration against the measured peaks",
    )
    return plots.png(fig)


def _fmt_rank(rank: int | None) -> Any:
    return rank if rank is not None else "—"


def render(section: dict[str, Any]) -> list[Block]:
    rows = section["rows"]
    settings = section["settings"]
    has_cuda = any(r["device_type"] == "cuda" for r in rows)
    columns = [
        "config",
        "samples/s",
        "p50 ms",
        "p95 ms",
        "µs/sample",
        "cold ms",
        "cold ×",
        "GFLOP/s",
        "% peak",
        "FLOP/byte",
        "step MiB",
        "kernel %",
        "ops/step",
        "µs/op",
        "overhead µs/op",
    ] + (["H2D pinned µs", "H2D pageable µs"] if has_cuda else [])
    table_rows = [
        [
            r["config"],
            r["samples_per_s"],
            r["step_p50_ms"],
            r["step_p95_ms"],
            r["per_sample_us"],
            r["cold_step_ms"],
            r["cold_ratio"],
            r["achieved_gflops"],
            r["pct_of_peak"],
            r["intensity"],
            r["step_memory_bytes"] / 2**20 if r["step_memory_bytes"] is not None else None,
            r["kernel_pct"],
            r["ops_per_step"],
            r["us_per_op"],
            r["overhead_us_per_op"],
        ]
        + ([r["h2d_pinned_us"], r["h2d_pageable_us"]] if has_cuda else [])
        for r in rows
    ]
    configs = [r["config"] for r in rows]
    shift_rows = [[s["operator"], *(_fmt_rank(s["ranks"][c]) for c in configs), s["change"]] for s in section["shift"]]
    peak_rows = [
        [device, p["gemm_gflops"], f"{p['gemm']['size']}³ fp32", p["copy_gbps"], f"{p['copy']['size'] / 2**20:.0f} MiB"]
        for device, p in section["peaks"].items()
    ]
    thresholds = section["thresholds"]
    blocks: list[Block] = [
        Para(
            f"Each configuration trains a fresh {settings['model']} ({settings['optimizer']}) on MNIST batches "
            "held on its device: the first step is timed on its own (cold), "
            f"{settings['warmup']} warm-up steps are discarded, then {settings['steps']} training steps "
            "(forward, backward, optimizer) are timed one by one — CUDA events on a GPU, perf_counter on "
            f"the CPU — in {settings['rounds']} rounds interleaved across configurations (so a noisy "
            f"neighbour hits them all alike), and {settings['profile_steps']} more are profiled. FLOPs per "
            "step come from FlopCounterMode (2 per multiply-add, matmul and convolution, forward and "
            "backward); bytes per step are what every compute operator reads and writes (the traffic of "
            "an unfused eager step, optimizer included). Kernel time is the self time of operators that "
            "compute (GPU kernel time on CUDA), as a share of the profiled steps; the rest of the step is "
            "framework overhead — Python, dispatch, autograd, allocation. Step memory is the allocation "
            "peak of a step above what stays resident."
        ),
        Findings([(f["level"], f["text"]) for f in section["findings"]]),
        Table(columns, table_rows, "one training step per configuration (p50/p95 over the timed steps)"),
        Figure("sweep_throughput", throughput_chart(rows), "Throughput and step latency against batch size"),
        Figure("sweep_shares", shares_chart(rows), "Share of the step inside compute kernels and outside them"),
        Figure("sweep_roofline", roofline_chart(section), "Each configuration on its device's measured roofline"),
        Table(["device", "GEMM GFLOP/s", "GEMM", "copy GB/s", "copy size"], peak_rows, "peaks measured in this run"),
        Table(
            ["kernel", *configs, "change"],
            shift_rows,
            "operator shift: rank of each compute kernel by time per step (— absent)",
        ),
    ]
    if section.get("conv_directions"):
        blocks.append(
            Table(
                ["layer", "path", "direction", "ms", "GFLOP/s"],
                [[d["layer"], d["path"], d["direction"], d["ms"], d["gflops"]] for d in section["conv_directions"]],
                "each convolution by direction and path, at the largest CPU batch (median, interleaved); "
                "the first needs no input gradient",
            )
        )
    for r in rows:
        steps = r["profiled_steps"]
        blocks.append(
            Table(
                ["operator", "calls/step", "self CPU ms/step", "self %", "self device ms/step", "µs/call"],
                [
                    [
                        t["name"],
                        t["calls"] / steps,
                        t["self_cpu_us"] / steps / 1000,
                        t["self_cpu_pct"],
                        t["self_device_us"] / steps / 1000 if t["self_device_us"] else None,
                        t["us_per_call"],
                    ]
                    for t in r["top10"]
                ],
                f"top 10 operators — {r['config']}",
            )
        )
    blocks.append(
        Para(
            f"Thresholds: overhead-bound from {thresholds['overhead_bound_pct']:.0f}% of the step outside "
            f"kernels (moderate from {thresholds['overhead_moderate_pct']:.0f}%); a cold step worth a warning "
            f"from {thresholds['cold_ratio_warn']:.0f}× a warm one; a kernel named from "
            f"{thresholds['top_kernel_pct']:.0f}% of kernel time; timings called noisy when p95 ≥ "
            f"{thresholds['noisy_p95_ratio']:.0f}× p50; memory-speed kernels pointed out from "
            f"{thresholds['non_gemm_pct']:.0f}% of kernel time. CSV: {section['csv']}."
        )
    )
    return blocks


STEP = LabStep("sweep", "Batch size × device: throughput, overhead, roofline", run, render)
