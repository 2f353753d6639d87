"""Section sweep: batch size × device — throughput, latency, operator shift, overhead, roofline (lab steps 6–7)."""

from __future__ import annotations

from functools import partial
from typing import Any

from dlscope.report.blocks import Block, Figure, Para, Table
from dlscope.report.wording import worded

TITLE = "Batch size × device: throughput, overhead, roofline"


SERIES_COLOURS = ["#2f5bd3", "#d9480f", "#12805c", "#9c36b5", "#e67700", "#495057"]


def _series(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    series: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        series.setdefault(row["series"], []).append(row)
    return {name: sorted(group, key=lambda r: r["batch_size"]) for name, group in series.items()}


def throughput_chart(rows: list[dict[str, Any]]) -> bytes:
    from dlscope.report import plots  # matplotlib: only when a report draws

    fig, (rate_ax, latency_ax) = plots.subplots(2)
    for colour, (name, group) in zip(SERIES_COLOURS * 4, _series(rows).items(), strict=False):
        batch = [r["batch_size"] for r in group]
        rate_ax.plot(batch, [r["samples_per_s"] for r in group], "o-", color=colour, label=name)
        latency_ax.plot(batch, [r["step_p50_ms"] for r in group], "o-", color=colour, label=f"{name} p50")
        latency_ax.fill_between(
            batch, [r["step_p50_ms"] for r in group], [r["step_p95_ms"] for r in group], color=colour, alpha=0.15
        )
    batch_sizes = sorted({r["batch_size"] for r in rows})
    for ax in (rate_ax, latency_ax):
        plots.log_axis(ax, "x", batch_sizes)
        plots.log_axis(ax, "y")
    rate_ax.set(xlabel="batch size", ylabel="samples/s", title="Training throughput")
    latency_ax.set(xlabel="batch size", ylabel="ms per step", title="Step latency p50–p95")
    rate_ax.legend(fontsize=7)
    plots.legend_outside(latency_ax, fontsize=7)
    return plots.png(fig)


def shares_chart(rows: list[dict[str, Any]]) -> bytes:
    from dlscope.report import plots  # matplotlib: only when a report draws

    fig, (ax,) = plots.subplots(1, width=max(4.5, 0.9 * len(rows) + 1.5), height=3.2)
    labels = [r["config"] for r in rows]
    kernel = [r["kernel_pct"] for r in rows]
    overhead = [r["overhead_pct"] for r in rows]
    ax.bar(labels, kernel, color="#2f5bd3", label="compute kernels")
    ax.bar(labels, overhead, bottom=kernel, color="#adb5bd", label="framework overhead")
    for i, r in enumerate(rows):
        ax.text(i, 101, f"{r['step_p50_ms']:.2f} ms", ha="center", va="bottom", fontsize=7)
    ax.set(ylabel="% of step time", ylim=(0, 112), title="Where a training step's time goes")
    ax.tick_params(axis="x", labelrotation=30)
    plots.legend_outside(ax, fontsize=7)
    return plots.png(fig)


def roofline_chart(section: dict[str, Any]) -> bytes:
    from dlscope.report import plots  # matplotlib: only when a report draws

    fig, (ax,) = plots.subplots(1, width=6.0, height=4.0)
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
    plots.log_axis(ax, "x")
    plots.log_axis(ax, "y")
    ax.set(
        xlabel="arithmetic intensity (FLOP per byte moved)",
        ylabel="GFLOP/s",
        title="Roofline: each configuration against the measured peaks",
    )
    return plots.png(fig)


def shift_headers(configs: list[str]) -> list[str]:
    """Configurations as column headers, without the device when all share it (cpu/t2/b64 → t2/b64),
    so six of them fit an 80-column terminal beside the kernel names."""
    devices = {c.split("/", 1)[0] for c in configs}
    return [c.split("/", 1)[1] for c in configs] if len(devices) == 1 and all("/" in c for c in configs) else configs


def shift_legend(configs: list[str]) -> str:
    devices = {c.split("/", 1)[0] for c in configs}
    return f"columns: threads/batch on {devices.pop()}" if len(devices) == 1 else ""


def _fmt_rank(rank: int | None) -> Any:
    return rank if rank is not None else "—"


def _batch_gain(v: dict[str, Any]) -> str:
    gain = v["large.samples_per_s"] / v["small.samples_per_s"]
    return (
        f"On {v['series']}, batch {v['large.batch_size']} trains {gain:.1f}× the samples/s of batch "
        f"{v['small.batch_size']} ({v['large.samples_per_s']:,.0f} against {v['small.samples_per_s']:,.0f}): "
        f"the same ~{v['large.ops_per_step']:.0f} operators per step now carry {v['large.batch_size']} samples, "
        f"and kernels take {v['large.kernel_pct']:.0f}% of the step."
    )


def _memory_speed_kernels(v: dict[str, Any]) -> str:
    text = (
        f"At batch {v['at.batch_size']} on {v['series']}, {v['at.non_gemm_kernel_pct']:.0f}% of kernel time is "
        f"outside convolutions and matrix multiplies, led by {v['at.top_non_gemm_kernel']} "
        f"({v['at.top_non_gemm_kernel_pct']:.0f}%): such kernels do few FLOPs per byte and run at memory "
        f"speed (pointed out from {v['non_gemm_pct_from']:.0f}%)."
    )
    if v["autotune_trims"]:
        text += " Pooling before the ReLU, and channels-last layouts, are what `--autotune` times to trim them."
    return text


def _roofline(v: dict[str, Any]) -> str:
    text = (
        f"The best configuration, {v['best.config']}, reaches {v['best.achieved_gflops']:.1f} GFLOP/s, "
        f"{v['best.pct_of_peak']:.1f}% of the measured GEMM peak ({v['best.peak_gflops']:.0f} GFLOP/s); at "
        f"{v['best.intensity']:.1f} FLOP/byte against a ridge point of {v['best.ridge_intensity']:.1f} it sits "
        f"under the {'memory' if v['memory_bound'] else 'compute'} roof."
    )
    if v["best.pct_of_peak"] > 100:
        text += (
            " Above 100%: the peak measurements were slowed by other work on the machine, so read "
            "the percentages as lower bounds on that run's peak, not the hardware's."
        )
    return text


def _slow_conv(v: dict[str, Any]) -> str:
    text = (
        f"On {v['at.config']}, the {v['at.slow_conv']} runs at {v['at.slow_conv_gflops']:.1f} GFLOP/s on oneDNN "
        f"NCHW ({v['at.slow_conv_ms']:.1f} ms for {v['at.slow_conv_shape']}), against a median of "
        f"{v['at.conv_median_gflops']:.1f} GFLOP/s for the other convolution kernels of the step (named below "
        f"{100 * v['slow_rate_ratio']:.0f}%)."
    )
    if "at.slow_conv_best_path" in v:
        text += (
            f" The {v['at.slow_conv_best_path']} path computes it at {v['at.slow_conv_best_gflops']:.1f} GFLOP/s: "
            "`--autotune` times both and keeps the faster."
        )
    return text


WORDS = {
    "sweep.overhead": lambda v: (
        f"At batch {v['at.batch_size']} on {v['series']}, {v['at.overhead_pct']:.0f}% of a "
        f"{v['at.step_p50_ms']:.2f} ms step is outside compute kernels: ~{v['at.overhead_us_per_op']:.1f} µs × "
        f"{v['at.ops_per_step']:.0f} operators of Python, dispatch, autograd and allocation (overhead-bound from "
        f"{v['overhead_bound_pct']:.0f}%)."
    ),
    "sweep.batch_gain": _batch_gain,
    "sweep.conv_kernel_change": lambda v: (
        f"On {v['series']} the convolution runs {', '.join(v['small.conv_kernels'])} at batch "
        f"{v['small.batch_size']} but {', '.join(v['large.conv_kernels'])} at batch {v['large.batch_size']}: "
        "the backend picks a different kernel for the shape."
    ),
    "sweep.top_kernel": lambda v: (
        f"The largest kernel at batch {v['at.batch_size']} on {v['series']} is {v['at.top_kernel']}: "
        f"{v['at.top_kernel_pct']:.0f}% of kernel time (named from {v['top_kernel_pct_from']:.0f}%)."
    ),
    "sweep.memory_speed_kernels": _memory_speed_kernels,
    "sweep.noisy": lambda v: (
        f"Timings are noisy: the p95 step of {v['at.config']} took {v['at.step_p95_ms']:.2f} ms against "
        f"a p50 of {v['at.step_p50_ms']:.2f} ms (warned from {v['noisy_p95_ratio']:.0f}×) — another job is "
        "competing for the cores; multi-threaded kernels suffer most, as each parallel region waits "
        "for its slowest thread. Compare medians, or rerun on an idle machine."
    ),
    "sweep.cold_step": lambda v: (
        f"The first step of {v['at.config']} took {v['at.cold_ratio']:.0f}× a warm one "
        f"({v['at.cold_step_ms']:.1f} ms against a p50 of {v['at.step_p50_ms']:.2f} ms): lazy "
        "initialisation and kernel selection. It is reported apart and excluded from every other figure."
    ),
    "sweep.gpu_slower": lambda v: (
        f"{v['gpu.config']} is slower than {v['cpu.config']} ({v['gpu.samples_per_s']:,.0f} against "
        f"{v['cpu.samples_per_s']:,.0f} samples/s) because the GPU computes for only "
        f"{v['gpu.kernel_pct']:.0f}% of the step: the rest is ~{v['gpu.overhead_us_per_op']:.1f} µs × "
        f"{v['gpu.ops_per_step']:.0f} operators of launch and dispatch, which a faster device cannot shorten."
    ),
    "sweep.gpu_faster": lambda v: (
        f"{v['gpu.config']} trains {v['gpu.samples_per_s'] / v['cpu.samples_per_s']:.1f}× the samples/s of "
        f"{v['cpu.config']} ({v['gpu.samples_per_s']:,.0f} against {v['cpu.samples_per_s']:,.0f})."
    ),
    "sweep.cudnn_benchmark": lambda v: (
        f"cuDNN autotuning at batch {v['on.batch_size']}: the first step took {v['on.cold_step_ms']:.1f} ms "
        f"with benchmark on against {v['off.cold_step_ms']:.1f} ms with it off (it times every algorithm "
        f"once), for a warm p50 of {v['on.step_p50_ms']:.3f} ms against {v['off.step_p50_ms']:.3f} ms."
    ),
    "sweep.roofline": _roofline,
    "sweep.slow_conv": _slow_conv,
}


def shift_change(ranks: dict[str, int | None]) -> str:
    """What the operator-shift table says of one kernel's ranks across configurations (None: absent)."""
    present = [c for c, rank in ranks.items() if rank is not None]
    absent = [c for c, rank in ranks.items() if rank is None]
    if absent:
        return f"only in {', '.join(present)}" if len(present) <= len(absent) else f"absent in {', '.join(absent)}"
    values = [ranks[c] for c in present]
    return "same rank" if len(set(values)) == 1 else f"rank {min(values)}–{max(values)}"


def render(section: dict[str, Any]) -> list[Block]:
    rows = section["rows"]
    settings = section["settings"]
    has_cuda = any(r["device_type"] == "cuda" for r in rows)
    speed = ("config", "samples_per_s", "step_p50_ms", "step_p95_ms", "per_sample_us", "cold_step_ms", "cold_ratio")
    speed_rows = [[r[k] for k in speed + (("h2d_pinned_us", "h2d_pageable_us") if has_cuda else ())] for r in rows]
    where_rows = [
        [
            r["config"],
            r["achieved_gflops"],
            r["pct_of_peak"],
            r["intensity"],
            r["step_memory_bytes"] / 2**20 if r["step_memory_bytes"] is not None else None,
            r["kernel_pct"],
            round(r["ops_per_step"]),
            r["us_per_op"],
            r["overhead_us_per_op"],
        ]
        for r in rows
    ]
    configs = [r["config"] for r in rows]
    shift_rows = [
        [s["operator"].removeprefix("aten::"), *(_fmt_rank(s["ranks"][c]) for c in configs), shift_change(s["ranks"])]
        for s in section["shift"]
    ]
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
        worded(section["findings"], WORDS),
        Table(
            ["config", "samples/s", "p50 ms", "p95 ms", "µs/sample", "cold ms", "cold ×"]
            + (["H2D pinned µs", "H2D pageable µs"] if has_cuda else []),
            speed_rows,
            "One training step per configuration (p50/p95 over the timed steps)",
            legend="config: device/threads/batch. cold: the first step, timed on its own; cold ×: it over p50.",
            optional=("H2D pageable µs", "H2D pinned µs", "p95 ms"),
        ),
        Table(
            ["config", "GFLOP/s", "% peak", "FLOP/B", "MiB", "kernel %", "ops", "µs/op", "ovh µs"],
            where_rows,
            "Where the step's time goes",
            legend="% peak: of the GEMM peak measured in this run. FLOP/B: FLOPs per byte moved. MiB: step "
            "memory peak. kernel %: share of the step in compute kernels. ops: operator calls per step. "
            "ovh µs: framework overhead per operator call (time outside kernels ÷ calls).",
            optional=("µs/op", "FLOP/B"),
        ),
        Figure("sweep_throughput", partial(throughput_chart, rows), "Throughput and step latency against batch size"),
        Figure(
            "sweep_shares", partial(shares_chart, rows), "Share of the step inside compute kernels and outside them"
        ),
        Figure(
            "sweep_roofline", partial(roofline_chart, section), "Each configuration on its device's measured roofline"
        ),
        Table(["device", "GEMM GFLOP/s", "GEMM", "copy GB/s", "copy size"], peak_rows, "peaks measured in this run"),
        Table(
            ["kernel", *shift_headers(configs), "change"],
            shift_rows,
            "Operator shift: rank of each compute kernel by time per step (— absent)",
            legend=shift_legend(configs),
            optional=("change",),
        ),
    ]
    if section.get("conv_directions"):
        blocks.append(
            Table(
                ["layer", "path", "direction", "ms", "GFLOP/s"],
                [[d["layer"], d["path"], d["direction"], d["ms"], d["gflops"]] for d in section["conv_directions"]],
                "Each convolution by direction and path, at the largest CPU batch",
                legend="median of interleaved calls on the shapes a training step gives each layer; onednn: "
                "torch's default (NCHW), onednn-cl: oneDNN on channels-last tensors, native: aten's im2col + GEMM. "
                "conv1 has no input-gradient row: its input is the images, and autograd asks for none.",
            )
        )
    for r in rows:
        steps = r["profiled_steps"]
        on_gpu = r["device_type"] == "cuda"
        blocks.append(
            Table(
                ["operator", "calls", "self ms", "self %", "µs/call", *(["device ms"] if on_gpu else [])],
                [
                    [
                        t["name"].removeprefix("aten::"),
                        round(t["calls"] / steps),
                        t["self_cpu_us"] / steps / 1000,
                        t["self_cpu_pct"],
                        t["us_per_call"],
                        *([t["self_device_us"] / steps / 1000] if on_gpu else []),
                    ]
                    for t in r["top10"]
                ],
                f"Top 10 operators — {r['config']}, per training step (aten:: omitted)",
            )
        )
    text = (
        f"Thresholds: overhead-bound from {thresholds['overhead_bound_pct']:.0f}% of the step outside "
        f"kernels (moderate from {thresholds['overhead_moderate_pct']:.0f}%); a cold step worth a warning "
        f"from {thresholds['cold_ratio_warn']:.0f}× a warm one; a kernel named from "
        f"{thresholds['top_kernel_pct']:.0f}% of kernel time; timings called noisy when p95 ≥ "
        f"{thresholds['noisy_p95_ratio']:.0f}× p50; memory-speed kernels pointed out from "
        f"{thresholds['non_gemm_pct']:.0f}% of kernel time. CSV: {section['csv']}."
    )
    blocks.append(Para(text))
    return blocks
