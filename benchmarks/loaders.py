"""Resident batches against the classic DataLoader (0 and 2 workers): one pass over the
training set, data only (no model), interleaved repeats, medians.

    python benchmarks/loaders.py [--repeats 3] [--batch-size 128]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from dlscope.data.loaders import ResidentBatches, TorchLoaderBatches
from dlscope.data.mnist import load_mnist


def one_pass(batches) -> float:
    start = time.perf_counter()
    for x, _ in batches:
        x.sum()  # touch the batch as a consumer would
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=128)
    args = parser.parse_args()
    torch.set_num_threads(2)
    data = load_mnist()
    images, labels = data.train_images, data.train_labels
    sources = {
        "resident": lambda: ResidentBatches(images, labels, args.batch_size),
        "torch, 0 workers": lambda: TorchLoaderBatches(images, labels, args.batch_size, workers=0),
        "torch, 2 workers": lambda: TorchLoaderBatches(images, labels, args.batch_size, workers=2),
    }
    times: dict[str, list[float]] = {name: [] for name in sources}
    for _ in range(args.repeats):
        for name, make in sources.items():
            times[name].append(one_pass(make()))
    n = len(labels)
    summary = {
        name: {"median_seconds": round(statistics.median(t), 3), "samples_per_s": round(n / statistics.median(t))}
        for name, t in times.items()
    }
    base = statistics.median(times["resident"])
    for name, t in times.items():
        summary[name]["slowdown_vs_resident"] = round(statistics.median(t) / base, 1)
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
