"""What TensorBoard logging adds to training: the lab's train step (one epoch of the default cnn
on the full MNIST) with and without TensorBoardObserver, whose extra work is the graph trace, the
image grid, the scalars and the test set evaluated once more at step 0. Interleaved repeats,
whole fit() wall time, median ratio.

    python benchmarks/tensorboard_cost.py [--repeats 3] [--train-subset N]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from dlscope.data.mnist import load_mnist
from dlscope.instruments.tensorboard import TensorBoardObserver
from dlscope.train import TrainConfig, Trainer, evaluate


def fit_seconds(config: TrainConfig, data, log_dir: Path | None) -> float:
    observers = [TensorBoardObserver(log_dir)] if log_dir else []
    trainer = Trainer(config, data, observers)
    start = time.perf_counter()
    trainer.fit()  # on_train_begin (graph, images, the step-0 evaluation) runs inside
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--train-subset", type=int, default=None)
    args = parser.parse_args()
    torch.set_num_threads(2)
    data = load_mnist()
    config = TrainConfig(epochs=1, train_subset=args.train_subset, target_acc=None)
    times: dict[str, list[float]] = {"without": [], "with TensorBoard": []}
    evals = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats):
            times["without"].append(fit_seconds(config, data, None))
            times["with TensorBoard"].append(fit_seconds(config, data, Path(tmp) / f"tb{i}"))
            trainer = Trainer(config, data)
            start = time.perf_counter()
            evaluate(trainer.model, trainer.test_images, trainer.test_labels, config.test_batch_size)
            evals.append(time.perf_counter() - start)
    ratios = [w / wo for w, wo in zip(times["with TensorBoard"], times["without"], strict=True)]
    print(
        json.dumps(
            {
                "median_seconds": {k: round(statistics.median(v), 2) for k, v in times.items()},
                "ratio_per_round": [round(r, 3) for r in ratios],
                "median_ratio": round(statistics.median(ratios), 3),
                "step0_test_eval_seconds": round(statistics.median(evals), 2),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
