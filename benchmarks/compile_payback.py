"""torch.compile's pay-back for the tuner's models: compile time measured, compiled against eager steps.

Per model, in its tuned layout (channels-last, pool first) at one thread: the first compiled
training step less an eager one is the compile time (forward and backward); then compiled and
eager steps interleaved (measure.timing). Break-even: the steps a run needs after the compile for
the saving to cover it — what `autotune.COMPILE_MIN_SECONDS` and `COMPILE_MAX_GAIN` rest on.

    .venv/bin/python benchmarks/compile_payback.py
"""

from __future__ import annotations

import argparse
import os

import torch

from dlscope.data.loaders import normalise
from dlscope.data.mnist import load_mnist
from dlscope.measure.timing import Contender, time_interleaved
from dlscope.models import Layout, build_model
from dlscope.train import TrainConfig, make_optimizer, train_step


def payback(name: str, batches: list, steps: int) -> str:
    """One model: its compile time, eager and compiled steps, and the break-even point."""
    load = os.getloadavg()[0]
    torch.manual_seed(0)
    model = build_model(name)
    model.set_layout(Layout(("onednn-cl",) * len(model.blocks), pool_first=True))
    optimizer = make_optimizer(TrainConfig(), model)
    compiled = torch.compile(model)
    state = {"i": 0}

    def step(module: torch.nn.Module) -> None:
        x, y = batches[state["i"] % len(batches)]
        state["i"] += 1
        train_step(module, optimizer, x, y)

    eager, fast = Contender("eager", lambda: step(model)), Contender("compiled", lambda: step(compiled))
    time_interleaved([eager, fast], steps, 4, warmup=2)
    compile_s = fast.cold_s - eager.median_s
    saving = eager.median_s - fast.median_s
    even = f"{compile_s / saving:,.0f} steps" if saving > 0 else "never (compiled steps are not shorter)"
    return (
        f"{name}: compile {compile_s:.1f} s; step {eager.median_s * 1e3:.1f} ms eager, "
        f"{fast.median_s * 1e3:.1f} ms compiled ({100 * saving / eager.median_s:+.1f}% of a step saved); "
        f"break-even after {even}; load {load:.1f} → {os.getloadavg()[0]:.1f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="small,cnn")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    data = load_mnist()
    b = 128
    batches = [(normalise(data.train_images[i : i + b]), data.train_labels[i : i + b]) for i in range(0, 8 * b, b)]
    print(f"CPU capability {torch.backends.cpu.get_cpu_capability()}, {args.threads} thread(s)")
    for name in args.models.split(","):
        print(payback(name, batches, args.steps), flush=True)


if __name__ == "__main__":
    main()
