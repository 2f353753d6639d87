"""Section model: the model summary — layers, output shapes, parameters, FLOPs forward and per step."""

from __future__ import annotations

from typing import Any

from dlscope.report.blocks import Block, Code, Para, Table

TITLE = "Model"


def shape_text(shape: list[int]) -> str:
    """[-1, 32, 7, 7] → N×32×7×7 (-1: the batch dimension)."""
    return "×".join("N" if d == -1 else str(d) for d in shape)


def render(section: dict[str, Any]) -> list[Block]:
    flops = section["flops"]
    n = flops["batch_size"]
    rows = [
        [
            layer["name"],
            layer["kind"],
            shape_text(layer["output_shape"]),
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
            ["layer", "type", "output", "params", "fwd FLOP", "train FLOP"],
            rows,
            f"Layers, for an input of {shape_text(section['input_shape'])}",
            legend="output: shape at batch size N; fwd/train FLOP: per sample, forward only and forward + backward.",
        ),
        Code(section["repr"], "text"),
    ]
