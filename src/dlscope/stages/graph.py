"""Step: the framework's life cycle (seed 004, 1.4.3) — forward graph, autograd graph with saved
tensors, and with `compile` the joint graph, Inductor's generated code and eager vs compiled time.

torch.compile's cold C++ build takes tens of seconds on 2 cores, so `dlscope lab` shows the
forward and autograd graphs and compiles only with `--compile`; `dlscope graph` always compiles.
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from dlscope.data.loaders import normalise
from dlscope.fsutil import atomic_write_bytes
from dlscope.instruments.graph import autograd_graph, compile_and_compare, forward_graph, loss_on_batch
from dlscope.models import build_model
from dlscope.stages.base import Context, Step
from dlscope.train import make_optimizer, resolve_device


def run(ctx: Context) -> dict[str, Any]:
    options = ctx.steps.graph
    config = ctx.config
    device = resolve_device(config.device)
    data = ctx.data
    assert data is not None
    n = min(options.batch_size or config.batch_size, len(data.train_labels))
    x = normalise(data.train_images[:n]).to(device)
    y = data.train_labels[:n].to(device)
    torch.manual_seed(config.seed)
    model = copy.deepcopy(ctx.trainer.model) if ctx.trainer else build_model(config.model).to(device)
    graph_dir = ctx.run.sub("graph")

    forward = forward_graph(model, x)
    autograd = autograd_graph(model, loss_on_batch(model, x, y))
    atomic_write_bytes(graph_dir / "forward.py", (forward["code"] + "\n").encode())
    section: dict[str, Any] = {
        "model": config.model,
        "batch_size": n,
        "device": str(device),
        "forward": forward,
        "autograd": autograd,
        "files": {"forward": ctx.run.rel(graph_dir / "forward.py")},
    }
    if options.compile:
        cache = "cold cache" if options.cold else "cache allowed"
        with ctx.task(f"torch.compile (Inductor, {cache}): tracing, generating and building kernels"):
            compiled = compile_and_compare(
                model, lambda m: make_optimizer(config, m), x, y, options.repeats, cold=options.cold
            )
        for kind, code in compiled["generated_code"].items():
            path = atomic_write_bytes(graph_dir / f"inductor_{kind}.py", code.encode())
            section["files"][f"inductor_{kind}"] = ctx.run.rel(path)
        path = atomic_write_bytes(graph_dir / "joint_graph.py", compiled["joint_graph_code"].encode())
        section["files"]["joint_graph"] = ctx.run.rel(path)
        section["compiled"] = compiled
    return section


STEP = Step("graph", run, needs=("dataset",))
