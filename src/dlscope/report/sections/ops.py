"""Section ops: operators and memory (seed 004, 1.4.2) — one convolution from seven loops to oneDNN,"""

from __future__ import annotations

from functools import partial
from typing import Any

from dlscope.report.blocks import Block, Figure, Findings, Para, Table

TITLE = "Operators and memory: a convolution from seven loops to oneDNN"


def conv_chart(conv: dict, peak: dict) -> bytes:
    from dlscope.report import plots  # matplotlib: only when a report draws

    fig, (ax,) = plots.subplots(1, width=6.0, height=2.8)
    timings = conv["timings"]
    ax.barh([t["impl"] for t in timings][::-1], [t["gflops"] for t in timings][::-1], color="#2f5bd3")
    ax.axvline(peak["value"], color="#c0392b", linestyle="--", label=f"GEMM peak {peak['value']:.0f} GFLOP/s")
    plots.log_axis(ax, "x")
    ax.set(xlabel="GFLOP/s (log scale)", title=f"conv {conv['describe']}")
    plots.legend_outside(ax, fontsize=8)
    return plots.png(fig)


def memory_chart(memory: dict) -> bytes:
    from dlscope.report import plots  # matplotlib: only when a report draws

    fig, (ax,) = plots.subplots(1, width=5.5, height=3.0)
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
    plots.legend_outside(ax, fontsize=7)
    return plots.png(fig)


IMPL_DESCRIPTIONS = {
    "loops": "the seed's seven nested loops, pure Python",
    "numpy": "NumPy: the two filter loops in Python, the other five vectorised (einsum per tap)",
    "im2col": "im2col (unfold into a patch matrix) + one GEMM (torch.mm)",
    "torch": "torch.nn.functional.conv2d (oneDNN on CPU, cuDNN on GPU)",
}
LOOP_ORDER_WORDS = {
    "seed": "n, k, c, oh, ow, r, s — innermost loops walk an input row (unit stride)",
    "strided": "n, c, r, s, ow, oh, k — innermost loop jumps a whole output plane",
}
PERF_WORDS = {"counted": "counted", "unsupported": "perf present, hardware counters not supported", "absent": "no perf"}


def sampled_note(timing: dict[str, Any]) -> str:
    """How a timing was taken: the median of its repeats, or extrapolated from part of the shape."""
    s = timing["sampled"]
    if not s:
        return f"median of {timing['repeats']}"
    return f"extrapolated from {s['images']} of {s['of_images']} images × {s['filters']} of {s['of_filters']} filters"


def render_conv(section: dict[str, Any]) -> list[Block]:
    conv, peak = section["conv"], section["peak"]
    timings = conv["timings"]
    by_impl = {t["impl"]: t for t in timings}
    rows = [
        [
            t["impl"],
            IMPL_DESCRIPTIONS[t["impl"]],
            t["median_seconds"] * 1e3,
            t["gflops"],
            t["pct_of_peak"],
            t["max_abs_error"],
            sampled_note(t),
        ]
        for t in timings
    ]
    items = []
    if "loops" in by_impl and "torch" in by_impl:
        ratio = by_impl["loops"]["median_seconds"] / by_impl["torch"]["median_seconds"]
        text = f"torch's conv2d is {ratio:,.0f}× faster than the seed's seven Python loops on the same arithmetic."
        items.append(("info", text))
    if "im2col" in by_impl:
        text = (
            f"im2col copies the input into a {conv['im2col_bytes'] / 2**10:,.0f} KiB patch matrix — "
            f"{conv['im2col_bytes'] / conv['input_bytes']:.0f}× the input — so that one GEMM does the work "
            f"({by_impl['im2col']['pct_of_peak']:.2g}% of the GEMM peak, torch's conv2d "
            f"{by_impl['torch']['pct_of_peak']:.2g}%)."
            if "torch" in by_impl
            else f"({by_impl['im2col']['pct_of_peak']:.2g}% of the GEMM peak)."
        )
        items.append(("info", text))
    if "torch" in by_impl and "numpy" in by_impl and by_impl["torch"]["gflops"] < by_impl["numpy"]["gflops"]:
        text = (
            f"torch's conv2d ran slower than NumPy: with {conv['threads']} intra-op threads on "
            f"{conv['cpus']} CPUs at load average {conv['load_average_1min']:.1f}, its OpenMP threads wait "
            "for each other whenever one is descheduled. Rerun with --threads 1 (or on an idle machine)."
        )
        items.append(("warn", text))
    over = [t["impl"] for t in timings if (t["pct_of_peak"] or 0) > 100]
    if over:
        text = (
            f"{', '.join(over)} beat the GEMM 'peak': the peak's long matmuls were slowed by other load on "
            "the machine, so every % of peak here is overstated."
        )
        items.append(("warn", text))
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
            ["impl", "what", "median ms", "GFLOP/s", "% peak", "max err", "timing"],
            rows,
            "The convolution four ways",
            legend="% peak: of the GEMM peak measured in this run; max err: largest absolute difference from torch.",
            optional=("what", "timing"),
        ),
        Figure(
            "ops_conv_gflops", partial(conv_chart, conv, peak), "Throughput per implementation against the GEMM peak"
        ),
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
            LOOP_ORDER_WORDS[o["order"]],
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
    slower = (
        f"The {slow['order']} order is {slow['slowdown']:.1f}× slower: its innermost loop jumps a whole output "
        "plane per step, so each multiply-add touches a different cache line."
    )
    return [
        Para(
            f"Locality: the same seven-loop convolution compiled from C (gcc -O2), {result['describe']}, in two "
            f"loop orders — identical multiply-adds, only the nesting differs. Working set "
            f"{result['working_set_bytes'] / 2**20:.1f} MiB. Median of {result['repeats']} runs. "
            f"Hardware counters: {PERF_WORDS[result['perf']]}."
        ),
        Findings([("warn" if slow["slowdown"] > 1.5 else "info", slower)]),
        Table(
            ["order", "loops (outer → inner)", "ms", "GFLOP/s", "× seed", "max err", "cache misses", "L1 misses"],
            rows,
            "perf counters cover the whole process (input set-up and every repeat)",
            optional=("L1 misses", "cache misses", "max err"),
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
    within = f"The model is within {worst:.1f}% of the measured peak at every batch size measured."
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
        Findings([("good" if worst <= 10 else "bad", within)]),
        Table(
            ["layer", "type", "weights", "grads", "optim", "saved/smp", "out/smp"],
            [*rows, total],
            "Bytes per layer",
            legend="optim: optimizer state; saved/smp: activations autograd keeps for backward, per sample; "
            "out/smp: the layer's output per sample.",
            optional=("type",),
        ),
        Table(
            ["batch", "static", "acts", "model", "peak at", "measured", "error %"],
            comparisons,
            "Modelled against measured peak (MiB)",
            legend="static: weights, gradients, optimizer state and the batch; acts: saved activations; "
            "model: the modelled peak, reached at 'peak at'.",
        ),
        Figure("ops_memory", partial(memory_chart, memory), "Training-step memory against batch size"),
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
