"""Step: the framework's life cycle (seed 004, 1.4.3) — forward graph, autograd graph with saved
tensors, and with `compile` the joint graph, Inductor's generated code and eager vs compiled time.

torch.compile's cold C++ build takes tens of seconds on 2 cores, so `dlscope lab` shows the
forward and autograd graphs and compiles only with `--compile`; `dlscope graph` always compiles.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch
from rich.table import Table as RichTable

from dlscope.console import console
from dlscope.data.loaders import normalise
from dlscope.data.mnist import load_mnist
from dlscope.fsutil import atomic_write_bytes
from dlscope.models import build_model
from dlscope.observe.graph import autograd_graph, code_excerpts, compile_and_compare, forward_graph, loss_on_batch
from dlscope.report.blocks import Block, Code, Findings, Para, Svg, Table
from dlscope.report.graphs import graph_svg
from dlscope.steps.base import LabContext, LabStep
from dlscope.train import make_optimizer, resolve_device


@dataclass
class GraphOptions:
    compile: bool = False
    cold: bool = True  # compile into a fresh Inductor cache, so the compile time is the real one
    repeats: int = 20
    batch_size: int | None = None  # default: the training batch size


def run(ctx: LabContext) -> dict[str, Any]:
    options: GraphOptions = ctx.options.extra.get("graph") or GraphOptions()
    if ctx.config.threads:  # without a Trainer nobody else applies --threads
        torch.set_num_threads(ctx.config.threads)
    config = ctx.config
    device = resolve_device(config.device)
    data = ctx.data or load_mnist(ctx.options.data_dir)
    n = min(options.batch_size or config.batch_size, len(data.train_labels))
    x = normalise(data.train_images[:n]).to(device)
    y = data.train_labels[:n].to(device)
    torch.manual_seed(config.seed)
    model = copy.deepcopy(ctx.trainer.model) if ctx.trainer else build_model(config.model).to(device)
    graph_dir = ctx.run.sub("graph")

    forward = forward_graph(model, x)
    autograd = autograd_graph(model, loss_on_batch(model, x, y))
    atomic_write_bytes(graph_dir / "forward.py", (forward["code"] + "\n").encode())
    console.print(
        f"forward graph (torch.fx): [metric]{len(forward['nodes'])}[/] nodes; autograd graph from loss.grad_fn: "
        f"[metric]{autograd['backward_nodes']}[/] backward nodes holding [metric]{autograd['saved_tensors']}[/] "
        f"saved tensors ({autograd['saved_distinct_bytes'] / 2**20:.2f} MiB distinct at batch {n})"
    )
    table = RichTable(title="autograd graph: backward nodes and what they saved", title_justify="left")
    table.add_column("node")
    table.add_column("saved tensors")
    for node in autograd["nodes"]:
        if node["kind"] == "backward":
            table.add_row(node["name"], ", ".join(f"{s['name']} {s['shape']}" for s in node["saved"]) or "[dim]—[/]")
    console.print(table)
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
        with console.status(f"torch.compile (Inductor, {cache}): tracing, generating and building kernels…"):
            compiled = compile_and_compare(
                model, lambda m: make_optimizer(config, m), x, y, options.repeats, cold=options.cold
            )
        for kind, code in compiled["generated_code"].items():
            path = atomic_write_bytes(graph_dir / f"inductor_{kind}.py", code.encode())
            section["files"][f"inductor_{kind}"] = ctx.run.rel(path)
        path = atomic_write_bytes(graph_dir / "joint_graph.py", compiled["joint_graph_code"].encode())
        section["files"]["joint_graph"] = ctx.run.rel(path)
        steps = compiled["step_ms"]
        console.print(
            f"compiled in [metric]{compiled['compile_seconds']:.1f}[/] s ({compiled['cache']}); "
            f"{len(compiled['kernels'])} generated {compiled['generated_language']} kernels; step at batch {n}: "
            f"eager [metric]{steps['eager']:.2f}[/] ms, compiled [metric]{steps['compiled']:.2f}[/] ms "
            f"([{'good' if compiled['speedup'] > 1 else 'warn'}]{compiled['speedup']:.2f}×[/])"
        )
        section["compiled"] = compiled
    return section


def _svg(name: str, graph: dict, caption: str, rankdir: str = "TB") -> Svg:
    svg, how = graph_svg(graph, rankdir)
    return Svg(name, svg, f"{caption} (drawn by {how})")


def render(section: dict[str, Any]) -> list[Block]:
    forward, autograd = section["forward"], section["autograd"]
    saved_rows = [
        [node["name"], s["name"], "×".join(map(str, s["shape"])) or "scalar", s["dtype"], s["bytes"]]
        for node in autograd["nodes"]
        if node["kind"] == "backward"
        for s in node["saved"]
    ]
    blocks: list[Block] = [
        Para(
            f"How the framework runs {section['model']} (seed 004, 1.4.3), at batch {section['batch_size']} on "
            f"{section['device']}. (1) The Python program becomes a forward data-flow graph — here torch.fx's "
            f"symbolic trace, {len(forward['nodes'])} nodes with the shapes flowing along them."
        ),
        _svg("graph_forward", forward, "forward data-flow graph (torch.fx)"),
        Para(
            "(2) Automatic differentiation records a backward graph while the forward runs: walked from "
            f"loss.grad_fn, {autograd['backward_nodes']} nodes (pink: backward functions, green: AccumulateGrad "
            f"writing a parameter's .grad) and, dashed orange, the {autograd['saved_tensors']} tensors they saved "
            f"for backward — {autograd['saved_distinct_bytes'] / 2**20:.2f} MiB distinct (weights "
            "included; a ReLU output its pool saves again counted once): the activation memory of training."
        ),
        _svg("graph_autograd", autograd, "autograd graph from loss.grad_fn with saved tensors"),
        Table(["backward node", "saved", "shape", "dtype", "bytes"], saved_rows, "saved tensors per backward node"),
    ]
    compiled = section.get("compiled")
    if compiled is None:
        blocks.append(
            Para(
                "(3) Generated code and (4) its schedule come from torch.compile, which takes tens of seconds of "
                "C++ compilation on a small CPU; run `dlscope graph` (or `dlscope lab --compile`) to add the "
                "joint graph, Inductor's generated code and eager against compiled step time."
            )
        )
        return blocks
    steps = compiled["step_ms"]
    joint = compiled["joint_graph"]
    blocks += [
        Para(
            "(3) torch.compile: TorchDynamo captures the forward, AOTAutograd traces forward and backward "
            f"together into one joint graph of {len(joint['nodes'])} aten/prims nodes, and Inductor fuses "
            f"them into {len(compiled['kernels'])} {compiled['generated_language']} kernels around library "
            "calls (convolutions and matmuls stay with oneDNN/BLAS on CPU)."
        ),
        Findings(
            [
                (
                    "info",
                    f"Compiling took {compiled['compile_seconds']:.1f} s ({compiled['cache']}).",
                ),
                (
                    "good" if compiled["speedup"] > 1 else "warn",
                    f"(4) Training step at batch {compiled['batch_size']}: eager {steps['eager']:.2f} ms, compiled "
                    f"{steps['compiled']:.2f} ms — {compiled['speedup']:.2f}× (median of {compiled['repeats']}, "
                    "interleaved; the optimizer step stays eager).",
                ),
            ]
        ),
        _svg("graph_joint", joint, "AOTAutograd joint forward + backward graph"),
        Table(["generated kernel"], [[k] for k in compiled["kernels"]], "Inductor's fused kernels"),
    ]
    for kind, code in compiled["generated_code"].items():
        excerpts = code_excerpts(code)
        if "kernel" in excerpts:
            blocks.append(Para(f"One fused kernel Inductor generated for the {kind} pass, as it was compiled:"))
            blocks.append(Code(excerpts["kernel"], "cpp"))
        if "schedule" in excerpts:
            blocks.append(
                Para(
                    f"The {kind} schedule (`call`): library calls (extern_kernels), fused kernels and buffer "
                    f"frees in the order they run ({len(code.splitlines())} lines in all; the run's graph/ "
                    "folder has the whole file):"
                )
            )
            blocks.append(Code(excerpts["schedule"], "python"))
    return blocks


STEP = LabStep("graph", "Framework life cycle: forward graph, autograd graph, generated code", run, render)
