"""Overhead of each `dlscope trace` backend on the lab's training, measured in one run.

Runs `dlscope train` untraced and under every available backend, interleaved round by round so
machine noise hits all alike, and reports medians and their ratio to untraced, for two spans:
the training loop itself (`train_seconds` from the run's results.json: the lab's training) and
the whole command (start-up and imports included, where tracing costs most: ~30,000 file
syscalls before the first training step). Only collection is timed: the analysis after a
traced run is not part of the command's slowdown.

Then the cost of one traced file syscall, which noise on a shared machine hides far less: a
loop of `os.stat` calls timed inside the traced process, untraced and under each backend.

    .venv/bin/python benchmarks/iotrace_overhead.py [--rounds 3] [--train-subset 12000] [--calls 20000]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

from dlscope.options import TRACE_BACKENDS as BACKENDS
from dlscope.supervise.iotrace.tracer import availability, timed_run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--train-subset", type=int, default=12000, help="training images per run (default 12000)")
    parser.add_argument("--calls", type=int, default=20000, help="os.stat calls per per-syscall run")
    parser.add_argument("--skip-training", action="store_true", help="only the per-syscall cost")
    args = parser.parse_args()
    usable = [b for b, why in availability().items() if why is None]
    for backend in BACKENDS:
        if backend not in usable:
            print(f"{backend}: skipped ({availability()[backend]})")
    variants = ["untraced", *usable]
    if not args.skip_training:
        training_overhead(variants, args)
    syscall_cost(variants, args)


def syscall_cost(variants: list[str], args: argparse.Namespace) -> None:
    per_call: dict[str, list[float]] = {v: [] for v in variants}
    with tempfile.TemporaryDirectory() as tmp:
        loop = Path(tmp) / "stat_loop.py"
        loop.write_text(STAT_LOOP)
        for round_ in range(args.rounds):
            for variant in variants:
                result = Path(tmp) / f"{variant}-{round_}.txt"
                argv = [sys.executable, str(loop), str(args.calls), str(result)]
                timed_run(argv, None if variant == "untraced" else variant, Path(tmp) / f"trace-{variant}-{round_}")
                per_call[variant].append(float(result.read_text()) / args.calls)
    base = statistics.median(per_call["untraced"])
    print("\n| variant | µs per os.stat (runs) | median µs | + µs per traced call |\n|---|---|---:|---:|")
    for variant, runs in per_call.items():
        median = statistics.median(runs)
        cells = ", ".join(f"{t * 1e6:.2f}" for t in runs)
        print(f"| {variant} | {cells} | {median * 1e6:.2f} | {(median - base) * 1e6:+.2f} |")


STAT_LOOP = """
import os, sys, time
n, out = int(sys.argv[1]), sys.argv[2]
start = time.perf_counter()
for _ in range(n):
    os.stat(sys.executable)
open(out, "w").write(str(time.perf_counter() - start))
"""


def training_overhead(variants: list[str], args: argparse.Namespace) -> None:
    command: dict[str, list[float]] = {v: [] for v in variants}
    training: dict[str, list[float]] = {v: [] for v in variants}
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(args.rounds):
            for variant in variants:
                run_dir = Path(tmp) / f"run-{variant}-{round_}"
                argv = [sys.executable, "-m", "dlscope.cli", "train", "--epochs", "1", "--target-acc", "100"]
                argv += ["--train-subset", str(args.train_subset), "--no-tensorboard", "--no-progress"]
                argv += ["--out", str(run_dir)]
                backend = None if variant == "untraced" else variant
                command[variant].append(timed_run(argv, backend, Path(tmp) / f"trace-{variant}-{round_}"))
                results = json.loads((run_dir / "results.json").read_text())
                training[variant].append(results["sections"]["train"]["train_seconds"])
                print(
                    f"round {round_ + 1}: {variant:9} training {training[variant][-1]:6.2f} s, "
                    f"command {command[variant][-1]:6.2f} s",
                    file=sys.stderr,
                    flush=True,
                )
    print("| variant | training runs (s) | × untraced | command runs (s) | × untraced |")
    print("|---|---|---:|---|---:|")
    for variant in variants:
        cells = []
        for times in (training, command):
            median, base = statistics.median(times[variant]), statistics.median(times["untraced"])
            cells += [", ".join(f"{t:.2f}" for t in times[variant]), f"{median / base:.3f}"]
        print(f"| {variant} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
