"""Keras 3 on the torch backend: a small MLP fitted on MNIST with model.fit, then saved.
No torch optimizer runs: Keras has its own, which its train_step runs under torch.no_grad() after
backward(). With --truth, the script times each of its optimizer's `apply` calls itself and
prints them (a TRUTH line)."""

import argparse
import os
import time

os.environ.setdefault("KERAS_BACKEND", "torch")

import keras
import numpy as np

import dlscope


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=320)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--validation", action="store_true", help="validate on 64 more images after each epoch")
    parser.add_argument("--truth", action="store_true", help="time the optimizer's apply calls and print them")
    args = parser.parse_args()
    mnist = dlscope.load_mnist()
    n = args.n + 64 * args.validation
    x = mnist.train_images[:n].numpy().reshape(n, 784).astype(np.float32) / 255.0
    y = mnist.train_labels[:n].numpy()
    model = keras.Sequential([keras.Input((784,)), keras.layers.Dense(64, activation="relu"), keras.layers.Dense(10)])
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    validation = (x[args.n :], y[args.n :]) if args.validation else None
    apply_ms = timed_apply() if args.truth else []
    model.fit(
        x[: args.n], y[: args.n], batch_size=args.batch_size, epochs=args.epochs, validation_data=validation, verbose=0
    )
    print(f"fitted {args.epochs} epochs of {args.n // args.batch_size} batches")
    if args.truth:
        print(f"TRUTH steps={len(apply_ms)} step_apply_ms={','.join(f'{ms:.4f}' for ms in apply_ms)}")


def timed_apply() -> list[float]:
    """Keras's optimizers' `apply` timed by this script's own clock (a list filled as fit runs)."""
    from keras.src.optimizers.base_optimizer import BaseOptimizer

    spent: list[float] = []
    apply = BaseOptimizer.apply

    def timed(self, *args, **kwargs):
        start = time.perf_counter()
        try:
            return apply(self, *args, **kwargs)
        finally:
            spent.append((time.perf_counter() - start) * 1e3)

    BaseOptimizer.apply = timed
    return spent


if __name__ == "__main__":
    main()
