"""`--recipe fast`: wall time to 99% test accuracy, data loading included, over several seeds.

Each seed runs the fast recipe and, interleaved with it, the default recipe, so a busy machine
slows both alike and the ratio stays meaningful. Both run as a user would run them: torch's
default threads, unless --threads; the fast recipe then picks its own by measuring (--autotune).
Time runs from before MNIST is read (and its checksums verified) to the end of the first
evaluation that reaches the target, the autotuner's measuring included.

    .venv/bin/python benchmarks/fast_recipe.py --seeds 1,2,3,4,5
    ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 .venv/bin/python benchmarks/fast_recipe.py  # AVX2 kernels
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from dlscope.autotune import autotune
from dlscope.data.mnist import load_mnist
from dlscope.train import StopAtAccuracy, TrainConfig, Trainer

TARGET = 99.0


def time_to_target(recipe: str, seed: int, threads: int | None) -> dict:
    threads_before = torch.get_num_threads()  # the autotuner may change them: each run starts alike
    start, cpu_start = time.perf_counter(), time.process_time()
    data = load_mnist()
    config = TrainConfig.from_recipe(recipe, seed=seed, threads=threads, target_acc=TARGET)
    result = Trainer(config, data, [StopAtAccuracy(TARGET)], tuner=autotune if config.autotune else None).fit()
    seconds = time.perf_counter() - start
    torch.set_num_threads(threads_before)
    tune = result.autotune or {}
    return {
        "recipe": recipe,
        "seed": seed,
        "model": config.model,
        "accuracy": result.final.test_acc,
        "epochs": len(result.epochs),
        "steps": result.steps,
        "reached": result.target_reached_epoch is not None,
        "seconds": seconds,
        "chosen": tune.get("chosen", "—"),
        "tune_cost_s": tune.get("cost_s", 0.0),
        "compile": (tune.get("compile") or {}).get("reason", "—"),
        "cpu_seconds": time.process_time() - cpu_start,
        "train_seconds": result.train_seconds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="1,2,3,4,5")
    parser.add_argument("--threads", type=int, default=None, help="default: torch's (and the autotuner's) choice")
    parser.add_argument("--compare", default="default", help="recipe to interleave with (none: skip)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"CPU capability {torch.backends.cpu.get_cpu_capability()}, {torch.get_num_threads()} threads", flush=True)
    recipes = ["fast"] + ([args.compare] if args.compare != "none" else [])
    runs = []
    for seed in (int(s) for s in args.seeds.split(",")):
        for recipe in recipes:
            run = time_to_target(recipe, seed, args.threads)
            runs.append(run)
            print(
                f"{run['recipe']:8} seed {seed}: {run['accuracy']:.2f}% at step {run['steps']} "
                f"({run['epochs']} epoch(s)), {run['seconds']:.1f} s to target "
                f"(training {run['train_seconds']:.1f} s), "
                f"{run['cpu_seconds']:.1f} s CPU; layout: {run['chosen']} (tuning cost {run['tune_cost_s']:.1f} s, "
                f"{100 * run['tune_cost_s'] / run['seconds']:.1f}% of the run)"
                + ("" if run["reached"] else "  TARGET NOT REACHED"),
                flush=True,
            )
    for run in runs:
        if run["recipe"] == "fast":
            print(f"seed {run['seed']} torch.compile: {run['compile']}")
    for recipe in recipes:
        mine = [r for r in runs if r["recipe"] == recipe]
        seconds = [r["seconds"] for r in mine]
        print(
            f"{recipe}: {sum(r['reached'] for r in mine)}/{len(mine)} seeds ≥ {TARGET}% "
            f"(min {min(r['accuracy'] for r in mine):.2f}%), median {statistics.median(seconds):.1f} s, "
            f"range {min(seconds):.1f}–{max(seconds):.1f} s; "
            f"median CPU {statistics.median(r['cpu_seconds'] for r in mine):.1f} s"
        )
    if len(recipes) == 2:
        ratios = [a["seconds"] / b["seconds"] for a, b in zip(runs[::2], runs[1::2], strict=True)]
        print(f"fast / {recipes[1]} time ratio per seed: {', '.join(f'{r:.2f}' for r in ratios)}")


if __name__ == "__main__":
    main()
