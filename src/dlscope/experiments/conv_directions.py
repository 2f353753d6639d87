"""Each convolution of a model in its three directions — forward, input gradient, weight gradient —
on each CPU path (models.CONV_PATHS), timed interleaved on the shapes a training step gives it.

A training step runs every convolution three times at the same FLOP count (2·N·K·C·R·S·Ho·Wo), so
the three should run at similar rates. On AVX2 they do not: oneDNN's weight gradient of a layer
with few input channels runs at a fraction of its forward rate. This names such a kernel, with its
GFLOP/s, and shows whether another path does better. The first convolution needs
no input gradient (its input is the images): autograd asks for none, so it is not timed here.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from dlscope.measure.timing import Contender, time_interleaved
from dlscope.models import CONV_PATHS, channels_last

DIRECTIONS = ("forward", "input grad", "weight grad")
SLOW_RATE_RATIO = 0.5  # a kernel below half the median rate of the others is named in the findings


def conv_inputs(model: nn.Module, x: torch.Tensor) -> list[tuple[str, nn.Conv2d, torch.Tensor]]:
    """Every Conv2d of `model` with the input it sees in a forward pass of `x`."""
    seen: list[tuple[str, nn.Conv2d, torch.Tensor]] = []
    hooks = [
        module.register_forward_pre_hook(lambda m, args, name=name: seen.append((name, m, args[0].detach())))
        for name, module in model.named_modules()
        if isinstance(module, nn.Conv2d)
    ]
    try:
        with torch.no_grad():
            model(x)
    finally:
        for hook in hooks:
            hook.remove()
    return seen


def direction_call(conv: nn.Conv2d, x: torch.Tensor, direction: str, path: str) -> Callable[[], object]:
    """One call of the convolution in `direction` on `path` (aten's own ops, as autograd calls them)."""
    w, b = conv.weight.detach(), conv.bias.detach() if conv.bias is not None else None
    k, stride, padding = list(conv.kernel_size), list(conv.stride), list(conv.padding)
    if path == "onednn-cl":
        x, w = channels_last(x), channels_last(w)
    if path == "native":
        x, w = x.contiguous(), w.contiguous()
        out = torch.ops.aten._slow_conv2d_forward(x, w, k, b, stride, padding)
        if direction == "forward":
            return lambda: torch.ops.aten._slow_conv2d_forward(x, w, k, b, stride, padding)
        mask = [True, False, False] if direction == "input grad" else [False, True, True]
        grad = torch.randn_like(out)
        return lambda: torch.ops.aten._slow_conv2d_backward(grad, x, w, k, stride, padding, mask)
    out = torch.nn.functional.conv2d(x, w, b, stride, padding)
    if direction == "forward":
        return lambda: torch.nn.functional.conv2d(x, w, b, stride, padding)
    mask = [True, False, False] if direction == "input grad" else [False, True, True]
    grad = torch.randn_like(out)
    args = (grad, x, w, [w.shape[0]], stride, padding, [1, 1], False, [0, 0], 1, mask)
    return lambda: torch.ops.aten.convolution_backward(*args)


@contextlib.contextmanager
def onednn(enabled: bool) -> Iterator[None]:
    # flags() also sets oneDNN's TF32 switch, and torch warns on every CPU-only build that it
    # has no Intel GPU to use it on: noise in the middle of the sweep's output
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="TF32 acceleration on top of oneDNN")
        with torch.backends.mkldnn.flags(enabled=enabled):
            yield


def conv_directions(model: nn.Module, x: torch.Tensor, repeats: int = 4) -> list[dict[str, Any]]:
    """Rows (layer, path, direction, ms, GFLOP/s) for every convolution of `model` on input `x`."""
    rows, contenders = [], []
    for index, (name, conv, conv_x) in enumerate(conv_inputs(model, x)):
        out_h = (conv_x.shape[2] + 2 * conv.padding[0] - conv.kernel_size[0]) // conv.stride[0] + 1
        out_w = (conv_x.shape[3] + 2 * conv.padding[1] - conv.kernel_size[1]) // conv.stride[1] + 1
        flops = 2 * conv_x.shape[0] * conv.weight.numel() * out_h * out_w
        for path in CONV_PATHS:
            for direction in DIRECTIONS:
                if direction == "input grad" and index == 0:
                    continue  # the images need no gradient
                with onednn(path != "native"):
                    call = direction_call(conv, conv_x, direction, path)
                settings = lambda path=path: onednn(path != "native")  # noqa: E731
                contenders.append(Contender(f"{name}/{path}/{direction}", call, settings=settings))
                rows.append(
                    {
                        "layer": name.split(".")[0],
                        "path": path,
                        "direction": direction,
                        "flops": flops,
                        "shape": f"{tuple(conv_x.shape)} * {tuple(conv.weight.shape)}",
                    }
                )
    time_interleaved(contenders, repeats, repeats, warmup=1)
    for row, contender in zip(rows, contenders, strict=True):
        row["ms"] = contender.median_s * 1e3
        row["gflops"] = row["flops"] / contender.median_s / 1e9
    return rows


def slow_kernels(rows: list[dict[str, Any]], path: str = "onednn") -> list[dict[str, Any]]:
    """On torch's default `path`, the layer directions below SLOW_RATE_RATIO × the median rate of
    the others, slowest first, each with the best alternative path measured for it."""
    default = [r for r in rows if r["path"] == path]
    slow = []
    for row in default:
        others = sorted(r["gflops"] for r in default if r is not row)
        if not others:
            continue
        median = others[len(others) // 2]
        if row["gflops"] < SLOW_RATE_RATIO * median:
            alternatives = [
                r for r in rows if r["layer"] == row["layer"] and r["direction"] == row["direction"] and r is not row
            ]
            best = max(alternatives, key=lambda r: r["gflops"], default=None)
            slow.append({**row, "others_median_gflops": median, "best_alternative": best})
    return sorted(slow, key=lambda r: r["gflops"])
