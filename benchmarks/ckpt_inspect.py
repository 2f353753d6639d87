"""How long `dlscope ckpt inspect` takes next to `torch.load(weights_only=True)` on the same file.

Two checkpoints: a large one (few big tensors: the cost is I/O) and a wide one (many small
tensors: the cost is the pickle, which dlscope reads with the pure-Python restricted unpickler).
Runs are interleaved (a, b, a, b, …) and the median is reported, so load from other processes on
a shared machine hits both sides alike.

    python benchmarks/ckpt_inspect.py [--large-mb 512] [--wide-tensors 20000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from dlscope.ckpt.inspect import inspect_checkpoint


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def interleaved(cases: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(repeats):
        for name, fn in cases.items():
            times[name].append(timed(fn))
    return {name: statistics.median(ts) for name, ts in times.items()}


def large_state(megabytes: int) -> dict:
    # an Adam checkpoint of a model with 1024×1024 float32 layers: weights + exp_avg + exp_avg_sq
    layers = max(1, megabytes // 12)
    model = {f"layer{i}.weight": torch.randn(1024, 1024) for i in range(layers)}
    state = {i: {"exp_avg": torch.randn(1024, 1024), "exp_avg_sq": torch.rand(1024, 1024)} for i in range(layers)}
    return {"model": model, "optimizer": {"state": state, "param_groups": [{"lr": 1e-3, "params": list(state)}]}}


def wide_state(tensors: int) -> dict:
    return {"model": {f"block{i // 8}.p{i % 8}": torch.randn(16) for i in range(tensors)}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--large-mb", type=int, default=512)
    parser.add_argument("--wide-tensors", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        files = {"large": Path(tmp) / "large.pt", "wide": Path(tmp) / "wide.pt"}
        torch.save(large_state(args.large_mb), files["large"])
        torch.save(wide_state(args.wide_tensors), files["wide"])
        for name, path in files.items():
            anatomy = inspect_checkpoint(path)
            print(f"{name}: {path.stat().st_size / 2**20:,.1f} MiB, {len(anatomy.tensors):,} tensors")
            medians = interleaved(
                {
                    "torch.load(weights_only=True)": lambda p=path: torch.load(p, weights_only=True),
                    "torch.load(weights_only=True, mmap=True)": lambda p=path: torch.load(
                        p, weights_only=True, mmap=True
                    ),
                    "dlscope inspect": lambda p=path: inspect_checkpoint(p),
                    "dlscope inspect --stats": lambda p=path: inspect_checkpoint(p, stats=True),
                },
                args.repeats,
            )
            base = medians["torch.load(weights_only=True)"]
            for case, seconds in medians.items():
                print(f"  {case:42} {seconds * 1000:9.1f} ms  {seconds / base:5.2f}× torch.load")


if __name__ == "__main__":
    main()
