"""Would an im2col + GEMM convolution beat oneDNN's on this CPU? Each seed-CNN convolution, per direction.

An im2col convolution copies every receptive field into a column matrix (F.unfold), then runs
one batched GEMM; its input gradient is a GEMM then a col2im (F.fold), its weight gradient a GEMM
against the saved columns. Timed interleaved (measure.timing) against oneDNN's channels-last
kernels on the shapes a batch-128 training step gives (1 thread unless --threads):

    .venv/bin/python benchmarks/im2col_gemm.py
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.nn.functional as F

from dlscope.data.loaders import normalise
from dlscope.data.mnist import load_mnist
from dlscope.experiments.conv_directions import conv_inputs, direction_call
from dlscope.measure.timing import Contender, time_interleaved
from dlscope.models import build_model


def im2col_calls(conv: torch.nn.Conv2d, x: torch.Tensor) -> dict[str, object]:
    """The im2col convolution's pieces on input `x`: column copy, the three GEMMs, col2im."""
    k, pad = conv.kernel_size, conv.padding
    n, _, h, w = x.shape
    weight = conv.weight.detach().flatten(1)  # (K, C·R·S)
    cols = F.unfold(x, k, padding=pad)  # (N, C·R·S, H·W)
    grad_out = torch.randn(n, weight.shape[0], h * w)
    return {
        "im2col (unfold)": lambda: F.unfold(x, k, padding=pad),
        "forward GEMM": lambda: weight @ cols,
        # one GEMM over the whole batch: (K, N·H·W) @ (N·H·W, C·R·S), its operands' copies included
        "weight-grad GEMM": lambda: grad_out.transpose(0, 1).flatten(1) @ cols.transpose(0, 1).flatten(1).t(),
        "input-grad GEMM": lambda: weight.t() @ grad_out,
        "col2im (fold)": lambda: F.fold(cols, (h, w), k, padding=pad),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=6)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    x = normalise(load_mnist().train_images[:128])
    contenders, rows = [], []
    for index, (name, conv, conv_x) in enumerate(conv_inputs(build_model("cnn"), x)):
        flops = 2 * conv_x.shape[0] * conv.weight.numel() * conv_x.shape[2] * conv_x.shape[3]  # stride 1, "same"
        for direction in ("forward", "weight grad", "input grad")[: 3 if index else 2]:
            call = direction_call(conv, conv_x, direction, "onednn-cl")
            contenders.append(Contender(f"{name} oneDNN channels-last {direction}", call))
            rows.append((name, f"oneDNN channels-last: {direction}", flops))
        for piece, call in im2col_calls(conv, conv_x).items():
            if index == 0 and piece in ("input-grad GEMM", "col2im (fold)"):
                continue  # the images need no gradient
            contenders.append(Contender(f"{name} im2col {piece}", call))
            rows.append((name, f"im2col: {piece}", flops if "GEMM" in piece else 0))
    load = os.getloadavg()[0]
    time_interleaved(contenders, args.repeats, args.repeats, warmup=1)
    print(f"{args.threads} thread(s), batch 128, load average {load:.1f} → {os.getloadavg()[0]:.1f}")
    print(f"{'layer':8} {'kernel':40} {'ms':>8} {'GFLOP/s':>8}")
    for (layer, what, flops), contender in zip(rows, contenders, strict=True):
        rate = f"{flops / contender.median_s / 1e9:8.1f}" if flops else f"{'—':>8}"
        print(f"{layer:8} {what:40} {contender.median_s * 1e3:8.2f} {rate}")


if __name__ == "__main__":
    main()
