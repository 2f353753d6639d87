"""Training the seed CNN as a share of the GEMM peak measured in the same run, and where the rest goes.

1. Training steps of each configuration — layout, optimizer kernel, batch size, threads — and the
   fp32 GEMM peak at each thread count (a 2048³ matmul, its fastest call) timed interleaved
   (measure.timing): a neighbour's burst slows the peak and the steps alike.
3. For the fastest configuration, the FLOP accounting: a profile of its steps split into the GEMM
   work (convolutions forward and backward, the linear layer: the FLOPs FlopCounterMode counts)
   and everything else (pooling, ReLU, loss, optimizer, copies, fills), with each part's rate and
   the share of peak the step would reach if the non-GEMM work took no time.

    .venv/bin/python benchmarks/train_peak.py
    ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 .venv/bin/python benchmarks/train_peak.py   # emulated AVX2
"""

from __future__ import annotations

import argparse
import contextlib
import os
from collections import defaultdict

import torch
from torch.profiler import profile
from torch.utils.flop_counter import FlopCounterMode

from dlscope.data.loaders import normalise
from dlscope.data.mnist import load_mnist
from dlscope.measure.timing import Contender, time_interleaved
from dlscope.models import Layout, build_model
from dlscope.train import TrainConfig, make_optimizer, train_step

GEMM_N = 2048
TUNED = Layout(("onednn-cl", "onednn-cl"), pool_first=True)
CONFIGS = {  # name: (layout, fused optimizer, batch size)
    "oneDNN NCHW (default)": (Layout(("onednn", "onednn")), False, 128),
    "channels-last, pool first": (TUNED, False, 128),
    "channels-last, pool first, fused Adam": (TUNED, True, 128),
    "same, batch 64": (TUNED, True, 64),
    "same, batch 256": (TUNED, True, 256),
}
# aten operators that do the FLOPs FlopCounterMode counts (forward and backward of conv and linear)
GEMM_OPS = {
    "aten::mkldnn_convolution": "conv forward",
    "aten::convolution_backward": "conv backward (weight + input grad)",
    "aten::mm": "linear (mm)",
    "aten::addmm": "linear (mm)",
}
FLOP_OPS = {
    "convolution": "conv forward",
    "convolution_backward": "conv backward (weight + input grad)",
    "mm": "linear (mm)",
    "addmm": "linear (mm)",
}


@contextlib.contextmanager
def threads(n: int):
    torch.set_num_threads(n)
    yield


def make_step(data, layout: Layout, fused: bool, batch: int):
    torch.manual_seed(0)
    model = build_model("cnn")
    model.set_layout(layout)
    optimizer = make_optimizer(TrainConfig(), model)
    for group in optimizer.param_groups:
        group["fused"], group["foreach"] = (True, False) if fused else (None, None)
    batches = [
        (normalise(data.train_images[i : i + batch]), data.train_labels[i : i + batch])
        for i in range(0, 8 * batch, batch)
    ]
    state = {"i": 0}

    def step() -> None:
        x, y = batches[state["i"] % len(batches)]
        state["i"] += 1
        train_step(model, optimizer, x, y)

    return model, optimizer, batches, step


def flops_by_part(model, batches) -> dict[str, float]:
    x, y = batches[0]
    with FlopCounterMode(display=False) as counter:
        torch.nn.functional.cross_entropy(model(x), y).backward()
    model.zero_grad(set_to_none=True)
    parts: dict[str, float] = defaultdict(float)
    for op, flops in counter.get_flop_counts()["Global"].items():
        parts[FLOP_OPS[op.__name__.split(".")[0]]] += flops
    return parts


def accounting(step, model, batches, peak: float, steps: int = 10) -> None:
    """Where a step's time goes: GEMM parts at their rates, the rest by operator."""
    flops = flops_by_part(model, batches)
    for _ in range(3):
        step()
    with profile() as prof:
        for _ in range(steps):
            step()
    ms: dict[str, float] = defaultdict(float)
    for event in prof.key_averages():
        ms[GEMM_OPS.get(event.key, event.key)] += event.self_cpu_time_total / 1e3 / steps
    total = sum(ms.values())
    gemm_ms = sum(ms[p] for p in flops)
    print(f"\nFLOP accounting ({steps} profiled steps; self CPU time per step, {total:.1f} ms in all):")
    print(f"{'part':42} {'ms/step':>8} {'share':>6} {'GFLOP/s':>8} {'% peak':>7}")
    for part in dict.fromkeys(FLOP_OPS.values()):
        rate = flops[part] / ms[part] / 1e6
        print(f"{part:42} {ms[part]:8.2f} {100 * ms[part] / total:5.1f}% {rate:8.1f} {100 * rate / peak:6.1f}%")
    others = sorted(((v, k) for k, v in ms.items() if k not in flops), reverse=True)
    rest = total - gemm_ms
    print(f"{'everything else (no counted FLOPs)':42} {rest:8.2f} {100 * rest / total:5.1f}%")
    for value, name in others[:8]:
        print(f"  {name[:40]:40} {value:8.2f} {100 * value / total:5.1f}%")
    gemm_rate = sum(flops.values()) / gemm_ms / 1e6
    print(
        f"GEMM parts together: {gemm_rate:.1f} GFLOP/s = {100 * gemm_rate / peak:.1f}% of peak — the step's "
        f"ceiling if everything else took no time; everything else caps it at {100 * (1 - rest / total):.1f}% "
        "of the GEMM parts' own rate"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", default="1,2")
    args = parser.parse_args()
    data = load_mnist()
    counts = [int(t) for t in args.threads.split(",")]
    load_before = os.getloadavg()[0]
    a, b = torch.randn(GEMM_N, GEMM_N), torch.randn(GEMM_N, GEMM_N)
    gemms = {
        n: Contender(f"GEMM {GEMM_N}³, {n} thread(s)", lambda: torch.mm(a, b), settings=lambda n=n: threads(n))
        for n in counts
    }
    contenders, made = [], {}
    for n in counts:
        for name, (layout, fused, batch) in CONFIGS.items():
            made[(name, n)] = made_here = make_step(data, layout, fused, batch)
            contender = Contender(f"{name}, {n} thread(s)", made_here[3], settings=lambda n=n: threads(n))
            contenders.append((contender, name, n, batch))
    time_interleaved([*gemms.values(), *(c for c, *_ in contenders)], args.steps, args.rounds, warmup=2)
    # a peak is what the machine can do: the fastest call (measure.peaks' convention)
    peaks = {n: 2 * GEMM_N**3 / min(g.times) / 1e9 for n, g in gemms.items()}
    model = build_model("cnn")
    x, y = normalise(data.train_images[:128]), data.train_labels[:128]
    flops = sum(flops_by_part(model, [(x, y)]).values()) / 128
    isa = torch.backends.cpu.get_cpu_capability()
    emulated = " (emulated)" if os.environ.get("ATEN_CPU_CAPABILITY") or os.environ.get("ONEDNN_MAX_CPU_ISA") else ""
    print(f"ISA {isa}{emulated}; {flops / 1e6:.2f} MFLOP per training sample (conv and linear, forward and backward)")
    print(f"load average {load_before:.2f} before, {os.getloadavg()[0]:.2f} after the timed steps")
    for n in counts:
        median = 2 * GEMM_N**3 / gemms[n].median_s / 1e9
        print(f"GEMM peak, {n} thread(s): {peaks[n]:.1f} GFLOP/s (median call {median:.1f})")
    best_peak = max(peaks.values())
    print(f"\n{'configuration':54} {'smp/s':>6} {'GFLOP/s':>8} {'% peak':>7} {'% best':>7} {'fastest step':>13}")
    for contender, _, n, batch in contenders:
        gflops = flops * batch / contender.median_s / 1e9
        best_step = flops * batch / min(contender.times) / 1e9
        print(
            f"{contender.name:54} {batch / contender.median_s:6,.0f} {gflops:8.1f} "
            f"{100 * gflops / peaks[n]:6.1f}% {100 * gflops / best_peak:6.1f}% {100 * best_step / peaks[n]:12.1f}%"
        )
    print(
        "% peak: median step against the GEMM peak at the same thread count; % best: against the best peak at any "
        "thread count; fastest step: the fastest step against the same-thread peak (the peak's own convention)"
    )
    fastest, name, n, batch = min(contenders, key=lambda c: c[0].median_s / c[3])
    model, _, batches, step = made[(name, n)]
    with threads(n):
        print(f"\nfastest: {fastest.name}")
        accounting(step, model, batches, peaks[n])


if __name__ == "__main__":
    main()
