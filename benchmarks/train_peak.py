"""Training the seed CNN at batch 128 as a share of the GEMM peak measured in the same run, per layout.

The peak (fp32 2048³ matmul, best of a measurement before and after) and the training steps are
taken in one process; the layouts and thread counts are timed interleaved (measure.timing), so a
busy machine slows them alike. Run it once per ISA:

    .venv/bin/python benchmarks/train_peak.py
    ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 .venv/bin/python benchmarks/train_peak.py   # emulated AVX2
"""

from __future__ import annotations

import argparse
import contextlib
import os

import torch

from dlscope.data.loaders import normalise
from dlscope.data.mnist import load_mnist
from dlscope.measure.peaks import measure_gemm_peak
from dlscope.measure.timing import Contender, time_interleaved
from dlscope.models import Layout, build_model
from dlscope.observe.summary import count_flops
from dlscope.train import TrainConfig, make_optimizer, train_step

LAYOUTS = {
    "oneDNN NCHW (default)": Layout(("onednn", "onednn")),
    "conv1 channels-last": Layout(("onednn-cl", "onednn")),
    "conv1 channels-last, pool first": Layout(("onednn-cl", "onednn"), pool_first=True),
    "both channels-last, pool first": Layout(("onednn-cl", "onednn-cl"), pool_first=True),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", default="1,2")
    args = parser.parse_args()
    data = load_mnist()
    b = args.batch_size
    batches = [(normalise(data.train_images[i : i + b]), data.train_labels[i : i + b]) for i in range(0, 8 * b, b)]
    peaks = [measure_gemm_peak("cpu", 2048).value]
    contenders = []
    for threads in (int(t) for t in args.threads.split(",")):
        for name, layout in LAYOUTS.items():
            torch.manual_seed(0)
            model = build_model("cnn")
            model.set_layout(layout)
            optimizer = make_optimizer(TrainConfig(), model)
            state = {"i": 0}

            def step(model=model, optimizer=optimizer, state=state) -> None:
                x, y = batches[state["i"] % len(batches)]
                state["i"] += 1
                train_step(model, optimizer, x, y)

            @contextlib.contextmanager
            def settings(threads=threads):
                torch.set_num_threads(threads)
                yield

            contenders.append(Contender(f"{name}, {threads} thread(s)", step, settings=settings))
    time_interleaved(contenders, args.steps, args.rounds, warmup=2)
    peaks.append(measure_gemm_peak("cpu", 2048).value)
    peak = max(peaks)
    x, y = batches[0]
    flops = count_flops(build_model("cnn"), x, y)["train_step"]
    isa = torch.backends.cpu.get_cpu_capability()
    emulated = " (emulated)" if os.environ.get("ATEN_CPU_CAPABILITY") or os.environ.get("ONEDNN_MAX_CPU_ISA") else ""
    print(f"ISA {isa}{emulated}; GEMM peak {peak:.1f} GFLOP/s (measurements {', '.join(f'{p:.1f}' for p in peaks)})")
    print(f"{'layout':44} {'samples/s':>10} {'GFLOP/s':>8} {'% peak':>7}")
    for c in contenders:
        gflops = flops / c.median_s / 1e9
        print(f"{c.name:44} {b / c.median_s:10,.0f} {gflops:8.1f} {100 * gflops / peak:7.1f}")


if __name__ == "__main__":
    main()
