"""Step: the model summary — layers, output shapes, parameters, FLOPs forward and per step."""

from __future__ import annotations

from typing import Any

import torch
from rich.table import Table as RichTable

from dlscope.console import console
from dlscope.data.loaders import normalise
from dlscope.models import MODELS, build_model
from dlscope.observe.summary import summarize_model
from dlscope.phases import phase
from dlscope.report.blocks import Block, Code, Para, Table
from dlscope.steps.base import LabContext, LabStep


def run(ctx: LabContext) -> dict[str, Any]:
    assert ctx.data is not None, "the dataset step runs first"
    config = ctx.config
    torch.manual_seed(config.seed)
    with phase("model_build"):
        model = build_model(config.model)
    n = min(config.batch_size, len(ctx.data.train_labels))
    x = normalise(ctx.data.train_images[:n])
    y = ctx.data.train_labels[:n]
    summary = summarize_model(model, x, y)
    summary["name"] = config.model
    summary["description"] = MODELS[config.model].description
    table = RichTable(title=f"{config.model}: {summary['model_class']}", title_justify="left")
    for column in ("layer", "type", "output shape", "params", "fwd FLOPs/sample"):
        table.add_column(column, justify="right" if column in ("params", "fwd FLOPs/sample") else "left")
    for layer in summary["layers"]:
        table.add_row(
            layer["name"],
            layer["kind"],
            str(tuple(layer["output_shape"])),
            f"{layer['params']:,}",
            f"{layer['forward_flops'] / n:,.0f}",
        )
    console.print(table)
    flops = summary["flops"]
    console.print(
        f"{summary['total_params']:,} parameters ({summary['param_bytes'] / 1024:.1f} KiB); "
        f"[metric]{flops['forward_per_sample'] / 1e6:.2f}[/] MFLOP forward, "
        f"[metric]{flops['train_step_per_sample'] / 1e6:.2f}[/] MFLOP per training sample"
    )
    return summary


def render(section: dict[str, Any]) -> list[Block]:
    flops = section["flops"]
    n = flops["batch_size"]
    rows = [
        [
            layer["name"],
            layer["kind"],
            str(tuple(layer["output_shape"])),
            layer["params"],
            layer["forward_flops"] / n,
            layer["train_flops"] / n,
        ]
        for layer in section["layers"]
    ]
    return [
        Para(
            f"{section['name']} — {section['description']}. {section['total_params']:,} parameters "
            f"({section['param_bytes'] / 1024:.1f} KiB of float32). One sample costs "
            f"{flops['forward_per_sample'] / 1e6:.2f} MFLOP forward and "
            f"{flops['train_step_per_sample'] / 1e6:.2f} MFLOP per training step "
            f"(forward + backward). {section['flops_convention']}."
        ),
        Table(
            ["layer", "type", "output shape", "parameters", "forward FLOPs/sample", "train FLOPs/sample"],
            rows,
            f"input {tuple(section['input_shape'])}",
        ),
        Code(section["repr"], "text"),
    ]


STEP = LabStep("model", "Model", run, render)
