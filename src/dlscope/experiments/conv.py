"""One convolution, four ways: the seed's seven Python loops, NumPy, im2col + GEMM, and torch.

Seed 004 (1.4.2) writes a convolution as seven nested loops and says libraries turn it into a
matrix multiplication (im2col + GEMM). Each implementation here is checked against torch's
`conv2d` (max absolute error), timed (warm-up, repeats, median) and set against the measured
GEMM peak. A compiled C copy of the seven loops (conv_orders.c) runs in two loop orders to
show locality, under `perf stat` where the machine exposes cache counters.

Example: the cnn's conv2 at batch 128 (benchmarks/ops_graph.py --threads 1, 2-core EPYC shared
with other jobs, load average ~5; GEMM peak measured in the same run at 50.0 GFLOP/s, low because
of that load — hence torch above 100%):

    impl    median time  GFLOP/s  % of peak  max |err|  note
    loops   68,013 ms    0.00944  0.0189%    2.4e-06    extrapolated from 1 of 128 images × 32 of 32 filters
    numpy      785 ms    0.818    1.64%      4.5e-06    median of 11
    im2col     123 ms    5.23     10.5%      6.2e-06    median of 11
    torch     7.18 ms    89.4     179%       0          median of 11
"""

from __future__ import annotations

import math
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from dlscope.errors import ConfigError
from dlscope.measure.timing import StepTimer
from dlscope.options import IMPLS, ConvShape

LOOP_ORDERS = ("seed", "strided")  # conv_orders.c's two nestings (report.sections.ops says which)


def conv_loops(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, stride: int, padding: int) -> torch.Tensor:
    """The seed's seven nested loops, on Python floats: one multiply-add per innermost iteration."""
    n_images, channels = x.shape[:2]
    filters, _, fh, fw = weight.shape
    xs = F.pad(x, (padding,) * 4).tolist()
    ws, bs = weight.tolist(), bias.tolist()
    out_h = (len(xs[0][0]) - fh) // stride + 1
    out_w = (len(xs[0][0][0]) - fw) // stride + 1
    out = [[[[bs[k]] * out_w for _ in range(out_h)] for k in range(filters)] for _ in range(n_images)]
    for n in range(n_images):
        for k in range(filters):
            for c in range(channels):
                for oh in range(out_h):
                    for ow in range(out_w):
                        for r in range(fh):
                            for s in range(fw):
                                out[n][k][oh][ow] += xs[n][c][oh * stride + r][ow * stride + s] * ws[k][c][r][s]
    return torch.tensor(out, dtype=x.dtype)


def conv_numpy(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, stride: int, padding: int) -> torch.Tensor:
    """Loop over the R×S filter taps; each tap is one (N·OH·OW × C) by (C × K) contraction."""
    xp = np.pad(x.numpy(), ((0, 0), (0, 0), (padding, padding), (padding, padding)))
    w = weight.numpy()
    _, _, fh, fw = w.shape
    out_h = (xp.shape[2] - fh) // stride + 1
    out_w = (xp.shape[3] - fw) // stride + 1
    out = np.zeros((xp.shape[0], w.shape[0], out_h, out_w), dtype=xp.dtype)
    for r in range(fh):
        for s in range(fw):
            window = xp[:, :, r : r + stride * out_h : stride, s : s + stride * out_w : stride]
            out += np.einsum("nchw,kc->nkhw", window, w[:, :, r, s], optimize=True)
    out += bias.numpy()[None, :, None, None]
    return torch.from_numpy(out)


def im2col(x: torch.Tensor, fh: int, fw: int, stride: int, padding: int) -> torch.Tensor:
    """Patch matrix: one row per output position (N·OH·OW), one column per (c, r, s) — a copy."""
    patches = F.pad(x, (padding,) * 4).unfold(2, fh, stride).unfold(3, fw, stride)  # N, C, OH, OW, R, S (a view)
    n, c, out_h, out_w = patches.shape[:4]
    return patches.permute(0, 2, 3, 1, 4, 5).reshape(n * out_h * out_w, c * fh * fw)


def conv_im2col(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, stride: int, padding: int) -> torch.Tensor:
    filters, _, fh, fw = weight.shape
    n = x.shape[0]
    cols = im2col(x, fh, fw, stride, padding)
    out = torch.addmm(bias, cols, weight.reshape(filters, -1).t())  # (N·OH·OW) × K
    out_h = (x.shape[2] + 2 * padding - fh) // stride + 1
    return out.reshape(n, out_h, -1, filters).permute(0, 3, 1, 2)


def conv_torch(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, stride: int, padding: int) -> torch.Tensor:
    return F.conv2d(x, weight, bias, stride=stride, padding=padding)


CONV_IMPLS: dict[str, Callable[..., torch.Tensor]] = {
    "loops": conv_loops,
    "numpy": conv_numpy,
    "im2col": conv_im2col,
    "torch": conv_torch,
}


@dataclass
class ConvTiming:
    impl: str
    median_seconds: float  # for the whole shape (extrapolated when sampled)
    repeats: int
    max_abs_error: float
    gflops: float
    pct_of_peak: float | None
    sampled: dict[str, int] | None = None  # what part of the shape actually ran (images, filters), when not all


def random_conv(shape: ConvShape, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape.n, shape.c, shape.h, shape.w, generator=g)
    weight = torch.randn(shape.k, shape.c, shape.r, shape.s, generator=g) / math.sqrt(shape.c * shape.r * shape.s)
    bias = torch.randn(shape.k, generator=g)
    return x, weight, bias


def python_seconds_per_mac(repeats: int = 3) -> float:
    """Calibrate the pure-Python loops on a tiny convolution (~20k multiply-adds)."""
    tiny = ConvShape(1, 4, 12, 12, 4, 5, 5)
    x, w, b = random_conv(tiny)
    return (
        statistics.median(StepTimer(torch.device("cpu")).time_steps(lambda: conv_loops(x, w, b, 1, 0), repeats))
        / tiny.macs
    )


def time_loops(
    shape: ConvShape, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, reference: torch.Tensor, budget_s: float
) -> ConvTiming:
    """Run the Python loops on the whole shape if it fits the budget, else on the first image and
    as many filters as fit, and extrapolate (the work per filter and per image is identical)."""
    estimate = python_seconds_per_mac() * shape.macs
    one_filter = estimate / (shape.n * shape.k)
    if one_filter > budget_s * 10:
        raise ConfigError(
            f"the pure-Python loops would take ~{estimate:,.0f} s on {shape.describe()} "
            f"(~{one_filter:,.0f} s even for one filter of one image); choose a smaller --shape or leave out loops"
        )
    n, k = shape.n, shape.k
    if estimate > budget_s:
        n, k = 1, max(1, min(shape.k, int(budget_s / one_filter)))
    start = time.perf_counter()
    out = conv_loops(x[:n], w[:k], b[:k], shape.stride, shape.padding)
    seconds = (time.perf_counter() - start) * (shape.n * shape.k) / (n * k)
    error = float((out - reference[:n, :k]).abs().max())
    sampled = (
        None
        if (n, k) == (shape.n, shape.k)
        else {"images": n, "of_images": shape.n, "filters": k, "of_filters": shape.k}
    )
    return ConvTiming("loops", seconds, 1, error, shape.flops / seconds / 1e9, None, sampled)


def time_conv(
    shape: ConvShape,
    impls: tuple[str, ...] = IMPLS,
    peak_gflops: float | None = None,
    repeats: int = 5,
    loops_budget_s: float = 5.0,
    seed: int = 0,
    device: str | torch.device = "cpu",
) -> list[ConvTiming]:
    """Each implementation on random data of `shape`: median time, error against torch on the CPU,
    GFLOP/s. im2col and torch run on `device` (cuDNN and cuBLAS on a GPU, synchronised around each
    call); the Python loops and NumPy always run on the CPU.

    The fast implementations' repeats are interleaved (one of each per round), so a burst of load
    from elsewhere on the machine hits all of them alike rather than one."""
    device = torch.device(device)
    x, w, b = random_conv(shape, seed)
    reference = conv_torch(x, w, b, shape.stride, shape.padding)
    on_device = tuple(t.to(device) for t in (x, w, b))
    fast = [impl for impl in impls if impl != "loops"]

    def call(impl: str) -> torch.Tensor:
        args = on_device if impl in ("im2col", "torch") else (x, w, b)
        return CONV_IMPLS[impl](*args, shape.stride, shape.padding)

    errors = {impl: float((call(impl).cpu() - reference).abs().max()) for impl in fast}  # also the warm-up
    times: dict[str, list[float]] = {impl: [] for impl in fast}
    timer = StepTimer(device)  # CUDA events around each call on a GPU
    for _ in range(repeats):
        for impl in fast:
            times[impl] += timer.time_steps(lambda impl=impl: call(impl), 1)
    timings = []
    for impl in impls:
        if impl == "loops":
            timing = time_loops(shape, x, w, b, reference, loops_budget_s)
        else:
            seconds = statistics.median(times[impl])
            timing = ConvTiming(impl, seconds, repeats, errors[impl], shape.flops / seconds / 1e9, None)
        if peak_gflops:
            timing.pct_of_peak = 100 * timing.gflops / peak_gflops
        timings.append(timing)
    return timings


def model_conv_shapes(model: nn.Module, batch_size: int, image: tuple[int, int, int] = (1, 28, 28)) -> dict:
    """The model's convolutions as ConvShapes at `batch_size` (input shapes seen by forward hooks)."""
    shapes: dict[str, ConvShape] = {}

    def record(name: str, conv: nn.Conv2d):
        def hook(_module, inputs, _output):
            n, c, h, w = inputs[0].shape
            if conv.stride[0] != conv.stride[1] or not isinstance(conv.padding, tuple):
                raise ConfigError(f"{name}: only square strides and numeric padding are modelled")
            shapes[name] = ConvShape(n, c, h, w, conv.out_channels, *conv.kernel_size, conv.stride[0], conv.padding[0])

        return hook

    convs = [(name, m) for name, m in model.named_modules() if isinstance(m, nn.Conv2d)]
    hooks = [m.register_forward_hook(record(name, m)) for name, m in convs]
    try:
        with torch.no_grad():
            model(torch.zeros(batch_size, *image))
    finally:
        for h in hooks:
            h.remove()
    return shapes


def extrapolate_to_layers(timings: list[ConvTiming], layers: dict[str, ConvShape]) -> list[dict]:
    """Each model layer's forward time per implementation, at the throughput measured above."""
    return [
        {
            "layer": name,
            "shape": shape.describe(),
            "flops": shape.flops,
            "seconds": {t.impl: shape.flops / (t.gflops * 1e9) for t in timings},
        }
        for name, shape in layers.items()
    ]


# --- the loop-order (locality) experiment, compiled -------------------------------------------------

PERF_EVENTS = ("cycles", "instructions", "cache-references", "cache-misses", "L1-dcache-load-misses")


def compile_conv_orders(directory: Path) -> Path:
    """Build conv_orders.c with the system C compiler (gcc/cc), -O2."""
    compiler = shutil.which("gcc") or shutil.which("cc")
    if compiler is None:
        raise ConfigError("the loop-order experiment needs a C compiler (gcc or cc); none is on PATH")
    source = resources.files("dlscope.experiments").joinpath("conv_orders.c")
    binary = directory / "conv_orders"
    with resources.as_file(source) as path:
        subprocess.run([compiler, "-O2", "-o", str(binary), str(path)], check=True, capture_output=True, text=True)
    return binary


def index_inputs(shape: ConvShape) -> tuple[torch.Tensor, torch.Tensor]:
    """The inputs conv_orders.c generates from each element's index (input_value, weight_value)."""
    nx = shape.n * shape.c * shape.h * shape.w
    nw = shape.k * shape.c * shape.r * shape.s
    x = torch.from_numpy(((np.arange(nx, dtype=np.int64) * 7919) % 1000).astype(np.float32) / 1000 - 0.5)
    w = torch.from_numpy(((np.arange(nw, dtype=np.int64) * 104729) % 1000).astype(np.float32) / 1000 - 0.5)
    return x.reshape(shape.n, shape.c, shape.h, shape.w), w.reshape(shape.k, shape.c, shape.r, shape.s)


def parse_perf_csv(text: str) -> dict[str, int | None]:
    """`perf stat -x,` lines are value,unit,event,...; '<not supported>' counters become None."""
    counters: dict[str, int | None] = {}
    for line in text.splitlines():
        fields = line.split(",")
        if len(fields) >= 3 and fields[2] in PERF_EVENTS:
            counters[fields[2]] = int(fields[0]) if fields[0].isdigit() else None
    return counters


def loop_order_experiment(shape: ConvShape, repeats: int = 3) -> dict:
    """Time both loop orders of the compiled direct convolution; count cache misses where perf can."""
    perf = shutil.which("perf")
    x, w = index_inputs(shape)
    reference = F.conv2d(x, w, stride=shape.stride, padding=shape.padding)
    orders = []
    with tempfile.TemporaryDirectory(prefix="dlscope-conv-") as tmp:
        binary = compile_conv_orders(Path(tmp))
        for order in LOOP_ORDERS:
            out_path = Path(tmp) / f"{order}.bin"
            args = [str(binary), order, *map(str, (shape.n, shape.c, shape.h, shape.w, shape.k, shape.r, shape.s))]
            args += [str(shape.stride), str(shape.padding), str(repeats), str(out_path)]
            if perf:
                args = [perf, "stat", "-x,", "-e", ",".join(PERF_EVENTS), "--", *args]
            done = subprocess.run(args, capture_output=True, text=True, check=True)
            out = torch.from_numpy(np.fromfile(out_path, dtype=np.float32)).reshape(reference.shape)
            counters = parse_perf_csv(done.stderr) if perf else {}
            orders.append(
                {
                    "order": order,
                    "median_seconds": float(done.stdout.split()[-1]),
                    "max_abs_error": float((out - reference).abs().max()),
                    # the whole process: input set-up plus every repeat
                    "counters": counters,
                }
            )
    seed_time = orders[0]["median_seconds"]
    for o in orders:
        o["gflops"] = shape.flops / o["median_seconds"] / 1e9
        o["slowdown"] = o["median_seconds"] / seed_time
    supported = any(v is not None for o in orders for v in o["counters"].values())
    return {
        "shape": shape.to_dict(),
        "describe": shape.describe(),
        "repeats": repeats,
        "perf": "counted" if supported else ("unsupported" if perf else "absent"),  # perf, its counters
        "orders": orders,
        "working_set_bytes": 4 * (shape.n * shape.c * shape.h * shape.w + shape.k * shape.c * shape.r * shape.s)
        + 4 * shape.n * shape.k * shape.out_h * shape.out_w,
    }
