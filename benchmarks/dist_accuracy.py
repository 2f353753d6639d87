"""Issue 12's accuracy criterion: `dlscope train --nproc-per-node 2` on the whole of MNIST reaches
the test accuracy of one process with the same global batch, within ±0.15 percentage points.

Both train every epoch (--target-acc 100: no early stop) so the final accuracies compare the same
schedule; one process uses both cores (--threads 2), each rank one.

    python benchmarks/dist_accuracy.py [--epochs 2] [--model cnn] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

TOLERANCE_PP = 0.15


def train(out: Path, extra: list[str], args: argparse.Namespace) -> dict:
    argv = [sys.executable, "-m", "dlscope.cli", "train", "--out", str(out), "--epochs", str(args.epochs)]
    argv += ["--model", args.model, "--target-acc", "100", "--no-progress", "--no-tensorboard", *extra]
    done = subprocess.run(argv, capture_output=True, text=True, env=dict(os.environ, COLUMNS="80"))
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed: {done.stderr.strip()[-400:]}")
    (out / "terminal.txt").write_text(done.stdout)  # what the command printed, at 80 columns
    results = json.loads((out / "results.json").read_text())
    train = results["sections"]["train"]
    return {
        "test_acc": train["final_test_acc"],
        "samples_per_s": train["samples_per_s"],
        "wall_s": results["run"]["wall_seconds"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--model", default="cnn")
    parser.add_argument("--keep", default=None, metavar="DIR", help="keep both run directories here")
    args = parser.parse_args()
    print(f"load average before: {os.getloadavg()}", file=sys.stderr)
    with tempfile.TemporaryDirectory() as tmp:
        where = Path(args.keep or tmp)
        one = train(where / "one", ["--threads", "2"], args)
        two = train(where / "two", ["--nproc-per-node", "2"], args)
    print(f"load average after: {os.getloadavg()}", file=sys.stderr)
    gap = two["test_acc"] - one["test_acc"]
    print("| run | test accuracy | samples/s | wall s |")
    print("|---|---:|---:|---:|")
    print(f"| 1 process × 2 threads | {one['test_acc']:.2f}% | {one['samples_per_s']:,.0f} | {one['wall_s']:.0f} |")
    print(f"| 2 ranks × 1 thread | {two['test_acc']:.2f}% | {two['samples_per_s']:,.0f} | {two['wall_s']:.0f} |")
    verdict = "within" if abs(gap) <= TOLERANCE_PP else "OUTSIDE"
    print(f"\ndifference {gap:+.2f} pp: {verdict} ±{TOLERANCE_PP} pp")


if __name__ == "__main__":
    main()
