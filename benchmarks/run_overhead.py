"""Overhead of `dlscope run` on a training script: the script bare vs under `dlscope run` with
the default profiler schedule (8 profiled steps after the first, then the profiler is off),
interleaved round by round so machine noise hits both alike. Medians and ratios for two spans:
  - command: the script's own wall time (bare: the subprocess; observed: results.json's
    run.wall_seconds, start to exit of the command under the bootstrap and hooks);
  - whole: the whole `dlscope run` process, analysis, timeline and report included.

    .venv/bin/python benchmarks/run_overhead.py [--rounds 3] [--train 1920] [--epochs 1]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "tests" / "scripts" / "mnist_basic.py"


def timed(argv: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--train", type=int, default=1920, help="training images (default 1920: 30 steps of 64)")
    parser.add_argument("--epochs", type=int, default=1)
    args = parser.parse_args()
    script = [sys.executable, str(SCRIPT), "--train", str(args.train), "--test", "500", "--epochs", str(args.epochs)]
    bare, command, whole, steps = [], [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.rounds):
            bare.append(timed(script))
            out = Path(tmp) / f"run-{i}"
            whole.append(timed([sys.executable, "-m", "dlscope.cli", "run", "--out", str(out), "--", *script]))
            results = json.loads((out / "results.json").read_text())
            command.append(results["sections"]["run"]["wall_seconds"])
            steps.append(results["sections"]["steps"]["count"])
            cost = results["sections"]["top10"]["profiled_cost"]
            print(
                f"round {i + 1}: bare {bare[-1]:.2f} s, command {command[-1]:.2f} s, whole {whole[-1]:.2f} s; "
                f"{steps[-1]} steps, profiled step {cost.get('ratio')}× an unprofiled one"
            )
    median = statistics.median
    print(f"bare median {median(bare):.2f} s over {args.rounds} rounds ({steps[0]} steps)")
    print(f"command under dlscope run: {median(command):.2f} s = {median(command) / median(bare):.3f}× bare")
    print(f"whole dlscope run process: {median(whole):.2f} s = {median(whole) / median(bare):.3f}× bare")


if __name__ == "__main__":
    main()
