"""Step: operators and memory (seed 004, 1.4.2) — one convolution from seven loops to oneDNN,
the loop-order experiment, and the memory anatomy of a training step.

Options come from the command (OpsOptions); `dlscope lab` runs the short
defaults, `dlscope ops conv` / `dlscope ops memory` the part asked for at the size asked for.
"""

from __future__ import annotations

import os
from dataclasses import asdict
from typing import Any

import torch

from dlscope.experiments.conv import extrapolate_to_layers, loop_order_experiment, model_conv_shapes, time_conv
from dlscope.instruments.layer_memory import memory_anatomy
from dlscope.measure.peaks import measure_gemm_peak
from dlscope.models import build_model
from dlscope.options import OpsOptions
from dlscope.stages.base import Context, Step
from dlscope.train import make_optimizer, resolve_device


def run_conv(ctx: Context, options: OpsOptions, section: dict[str, Any]) -> None:
    device = resolve_device(ctx.config.device)
    with ctx.task(f"measuring the GEMM peak ({options.gemm_n}³ fp32 matmul)"):
        peak = measure_gemm_peak(device, n=options.gemm_n)
    section["peak"] = peak.to_dict()
    shape = options.shape
    with ctx.task(f"timing {', '.join(options.impls)} on {shape.describe()}"):
        timings = time_conv(shape, options.impls, peak.value, options.repeats, options.loops_budget_s, device=device)
    model = build_model(ctx.config.model)
    layers = extrapolate_to_layers(timings, model_conv_shapes(model, ctx.config.batch_size))
    section["conv"] = {
        "shape": shape.to_dict(),
        "describe": shape.describe(),
        "im2col_bytes": shape.im2col_bytes,
        "input_bytes": 4 * shape.n * shape.c * shape.h * shape.w,
        "timings": [asdict(t) for t in timings],
        "model": ctx.config.model,
        "model_batch_size": ctx.config.batch_size,
        "model_layers": layers,
        "device": str(device),
        "threads": torch.get_num_threads(),
        "cpus": os.cpu_count(),
        # timings mean little on a machine others are using: keep how busy it was
        "load_average_1min": os.getloadavg()[0],
    }


def run_loop_order(ctx: Context, options: OpsOptions, section: dict[str, Any]) -> None:
    shape = options.loop_order_shape
    with ctx.task(f"compiling and timing two loop orders on {shape.describe()}"):
        result = loop_order_experiment(shape)
    section["loop_order"] = result


def run_memory(ctx: Context, options: OpsOptions, section: dict[str, Any]) -> None:
    config = ctx.config
    device = resolve_device(config.device)
    with ctx.task(f"memory anatomy of {config.model} at batch {options.memory_batch_sizes}"):
        torch.manual_seed(config.seed)
        result = memory_anatomy(
            lambda: build_model(config.model),
            lambda model: make_optimizer(config, model),
            options.memory_batch_sizes,
            device=device,
        )
    result["model"] = config.model
    result["optimizer"] = config.optimizer
    section["memory"] = result


def run(ctx: Context) -> dict[str, Any]:
    options = ctx.steps.ops or OpsOptions()
    section: dict[str, Any] = {"parts": list(options.parts)}
    if "conv" in options.parts:
        run_conv(ctx, options, section)
    if "loop_order" in options.parts:
        run_loop_order(ctx, options, section)
    if "memory" in options.parts:
        run_memory(ctx, options, section)
    return section


STEP = Step("ops", run)
