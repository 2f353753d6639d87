"""The model zoo: every model takes (N, 1, 28, 28) MNIST images and returns (N, 10) scores."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from dlscope.errors import ConfigError


class SeedCNN(nn.Module):
    """Seed 000's CNN: conv5x5 16 → ReLU → pool → conv5x5 32 → ReLU → pool → linear 10."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Sequential(nn.Conv2d(1, 16, 5, 1, 2), nn.ReLU(), nn.MaxPool2d(2))
        self.conv2 = nn.Sequential(nn.Conv2d(16, 32, 5, 1, 2), nn.ReLU(), nn.MaxPool2d(2))
        self.out = nn.Linear(32 * 7 * 7, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv2(self.conv1(x))
        return self.out(x.flatten(1))


class FastCNN(SeedCNN):
    """Seed 000's CNN, same function and parameters, laid out for the CPU (`--recipe fast`).

    Max-pooling before the ReLU gives the same result (ReLU is monotonic, so it commutes with max)
    on a quarter of the elements, and channels-last tensors let oneDNN run convolution and pooling
    without reordering: ~30% less time per training step on a 2-core CPU. The state dict is
    SeedCNN's, so checkpoints load in either.
    """

    def __init__(self) -> None:
        super().__init__()
        self.to(memory_format=torch.channels_last)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous(memory_format=torch.channels_last)
        for block in (self.conv1, self.conv2):
            conv, relu, pool = block
            x = relu(pool(conv(x)))
        return self.out(x.flatten(1))


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
        ModelSpec("fastcnn", FastCNN, "the cnn computed faster: pool before ReLU, channels-last (--recipe fast)"),
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
