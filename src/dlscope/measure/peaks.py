"""The device's measured peaks: dense fp32 GEMM FLOP/s and memory-copy bandwidth.

Rooflines and "% of peak" figures are relative to these, measured in the same run on the same
machine, rather than to a datasheet number the machine may never reach.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch


@dataclass
class Peak:
    what: str
    value: float  # GFLOP/s or GB/s
    unit: str
    size: int
    best_seconds: float  # the fastest repeat: a peak is what the device can do, not what it usually did
    repeats: int

    def to_dict(self) -> dict:
        return asdict(self)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _best_seconds(fn: Callable[[], object], device: torch.device, repeats: int, warmup: int = 2) -> float:
    for _ in range(warmup):
        fn()
    _sync(device)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - start)
    return min(times)


def measure_gemm_peak(device: str | torch.device = "cpu", n: int = 2048, repeats: int = 5) -> Peak:
    """fp32 n×n×n matmul throughput (2·n³ FLOPs per call, the FlopCounterMode convention)."""
    device = torch.device(device)
    a = torch.randn(n, n, device=device)
    b = torch.randn(n, n, device=device)
    seconds = _best_seconds(lambda: torch.mm(a, b), device, repeats)
    return Peak("gemm_fp32", 2 * n**3 / seconds / 1e9, "GFLOP/s", n, seconds, repeats)


def measure_copy_bandwidth(device: str | torch.device = "cpu", mbytes: int = 256, repeats: int = 5) -> Peak:
    """Device-memory copy bandwidth: bytes read plus bytes written per second."""
    device = torch.device(device)
    n = mbytes * 2**20 // 4
    src = torch.randn(n, device=device)
    dst = torch.empty_like(src)
    seconds = _best_seconds(lambda: dst.copy_(src), device, repeats)
    return Peak("copy", 2 * n * 4 / seconds / 1e9, "GB/s", n * 4, seconds, repeats)
