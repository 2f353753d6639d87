"""The model zoo: every model takes (N, 1, 28, 28) MNIST images and returns (N, 10) scores."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from dlscope.errors import ConfigError

# How one convolution may be computed: oneDNN on contiguous (NCHW) or channels-last (NHWC) tensors,
# or aten's native im2col + GEMM kernels (contiguous), in the forward and both backward directions.
CONV_PATHS = ("onednn", "onednn-cl", "native")


@dataclass(frozen=True)
class Layout:
    """How a model's convolutions are computed — never what: every layout gives the same outputs
    and gradients from the same parameters, so the autotuner may pick any (dlscope.autotune).

    paths       per convolution, one of CONV_PATHS (empty: all "onednn", torch's default). On AVX2,
                oneDNN's weight gradient of the 1-channel first convolution runs ~15× faster
                channels-last than NCHW, while the next convolution is faster NCHW.
    pool_first  max-pool before the ReLU: the same result (ReLU is monotonic, so it commutes with
                max) on a quarter of the elements
    """

    paths: tuple[str, ...] = ()
    pool_first: bool = False

    def path(self, index: int) -> str:
        return self.paths[index] if index < len(self.paths) else "onednn"

    def to_dict(self) -> dict[str, Any]:
        return {"paths": list(self.paths), "pool_first": self.pool_first}

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> Layout:
        return cls(tuple(values["paths"]), bool(values["pool_first"]))

    def describe(self) -> str:
        parts = [f"conv{i + 1} {p}" for i, p in enumerate(self.paths) if p != "onednn"] or ["oneDNN NCHW"]
        if self.pool_first:
            parts.append("pool first")
        return ", ".join(parts)


def tracing() -> bool:
    """Inside torch.fx's symbolic trace (`dlscope graph`): strides are no part of the graph, and
    asking a traced value for them is control flow fx cannot record."""
    return torch.fx._symbolic_trace.is_fx_symbolic_tracing()


def channels_last(x: torch.Tensor) -> torch.Tensor:
    """`x` with NHWC strides — also with one channel, where `x.contiguous(memory_format=channels_last)`
    keeps the NCHW strides (both describe the same element order) and oneDNN, reading the format
    from the strides, runs its NCHW kernels: for the first convolution 5–10× slower on AVX2."""
    if tracing() or (x.is_contiguous(memory_format=torch.channels_last) and x.stride(1) == 1):
        return x
    return torch.empty_like(x, memory_format=torch.channels_last).copy_(x)


def nchw(x: torch.Tensor) -> torch.Tensor:
    """`x` with NCHW strides — also with one channel, where `contiguous()` keeps NHWC ones (see
    channels_last): which kernel oneDNN runs, and so the result's last bits, follow the strides."""
    if tracing() or (x.is_contiguous() and x.stride(1) == x.shape[2] * x.shape[3]):
        return x
    return torch.empty_like(x, memory_format=torch.contiguous_format).copy_(x)


def conv2d(x: torch.Tensor, conv: nn.Conv2d, path: str) -> torch.Tensor:
    if path == "native":
        # autograd's SlowConv2DBackward runs aten's own kernels in both directions, whatever the
        # global oneDNN switch says when the backward runs. Both operands contiguous: given a
        # channels-last weight, torch 2.13's _slow_conv2d_backward returns a wrong weight gradient
        # (tests/test_recipe.py compares every layout's gradients).
        return torch.ops.aten._slow_conv2d_forward(
            nchw(x), nchw(conv.weight), conv.kernel_size, conv.bias, conv.stride, conv.padding
        )
    return conv(channels_last(x) if path == "onednn-cl" else nchw(x))


class ConvBlock(nn.Sequential):
    """conv → ReLU → max-pool (indices 0, 1, 2 in the state dict), computed in the model's layout."""

    def __init__(self, conv: nn.Conv2d, pool: int = 2) -> None:
        super().__init__(conv, nn.ReLU(), nn.MaxPool2d(pool))

    def run(self, x: torch.Tensor, layout: Layout, index: int) -> torch.Tensor:
        conv, relu, pool = self
        x = conv2d(x, conv, layout.path(index))
        return relu(pool(x)) if layout.pool_first else pool(relu(x))


class TunableCNN(nn.Module):
    """A stack of ConvBlocks then a linear layer; `layout` says how to compute it (see Layout)."""

    blocks: tuple[str, ...] = ()

    def __init__(self) -> None:
        super().__init__()
        self.layout = Layout()

    def set_layout(self, layout: Layout) -> None:
        self.layout = layout
        for i, name in enumerate(self.blocks):
            weight = getattr(self, name)[0].weight
            weight.data = channels_last(weight.data) if layout.path(i) == "onednn-cl" else nchw(weight.data)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, name in enumerate(self.blocks):
            x = getattr(self, name).run(x, self.layout, i)
        return self.out(x.flatten(1))


class SeedCNN(TunableCNN):
    """Seed 000's CNN: conv5x5 16 → ReLU → pool → conv5x5 32 → ReLU → pool → linear 10."""

    blocks = ("conv1", "conv2")

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = ConvBlock(nn.Conv2d(1, 16, 5, 1, 2))
        self.conv2 = ConvBlock(nn.Conv2d(16, 32, 5, 1, 2))
        self.out = nn.Linear(32 * 7 * 7, 10)


class SmallCNN(TunableCNN):
    """A net for time to 99%: ~1.2 MFLOP forward per sample (the cnn: 5.7), 3×3 convolutions.

    conv3x3 12 → ReLU → pool → conv3x3 24 → ReLU → pool → conv3x3 32 → ReLU → pool → linear 10.
    """

    blocks = ("conv1", "conv2", "conv3")

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = ConvBlock(nn.Conv2d(1, 12, 3, 1, 1))
        self.conv2 = ConvBlock(nn.Conv2d(12, 24, 3, 1, 1))
        self.conv3 = ConvBlock(nn.Conv2d(24, 32, 3, 1, 1))
        self.out = nn.Linear(32 * 3 * 3, 10)


class ExamplesNet(nn.Module):
    """pytorch/examples mnist `Net` (the lab's mnist_basic.py), log-probabilities out."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = self.dropout1(F.max_pool2d(x, 2))
        x = self.dropout2(F.relu(self.fc1(x.flatten(1))))
        # cross-entropy of log-probabilities equals nll_loss: log_softmax is idempotent
        return F.log_softmax(self.fc2(x), dim=1)


class LeNet5(nn.Module):
    """LeNet-5 as seed 004 means it: 1 input channel, fc3 defined, 28x28 padded to 32x32."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 6, 5, padding=2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 5 * 5, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.max_pool2d(F.relu(self.conv1(x)), 2)
        out = F.max_pool2d(F.relu(self.conv2(out)), 2)
        out = F.relu(self.fc1(out.flatten(1)))
        out = F.relu(self.fc2(out))
        return self.fc3(out)


class SeedMLP(nn.Module):
    """Seed 003's Keras MLP: flatten → dense 512 ReLU → dropout 0.2 → dense 10."""

    def __init__(self) -> None:
        super().__init__()
        self.flatten = nn.Flatten()
        self.dense = nn.Linear(784, 512)
        self.dropout = nn.Dropout(0.2)
        self.dense_1 = nn.Linear(512, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dense_1(self.dropout(F.relu(self.dense(self.flatten(x)))))


@dataclass(frozen=True)
class ModelSpec:
    name: str
    build: Callable[[], nn.Module]
    description: str


MODELS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec("cnn", SeedCNN, "seed 000 CNN: 2 × (conv5x5 → ReLU → maxpool) → linear (default)"),
        ModelSpec("small", SmallCNN, "3 × (conv3x3 → ReLU → maxpool) → linear: few FLOPs to 99% (--recipe fast)"),
        ModelSpec("net", ExamplesNet, "pytorch/examples MNIST Net: 2 conv3x3, dropout, 2 linear"),
        ModelSpec("lenet", LeNet5, "LeNet-5 (seed 004, fixed): 2 conv5x5 → maxpool, 3 linear"),
        ModelSpec("mlp", SeedMLP, "seed 003 MLP: 784 → 512 ReLU → dropout 0.2 → 10"),
    )
}


def build_model(name: str) -> nn.Module:
    """A freshly initialised model from the registry (seed torch's RNG first for determinism)."""
    try:
        return MODELS[name].build()
    except KeyError:
        raise ConfigError(f"unknown model {name!r}; choose from {', '.join(MODELS)}") from None
