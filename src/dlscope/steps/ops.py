"""Step: operators and memory (seed 004, 1.4.2) — one convolution from seven loops to oneDNN,
the loop-order experiment, and the memory anatomy of a training step.

Options come from `ctx.options.extra["ops"]` (see OpsOptions); `dlscope lab` runs the short
defaults, `dlscope ops conv` / `dlscope ops memory` the part asked for at the size asked for.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import torch
from rich.table import Table as RichTable

from dlscope.console import console
from dlscope.experiments.conv import (
    IMPL_DESCRIPTIONS,
    IMPLS,
    ConvShape,
    extrapolate_to_layers,
    loop_order_experiment,
    model_conv_shapes,
    time_conv,
)
from dlscope.experiments.peaks import measure_gemm_peak
from dlscope.models import build_model
from dlscope.observe.memory import memory_anatomy
from dlscope.report import plots
from dlscope.report.blocks import Block, Figure, Findings, Para, Table
from dlscope.steps.base import LabContext, LabStep
from dlscope.train import make_optimizer, resolve_device


@dataclass
class OpsOptions:
    parts: tuple[str, ...] = ("conv", "loop_order", "memory")
    shape: ConvShape = field(default_factory=lambda: ConvShape(1, 16, 14, 14, 32, 5, 5, 1, 2))  # cnn's conv2, 1 image
    impls: tuple[str, ...] = IMPLS
    repeats: int = 5
    loops_budget_s: float = 2.0
    loop_order_shape: ConvShape = field(default_factory=lambda: ConvShape(1, 8, 112, 112, 32, 3, 3, 1, 1))
    memory_batch_sizes: list[int] = field(default_factory=lambda: [16, 64])
    peak_size: int = 1024  # GEMM n for the peak: 1024³ keeps the lab short, `ops conv` uses 2048³


def fmt_seconds(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:,.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds * 1e6:.1f} µs"


def mib(n: float) -> str:
    return f"{n / 2**20:.2f} MiB"


def run_conv(ctx: LabContext, options: OpsOptions, section: dict[str, Any]) -> None:
    device = resolve_device(ctx.config.device)
    with console.status(f"measuring the GEMM peak ({options.peak_size}³ fp32 matmul)…"):
        peak = measure_gemm_peak(device, n=options.peak_size)
    section["peak"] = peak.to_dict()
    shape = options.shape
    with console.status(f"timing {', '.join(options.impls)} on {shape.describe()}…"):
        timings = time_conv(shape, options.impls, peak.value, options.repeats, options.loops_budget_s, device=device)
    table = RichTable(title=f"conv {shape.describe()}: {shape.flops / 1e6:,.1f} MFLOP", title_justify="left")
    for column in ("impl", "median time", "GFLOP/s", "% of peak", "max |err| vs torch", "note"):
        table.add_column(column, justify="left" if column in ("impl", "note") else "right")
    for t in timings:
        style = "good" if t.max_abs_error <= 1e-4 else "bad"
        table.add_row(
            t.impl,
            fmt_seconds(t.median_seconds),
            f"{t.gflops:,.3g}",
            f"{t.pct_of_peak:.3g}%",
            f"[{style}]{t.max_abs_error:.1e}[/]",
            f"[dim]extrapolated from {t.sampled}[/]" if t.sampled else f"[dim]median of {t.repeats}[/]",
        )
    console.print(table)
    console.print(
        f"GEMM peak ({peak.size}³) [metric]{peak.value:.1f}[/] GFLOP/s; im2col buffer {mib(shape.im2col_bytes)} "
        f"({shape.im2col_bytes / (4 * shape.n * shape.c * shape.h * shape.w):.0f}× the input)"
    )
    model = build_model(ctx.config.model)
    layers = extrapolate_to_layers(timings, model_conv_shapes(model, ctx.config.batch_size))
    section["conv"] = {
        "shape": shape.to_dict(),
        "describe": shape.describe(),
        "im2col_bytes": shape.im2col_bytes,
        "input_bytes": 4 * shape.n * shape.c * shape.h * shape.w,
        "timings": [t.to_dict() for t in timings],
        "impl_descriptions": {impl: IMPL_DESCRIPTIONS[impl] for impl in options.impls},
        "model": ctx.config.model,
        "model_batch_size": ctx.config.batch_size,
        "model_layers": layers,
        "device": str(device),
        "threads": torch.get_num_threads(),
        "cpus": os.cpu_count(),
        # timings mean little on a machine others are using: keep how busy it was
        "load_average_1min": os.getloadavg()[0],
    }


def run_loop_order(options: OpsOptions, section: dict[str, Any]) -> None:
    shape = options.loop_order_shape
    with console.status(f"compiling and timing two loop orders on {shape.describe()}…"):
        result = loop_order_experiment(shape)
    table = RichTable(title=f"loop order, compiled C: {shape.describe()}", title_justify="left")
    for column in ("order", "loops (outer → inner)", "median time", "GFLOP/s", "slowdown", "cache-misses"):
        table.add_column(column, justify="left" if column in ("order", "loops (outer → inner)") else "right")
    for o in result["orders"]:
        misses = o["counters"].get("cache-misses")
        table.add_row(
            o["order"],
            o["loops"].split(" — ")[0],
            fmt_seconds(o["median_seconds"]),
            f"{o['gflops']:.2f}",
            f"[{'bad' if o['slowdown'] > 1.5 else 'good'}]{o['slowdown']:.1f}×[/]",
            f"{misses:,}" if misses is not None else "[dim]n/a[/]",
        )
    console.print(table)
    console.print(f"[dim]perf: {result['perf']}[/]")
    section["loop_order"] = result


def run_memory(ctx: LabContext, options: OpsOptions, section: dict[str, Any]) -> None:
    config = ctx.config
    device = resolve_device(config.device)
    with console.status(f"memory anatomy of {config.model} at batch {options.memory_batch_sizes}…"):
        torch.manual_seed(config.seed)
        result = memory_anatomy(
            lambda: build_model(config.model),
            lambda model: make_optimizer(config, model),
            options.memory_batch_sizes,
            device=device,
        )
    table = RichTable(title=f"memory per layer ({config.model}, {config.optimizer})", title_justify="left")
    for column in ("layer", "weights", "grads", "optimizer", "saved act./sample", "output/sample"):
        table.add_column(column, justify="left" if column == "layer" else "right")
    for r in result["layers"]:
        table.add_row(
            r["name"],
            f"{r['weight_bytes']:,}",
            f"{r['grad_bytes']:,}",
            f"{r['optimizer_bytes']:,}",
            f"{r['saved_bytes_per_sample']:,.0f}",
            f"{r['output_bytes_per_sample']:,.0f}",
        )
    console.print(table)
    for c in result["comparisons"]:
        style = "good" if abs(c["error_pct"]) <= 10 else "bad"
        console.print(
            f"batch {c['batch_size']:>4}: model {mib(c['peak_bytes'])} (peak at {c['peak_at']}), "
            f"measured {mib(c['measured_peak_bytes'])} — [{style}]{c['error_pct']:+.1f}%[/]"
        )
    result["model"] = config.model
    result["optimizer"] = config.optimizer
    section["memory"] = result


def run(ctx: LabContext) -> dict[str, Any]:
    options: OpsOptions = ctx.options.extra.get("ops") or OpsOptions()
    if ctx.config.threads:  # without a Trainer nobody else applies --threads
        torch.set_num_threads(ctx.config.threads)
    section: dict[str, Any] = {"parts": list(options.parts)}
    if "conv" in options.parts:
        run_conv(ctx, options, section)
    if "loop_order" in options.parts:
        run_loop_order(options, section)
    if "memory" in options.parts:
        run_memory(ctx, options, section)
    return section


# --- report --------------------------------------------------------------------------------------


def conv_chart(conv: dict, peak: dict) -> bytes:
    fig, axes = plots.subplots(1, width=6.0, height=2.8)
    ax = axes[0][0]
    timings = conv["timings"]
    ax.barh([t["impl"] for t in timings][::-1], [t["gflops"] for t in timings][::-1], color="#2f5bd3")
    ax.axvline(peak["value"], color="#c0392b", linestyle="--", label=f"GEMM peak {peak['value']:.0f} GFLOP/s")
    ax.set_xscale("log")
    ax.set(xlabel="GFLOP/s (log scale)", title=f"conv {conv['describe']}")
    ax.legend(loc="lower right", fontsize=8)
    return plots.png(fig)


def memory_chart(memory: dict) -> bytes:
    fig, axes = plots.subplots(1, width=5.5, height=3.0)
    ax = axes[0][0]
    comparisons = memory["comparisons"]
    batches = [c["batch_size"] for c in comparisons]
    static = [(c["static_bytes"] + c["batch_bytes"]) / 2**20 for c in comparisons]
    activations = [c["activation_bytes"] / 2**20 for c in comparisons]
    labels = [str(b) for b in batches]
    ax.bar(labels, static, color="#9aa5b1", label="weights + grads + optimizer + batch")
    ax.bar(labels, activations, bottom=static, color="#f0a04b", label="activations saved for backward")
    ax.plot(labels, [c["peak_bytes"] / 2**20 for c in comparisons], "k_", markersize=28, label="modelled peak")
    ax.plot(labels, [c["measured_peak_bytes"] / 2**20 for c in comparisons], "o", color="#c0392b", label="measured")
    ax.set(xlabel="batch size", ylabel="MiB", title=f"{memory['model']}: training-step memory")
    ax.legend(fontsize=7)
    return plots.png(fig)


def render_conv(section: dict[str, Any]) -> list[Block]:
    conv, peak = section["conv"], section["peak"]
    timings = conv["timings"]
    by_impl = {t["impl"]: t for t in timings}
    rows = [
        [
            t["impl"],
            conv["impl_descriptions"][t["impl"]],
            t["median_seconds"] * 1e3,
            t["gflops"],
            t["pct_of_peak"],
            t["max_abs_error"],
            f"extrapolated from {t['sampled']}" if t["sampled"] else f"median of {t['repeats']}",
        ]
        for t in timings
    ]
    items = []
    if "loops" in by_impl and "torch" in by_impl:
        items.append(
            (
                "info",
                f"torch's conv2d is {by_impl['loops']['median_seconds'] / by_impl['torch']['median_seconds']:,.0f}× "
                "faster than the seed's seven Python loops on the same arithmetic.",
            )
        )
    if "im2col" in by_impl:
        items.append(
            (
                "info",
                f"im2col copies the input into a {conv['im2col_bytes'] / 2**10:,.0f} KiB patch matrix — "
                f"{conv['im2col_bytes'] / conv['input_bytes']:.0f}× the input — so that one GEMM does the work "
                f"({by_impl['im2col']['pct_of_peak']:.2g}% of the GEMM peak, torch's conv2d "
                f"{by_impl['torch']['pct_of_peak']:.2g}%)."
                if "torch" in by_impl
                else f"({by_impl['im2col']['pct_of_peak']:.2g}% of the GEMM peak).",
            )
        )
    if "torch" in by_impl and "numpy" in by_impl and by_impl["torch"]["gflops"] < by_impl["numpy"]["gflops"]:
        items.append(
            (
                "warn",
                f"torch's conv2d ran slower than NumPy: with {conv['threads']} intra-op threads on "
                f"{conv['cpus']} CPUs at load average {conv['load_average_1min']:.1f}, its OpenMP threads wait "
                "for each other whenever one is descheduled. Rerun with --threads 1 (or on an idle machine).",
            )
        )
    over = [t["impl"] for t in timings if (t["pct_of_peak"] or 0) > 100]
    if over:
        items.append(
            (
                "warn",
                f"{', '.join(over)} beat the GEMM 'peak': the peak's long matmuls were slowed by other load on "
                "the machine, so every % of peak here is overstated.",
            )
        )
    worst = max(t["max_abs_error"] for t in timings)
    items.append(("good" if worst <= 1e-4 else "bad", f"Largest difference from torch: {worst:.1e}."))
    layer_rows = [
        [layer["layer"], layer["shape"], layer["flops"] / 1e6, *(layer["seconds"].get(i, 0) * 1e3 for i in by_impl)]
        for layer in conv["model_layers"]
    ]
    return [
        Para(
            f"One convolution, {conv['describe']} ({conv['shape']['flops'] / 1e6:,.1f} MFLOP, FLOPs = 2 × "
            f"multiply-adds as FlopCounterMode counts them), four ways, each checked against torch's conv2d "
            f"and set against the measured fp32 GEMM peak of {peak['value']:.1f} GFLOP/s "
            f"({peak['size']}³ matmul, median of {peak['repeats']}); {conv['threads']} intra-op threads, "
            f"load average {conv['load_average_1min']:.1f} on {conv['cpus']} CPUs while measuring."
        ),
        Findings(items),
        Table(
            ["impl", "what", "median ms", "GFLOP/s", "% of peak", "max |err|", "timing"],
            rows,
            "the convolution four ways",
        ),
        Figure("ops_conv_gflops", conv_chart(conv, peak), "Throughput per implementation against the GEMM peak"),
        Table(
            ["layer", "shape", "MFLOP", *(f"{i} ms" for i in by_impl)],
            layer_rows,
            f"extrapolated to {conv['model']}'s convolutions at batch {conv['model_batch_size']} "
            "(forward FLOPs ÷ each implementation's measured GFLOP/s)",
        ),
    ]


def render_loop_order(result: dict[str, Any]) -> list[Block]:
    rows = [
        [
            o["order"],
            o["loops"],
            o["median_seconds"] * 1e3,
            o["gflops"],
            o["slowdown"],
            o["max_abs_error"],
            o["counters"].get("cache-misses"),
            o["counters"].get("L1-dcache-load-misses"),
        ]
        for o in result["orders"]
    ]
    slow = result["orders"][-1]
    return [
        Para(
            f"Locality: the same seven-loop convolution compiled from C (gcc -O2), {result['describe']}, in two "
            f"loop orders — identical multiply-adds, only the nesting differs. Working set "
            f"{result['working_set_bytes'] / 2**20:.1f} MiB. Median of {result['repeats']} runs. "
            f"Hardware counters: {result['perf']}."
        ),
        Findings(
            [
                (
                    "warn" if slow["slowdown"] > 1.5 else "info",
                    f"The {slow['order']} order is {slow['slowdown']:.1f}× slower: its innermost loop jumps a "
                    "whole output plane per step, so each multiply-add touches a different cache line.",
                )
            ]
        ),
        Table(
            ["order", "loops (outer → inner)", "ms", "GFLOP/s", "× seed", "max |err|", "cache misses", "L1 misses"],
            rows,
            "perf counters cover the whole process (input set-up and every repeat)",
        ),
    ]


def whole(value: float) -> float | int:
    """Bytes per sample are usually whole numbers; show them without decimals when they are."""
    return int(value) if float(value).is_integer() else value


def render_memory(memory: dict[str, Any]) -> list[Block]:
    rows = [
        [
            r["name"],
            r["kind"],
            r["weight_bytes"],
            r["grad_bytes"],
            r["optimizer_bytes"],
            whole(r["saved_bytes_per_sample"]),
            whole(r["output_bytes_per_sample"]),
        ]
        for r in memory["layers"]
    ]
    total = [
        "total",
        "",
        *(sum(r[k] for r in memory["layers"]) for k in ("weight_bytes", "grad_bytes", "optimizer_bytes")),
        whole(sum(r["saved_bytes_per_sample"] for r in memory["layers"])),
        None,
    ]
    comparisons = [
        [
            c["batch_size"],
            c["static_bytes"] / 2**20,
            c["activation_bytes"] / 2**20,
            c["peak_bytes"] / 2**20,
            c["peak_at"],
            c["measured_peak_bytes"] / 2**20,
            c["error_pct"],
        ]
        for c in memory["comparisons"]
    ]
    worst = max(abs(c["error_pct"]) for c in memory["comparisons"])
    return [
        Para(
            f"Memory anatomy of a training step of {memory['model']} with {memory['optimizer']}: per layer the "
            "weights, their gradients, the optimizer's state, and the activations autograd saves for backward "
            "(counted with saved_tensors_hooks, each storage once, per sample — they grow with the batch; the "
            "rest does not). The modelled peak is the static part plus the worst moment of backward or of the "
            f"optimizer step (whose temporaries take {memory['optimizer_workspace_bytes'] / 2**20:.2f} MiB); the "
            f"measured peak comes from {memory['method']} from model creation through two training steps on "
            f"{memory['device']}."
        ),
        Findings(
            [
                (
                    "good" if worst <= 10 else "bad",
                    f"The model is within {worst:.1f}% of the measured peak at every batch size measured.",
                )
            ]
        ),
        Table(
            ["layer", "type", "weights B", "grads B", "optimizer B", "saved B/sample", "output B/sample"],
            [*rows, total],
            "bytes per layer",
        ),
        Table(
            ["batch", "static MiB", "activations MiB", "modelled peak MiB", "peak at", "measured MiB", "error %"],
            comparisons,
            "modelled against measured peak",
        ),
        Figure("ops_memory", memory_chart(memory), "Training-step memory against batch size"),
    ]


def render(section: dict[str, Any]) -> list[Block]:
    blocks: list[Block] = []
    if "conv" in section:
        blocks += render_conv(section)
    if "loop_order" in section:
        blocks += render_loop_order(section["loop_order"])
    if "memory" in section:
        blocks += render_memory(section["memory"])
    return blocks


STEP = LabStep("ops", "Operators and memory: a convolution from seven loops to oneDNN", run, render)
