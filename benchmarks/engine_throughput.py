"""Engine throughput against a bare PyTorch loop: same tensors, model, batch size, optimizer and
schedule; the engine with TensorBoard scalars on. Interleaved repeats, median of the ratios.

    python benchmarks/engine_throughput.py [--repeats 5] [--samples 20000]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time

import torch
import torch.nn.functional as F

from dlscope.data.loaders import ResidentBatches
from dlscope.data.mnist import load_mnist
from dlscope.instruments.tensorboard import TensorBoardObserver
from dlscope.models import build_model
from dlscope.train import TrainConfig, Trainer, make_optimizer, make_scheduler, seed_everything


def bare_loop(config: TrainConfig, images, labels) -> float:
    """The loop a user would write by hand over the same resident batches: seconds for one epoch."""
    seed_everything(config.seed)
    model = build_model(config.model)
    batches = ResidentBatches(images, labels, config.batch_size, seed=config.seed)
    optimizer = make_optimizer(config, model)
    scheduler = make_scheduler(config, optimizer, len(batches))
    start = time.perf_counter()
    for x, y in batches:
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        scheduler.step()
    return time.perf_counter() - start


def engine(config: TrainConfig, data, log_dir: str) -> float:
    trainer = Trainer(config, data, [TensorBoardObserver(log_dir, graph=False)])
    return trainer.fit().train_seconds


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--samples", type=int, default=20000)
    parser.add_argument("--batch-size", type=int, default=128)
    args = parser.parse_args()
    torch.set_num_threads(2)
    data = load_mnist()
    config = TrainConfig(epochs=1, batch_size=args.batch_size, train_subset=args.samples, test_subset=500)
    images, labels = data.train_images[: args.samples], data.train_labels[: args.samples]
    bare_loop(config, images, labels)  # warm-up: first-call initialisation of oneDNN kernels
    ratios, bare_times, engine_times = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats):
            b = bare_loop(config, images, labels)
            e = engine(config, data, f"{tmp}/tb{i}")
            bare_times.append(b)
            engine_times.append(e)
            ratios.append(b / e)  # throughput ratio engine ÷ bare
            print(
                f"repeat {i + 1}: bare {args.samples / b:,.0f} samples/s, engine {args.samples / e:,.0f} "
                f"samples/s, ratio {b / e:.3f}",
                flush=True,
            )
    summary = {
        "samples": args.samples,
        "batch_size": args.batch_size,
        "repeats": args.repeats,
        "bare_samples_per_s_median": args.samples / statistics.median(bare_times),
        "engine_samples_per_s_median": args.samples / statistics.median(engine_times),
        "throughput_ratio_median": statistics.median(ratios),
        "throughput_ratios": ratios,
    }
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
