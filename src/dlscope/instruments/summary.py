"""Model summary: each layer's output shape and parameters, and FLOPs forward and per step.

FLOPs come from `torch.utils.flop_counter.FlopCounterMode`, which counts a multiply-add as
2 FLOPs (a matmul is 2·M·N·K) and counts only matmuls and convolutions, forward and backward.
"""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode


@dataclass
class LayerRow:
    name: str
    kind: str
    output_shape: list[int]
    params: int
    trainable: int
    forward_flops: int
    train_flops: int  # forward + backward of this layer


def _module_flops(counter: FlopCounterMode, root: str, name: str) -> int:
    counts = counter.get_flop_counts()
    key = f"{root}.{name}" if name else root
    return int(sum(counts.get(key, {}).values()))


def count_flops(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict:
    """FLOPs of one forward pass and of one training step (forward + backward) on batch (x, y)."""
    model = copy.deepcopy(model)
    model.train()
    with FlopCounterMode(display=False) as forward_counter, torch.no_grad():
        model(x)
    with FlopCounterMode(display=False) as step_counter:
        F.cross_entropy(model(x), y).backward()
    n = len(x)
    forward, step = forward_counter.get_total_flops(), step_counter.get_total_flops()
    return {
        "batch_size": n,
        "forward": forward,
        "train_step": step,
        "forward_per_sample": forward / n,
        "train_step_per_sample": step / n,
        "_counters": (forward_counter, step_counter),
    }


def summarize_model(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict:
    """Per-layer table and totals for `model` on a batch shaped like `x`."""
    flops = count_flops(model, x, y)
    forward_counter, step_counter = flops.pop("_counters")
    root = type(model).__name__
    shapes: dict[str, list[int]] = {}
    probe = copy.deepcopy(model).eval()
    hooks = [
        module.register_forward_hook(lambda _m, _i, out, name=name: shapes.__setitem__(name, list(out.shape)))
        for name, module in probe.named_modules()
        if name and not list(module.children())
    ]
    with torch.no_grad():
        probe(x[:1])
    for h in hooks:
        h.remove()
    rows = []
    for name, module in model.named_modules():
        if not name or list(module.children()):
            continue
        params = sum(p.numel() for p in module.parameters(recurse=False))
        trainable = sum(p.numel() for p in module.parameters(recurse=False) if p.requires_grad)
        rows.append(
            LayerRow(
                name=name,
                kind=type(module).__name__,
                output_shape=[-1, *shapes.get(name, [0])[1:]],
                params=params,
                trainable=trainable,
                forward_flops=_module_flops(forward_counter, root, name),
                train_flops=_module_flops(step_counter, root, name),
            )
        )
    total_params = sum(p.numel() for p in model.parameters())
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    return {
        "model_class": root,
        "input_shape": [-1, *x.shape[1:]],
        "layers": [asdict(r) for r in rows],
        "total_params": total_params,
        "trainable_params": sum(p.numel() for p in model.parameters() if p.requires_grad),
        "param_bytes": param_bytes,
        "flops": flops,
        "flops_convention": "FLOPs = 2 × multiply-adds (FlopCounterMode; matmul and conv only)",
        "repr": repr(model),
    }
