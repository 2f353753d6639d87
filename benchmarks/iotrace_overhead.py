"""Overhead of each `dlscope trace` backend on the lab's training, measured in one run.

Runs `dlscope train` (one epoch on the full MNIST training set, no TensorBoard) untraced and
under every available backend, interleaved round by round so machine noise hits all alike, and
reports the median wall time of each and its ratio to untraced. Only collection is timed: the
analysis after a traced run is not part of the command's slowdown.

    .venv/bin/python benchmarks/iotrace_overhead.py [--rounds 3] [--epochs 1]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

from dlscope.observe.iotrace.tracer import BACKENDS, availability, timed_run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=1)
    args = parser.parse_args()
    usable = [b for b, why in availability().items() if why is None]
    for backend in BACKENDS:
        if backend not in usable:
            print(f"{backend}: skipped ({availability()[backend]})")
    times: dict[str, list[float]] = {"untraced": [], **{b: [] for b in usable}}
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(args.rounds):
            for variant in times:
                run_dir = Path(tmp) / f"run-{variant}-{round_}"
                argv = [sys.executable, "-m", "dlscope.cli", "train", "--epochs", str(args.epochs)]
                argv += ["--target-acc", "100", "--no-tensorboard", "--no-progress", "--out", str(run_dir)]
                backend = None if variant == "untraced" else variant
                seconds = timed_run(argv, backend, Path(tmp) / f"trace-{variant}-{round_}")
                times[variant].append(seconds)
                print(f"round {round_ + 1}: {variant:9} {seconds:6.2f} s", flush=True)
    base = statistics.median(times["untraced"])
    print("\n| variant | runs (s) | median (s) | × untraced |\n|---|---|---:|---:|")
    for variant, runs in times.items():
        median = statistics.median(runs)
        print(f"| {variant} | {', '.join(f'{t:.2f}' for t in runs)} | {median:.2f} | {median / base:.3f} |")


if __name__ == "__main__":
    main()
