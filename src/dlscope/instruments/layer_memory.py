"""Memory anatomy of a training step: what each layer keeps alive, and the measured peak.

Per layer: weights, their gradients, the optimizer's state, and the activations autograd saves
for backward (counted by `torch.autograd.graph.saved_tensors_hooks`, each storage once, the
parameters and the input batch excluded). Activations grow linearly with the batch; the rest
does not.

The model of the peak: the static part (weights + gradients + optimizer state + the batch) plus
the worst moment of backward, when layer L's backward runs: every activation saved by layers
≤ L is still alive (autograd frees a node's saved tensors once the node has run), and so are the
gradient arriving at L's output and the one it produces for L's input. The forward's end (all
activations, logits and their gradient) and the optimizer step (its whole-model temporaries,
measured once: they dominate a model whose weights outweigh its activations, like the MLP) are
the other candidates.

The measured peak: dlscope.measure.memory, from the model's creation through two training steps.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

from dlscope.measure.memory import SOURCE, allocation_peak
from dlscope.train import train_step

OptimizerFactory = Callable[[nn.Module], torch.optim.Optimizer]
FUNCTIONAL = "(functional)"  # ops outside any module: flatten, the loss


@dataclass
class LayerMemory:
    name: str
    kind: str
    weight_bytes: int
    grad_bytes: int
    optimizer_bytes: int
    saved_bytes_per_sample: float  # activations kept for backward
    output_bytes_per_sample: float


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def saved_activations(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[dict[str, int], dict[str, int]]:
    """Bytes saved for backward and bytes of output, per leaf module, for one forward + loss on (x, y)."""
    excluded = {p.untyped_storage().data_ptr() for p in model.parameters()} | {x.untyped_storage().data_ptr()}
    seen: set[int] = set()
    saved: dict[str, int] = {}
    outputs: dict[str, int] = {}
    current = [FUNCTIONAL]

    def enter(name: str):
        return lambda _module, _inputs: current.__setitem__(0, name)

    def leave(name: str):
        def hook(_module, _inputs, output):
            outputs[name] = _nbytes(output)
            current[0] = FUNCTIONAL

        return hook

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        key = storage.data_ptr()
        if key not in excluded and key not in seen:  # a ReLU's output saved again by the pool counts once
            seen.add(key)
            saved[current[0]] = saved.get(current[0], 0) + storage.nbytes()
        return t

    leaves = [(name, m) for name, m in model.named_modules() if name and not list(m.children())]
    hooks = [m.register_forward_pre_hook(enter(name)) for name, m in leaves]
    hooks += [m.register_forward_hook(leave(name)) for name, m in leaves]
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            F.cross_entropy(model(x), y)
    finally:
        for h in hooks:
            h.remove()
    return saved, outputs


def optimizer_state_bytes(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """Optimizer state per parameter name (after at least one step: state is created lazily)."""
    return {
        name: sum(_nbytes(v) for v in optimizer.state.get(p, {}).values() if isinstance(v, torch.Tensor))
        for name, p in model.named_parameters()
    }


def layer_memory(
    model: nn.Module, make_optimizer: OptimizerFactory, x: torch.Tensor, y: torch.Tensor
) -> list[LayerMemory]:
    """The per-layer anatomy, measured on a copy of `model` with one optimizer step on (x, y)."""
    probe = copy.deepcopy(model)
    optimizer = make_optimizer(probe)
    train_step(probe, optimizer, x, y)
    state = optimizer_state_bytes(probe, optimizer)
    saved, outputs = saved_activations(probe, x, y)
    n = len(x)
    rows = []
    for name, module in probe.named_modules():
        if not name or list(module.children()):
            continue
        params = dict(module.named_parameters(recurse=False))
        weight = sum(_nbytes(p) for p in params.values())
        rows.append(
            LayerMemory(
                name=name,
                kind=type(module).__name__,
                weight_bytes=weight,
                grad_bytes=sum(_nbytes(p) for p in params.values() if p.requires_grad),
                optimizer_bytes=sum(state[f"{name}.{p}"] for p in params),
                saved_bytes_per_sample=saved.get(name, 0) / n,
                output_bytes_per_sample=outputs.get(name, 0) / n,
            )
        )
    if saved.get(FUNCTIONAL):
        rows.append(LayerMemory(FUNCTIONAL, "flatten, loss", 0, 0, 0, saved[FUNCTIONAL] / n, 0))
    return rows


def optimizer_workspace(model: nn.Module, make_optimizer: OptimizerFactory, x: torch.Tensor, y: torch.Tensor) -> int:
    """Bytes one optimizer step allocates beyond its state (foreach implementations build
    whole-model temporaries: Adam's sqrt of exp_avg_sq, SGD-Nesterov's update), measured on the CPU."""
    probe = copy.deepcopy(model)
    optimizer = make_optimizer(probe)
    train_step(probe, optimizer, x, y)  # creates the state, so the step below allocates only temporaries
    optimizer.zero_grad(set_to_none=True)
    F.cross_entropy(probe(x), y).backward()
    with allocation_peak(torch.device("cpu")) as recorded:
        optimizer.step()
    return recorded["peak_bytes"]


def predict_peak(
    layers: list[LayerMemory],
    batch_size: int,
    input_bytes_per_sample: float,
    classes: int,
    optimizer_workspace_bytes: int = 0,
) -> dict:
    """The model of the peak (see the module docstring), in bytes, with where it happens."""
    static = sum(r.weight_bytes + r.grad_bytes + r.optimizer_bytes for r in layers)
    batch = batch_size * (input_bytes_per_sample + 8)  # images + int64 labels
    per_sample_saved = sum(r.saved_bytes_per_sample for r in layers)
    logits = batch_size * classes * 4
    candidates = {
        "end of forward": per_sample_saved * batch_size + 2 * logits,
        "optimizer step": optimizer_workspace_bytes,  # activations are freed by then
    }
    running = sum(r.saved_bytes_per_sample for r in layers if r.name == FUNCTIONAL) * batch_size
    previous_output = input_bytes_per_sample * batch_size
    for r in (r for r in layers if r.name != FUNCTIONAL):
        running += r.saved_bytes_per_sample * batch_size
        output = r.output_bytes_per_sample * batch_size
        candidates[f"backward of {r.name}"] = running + output + previous_output
        previous_output = output
    where = max(candidates, key=candidates.__getitem__)
    return {
        "batch_size": batch_size,
        "static_bytes": static,
        "batch_bytes": int(batch),
        "activation_bytes": int(per_sample_saved * batch_size),
        "peak_bytes": int(static + batch + candidates[where]),
        "peak_at": where,
    }


def measure_peak(
    build: Callable[[], nn.Module],
    make_optimizer: OptimizerFactory,
    batch_size: int,
    image_shape: tuple[int, ...] = (1, 28, 28),
    classes: int = 10,
    device: str | torch.device = "cpu",
    steps: int = 2,
) -> int:
    """Peak bytes allocated from the model's creation through `steps` training steps."""
    device = torch.device(device)
    with allocation_peak(device) as recorded:
        model = build().to(device)
        optimizer = make_optimizer(model)
        x = torch.randn(batch_size, *image_shape, device=device)
        y = torch.randint(0, classes, (batch_size,), device=device)
        for _ in range(steps):
            train_step(model, optimizer, x, y)
        del model, optimizer, x, y
    return recorded["peak_bytes"]


def memory_anatomy(
    build: Callable[[], nn.Module],
    make_optimizer: OptimizerFactory,
    batch_sizes: list[int],
    image_shape: tuple[int, ...] = (1, 28, 28),
    classes: int = 10,
    device: str | torch.device = "cpu",
) -> dict:
    """Per-layer table (per sample where it scales) and, per batch size, model against measurement."""
    probe_batch = 4
    x = torch.randn(probe_batch, *image_shape)
    y = torch.randint(0, classes, (probe_batch,))
    model = build()
    layers = layer_memory(model, make_optimizer, x, y)
    workspace = optimizer_workspace(model, make_optimizer, x, y)
    input_per_sample = x[0].numel() * x.element_size()
    if torch.device(device).type == "cuda":
        # cuBLAS's and cuDNN's workspaces are allocated at the first product and kept: charged to
        # no batch size (measured on an H100, they made batch 16's peak 71 MB against batch 64's 16)
        measure_peak(build, make_optimizer, batch_sizes[0], image_shape, classes, device)
    comparisons = []
    for batch_size in batch_sizes:
        predicted = predict_peak(layers, batch_size, input_per_sample, classes, workspace)
        measured = measure_peak(build, make_optimizer, batch_size, image_shape, classes, device)
        predicted["measured_peak_bytes"] = measured
        predicted["error_pct"] = 100 * (predicted["peak_bytes"] - measured) / measured
        comparisons.append(predicted)
    return {
        "device": str(device),
        "method": SOURCE[torch.device(device).type],
        "layers": [asdict(r) for r in layers],
        "input_bytes_per_sample": input_per_sample,
        "optimizer_workspace_bytes": workspace,
        "comparisons": comparisons,
    }
