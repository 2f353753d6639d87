"""What eats the batches: a real training step, or a fixed simulated compute time per batch.

The simulated consumer is DLIO's `computation_time`: it sleeps, so the host CPU is free for the
readers while "the accelerator" computes — the input-bound and compute-bound regimes can both be
produced on a CPU-only machine by choosing the time per batch.
"""

from __future__ import annotations

import time

import torch

from dlscope.data.loaders import normalise
from dlscope.errors import ConfigError
from dlscope.experiments.pipeline.readers import Batch
from dlscope.models import build_model
from dlscope.train import resolve_device, train_step

MNIST_SAMPLE_BYTES = 28 * 28


class SimulatedCompute:
    """A fixed compute time per batch, slept (the GIL and the CPU are released meanwhile)."""

    pin_memory = False

    def __init__(self, seconds_per_batch: float) -> None:
        if seconds_per_batch < 0:
            raise ConfigError("simulated compute time must be ≥ 0")
        self.seconds = seconds_per_batch
        self.name = f"simulated {seconds_per_batch * 1000:g} ms/batch"

    def __call__(self, batch: Batch) -> None:
        time.sleep(self.seconds)


class TrainingCompute:
    """The real training step (forward, backward, Adam) of a model from the zoo.

    Batches arrive as uint8 and are normalised on the device: a quarter of the bytes of float32
    cross the host-device link. On CUDA the copy is asynchronous from pinned memory and the step
    ends with a synchronisation, so the time measured is the time the GPU took.
    """

    def __init__(
        self,
        model: str,
        device: str = "auto",
        sample_bytes: int = MNIST_SAMPLE_BYTES,
        seed: int = 0,
        threads: int | None = None,
    ):
        if sample_bytes != MNIST_SAMPLE_BYTES:
            raise ConfigError(
                f"the training consumer needs 28×28 samples ({MNIST_SAMPLE_BYTES} bytes), these have {sample_bytes}; "
                "use a simulated compute time instead"
            )
        self.device = resolve_device(device)
        if threads is not None:
            torch.set_num_threads(threads)
        torch.manual_seed(seed)
        self.model = build_model(model).to(self.device)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=1e-3)
        self.name = f"train {model} on {self.device.type}"

    @property
    def pin_memory(self) -> bool:
        return self.device.type == "cuda"

    def __call__(self, batch: Batch) -> None:
        x = batch.x.to(self.device, non_blocking=True)
        y = batch.label.to(self.device, non_blocking=True)
        train_step(self.model, self.optimizer, normalise(x.view(-1, 28, 28)), y)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


Consumer = SimulatedCompute | TrainingCompute
