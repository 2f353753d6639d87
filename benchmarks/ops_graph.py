"""Benchmark for `dlscope ops` and `dlscope graph`: the conv table (time and % of the GEMM peak per
implementation), the loop-order slowdown, and eager against compiled training-step time.

    .venv/bin/python benchmarks/ops_graph.py [--threads 2] [--batch-size 128] [--skip-compile]

Prints Markdown for BENCHMARKS.md. The compile is cold (a fresh Inductor cache).
"""

from __future__ import annotations

import argparse
import time

import torch

from dlscope.experiments.conv import ConvShape, loop_order_experiment, time_conv
from dlscope.instruments.graph import compile_and_compare
from dlscope.measure.peaks import measure_gemm_peak
from dlscope.models import build_model
from dlscope.report.sections.ops import LOOP_ORDER_WORDS, PERF_WORDS, sampled_note


def conv_table(shape: ConvShape, peak: float, repeats: int) -> list[str]:
    lines = [
        f"conv {shape.describe()} — {shape.flops / 1e6:,.1f} MFLOP",
        "",
        "| impl | median time | GFLOP/s | % of GEMM peak | max abs error | note |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for t in time_conv(shape, peak_gflops=peak, repeats=repeats, loops_budget_s=5.0):
        note = sampled_note(t.to_dict())
        lines.append(
            f"| {t.impl} | {t.median_seconds * 1e3:,.3f} ms | {t.gflops:,.3g} | {t.pct_of_peak:.3g}% "
            f"| {t.max_abs_error:.1e} | {note} |"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=11)
    parser.add_argument("--skip-compile", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    peak = measure_gemm_peak()
    print(f"GEMM peak (2048³ fp32, median of {peak.repeats}): {peak.value:.1f} GFLOP/s, {args.threads} threads\n")
    for shape in (
        ConvShape(1, 16, 14, 14, 32, 5, 5, 1, 2),
        ConvShape(args.batch_size, 16, 14, 14, 32, 5, 5, 1, 2),
    ):
        print("\n".join(conv_table(shape, peak.value, args.repeats)) + "\n")
    loops = loop_order_experiment(ConvShape(1, 8, 224, 224, 32, 3, 3, 1, 1), repeats=3)
    print(f"loop order, compiled C, {loops['describe']} (perf: {PERF_WORDS[loops['perf']]})\n")
    print("| order | loops | median | GFLOP/s | × seed |\n|---|---|---:|---:|---:|")
    for o in loops["orders"]:
        print(
            f"| {o['order']} | {LOOP_ORDER_WORDS[o['order']]} | {o['median_seconds'] * 1e3:.1f} ms | {o['gflops']:.2f} "
            f"| {o['slowdown']:.1f}× |"
        )
    if args.skip_compile:
        return
    data = torch.randn(args.batch_size, 1, 28, 28), torch.randint(0, 10, (args.batch_size,))
    start = time.perf_counter()
    result = compile_and_compare(build_model("cnn"), lambda m: torch.optim.Adam(m.parameters()), *data, repeats=30)
    steps = result["step_ms"]
    print(
        f"\ntorch.compile (Inductor, {result['cache']}): compile {result['compile_seconds']:.1f} s "
        f"(whole call {time.perf_counter() - start:.1f} s), {len(result['kernels'])} C++ kernels; "
        f"training step at batch {args.batch_size}, median of {result['repeats']} interleaved: "
        f"eager {steps['eager']:.2f} ms, compiled {steps['compiled']:.2f} ms, speed-up {result['speedup']:.2f}×"
    )


if __name__ == "__main__":
    main()
