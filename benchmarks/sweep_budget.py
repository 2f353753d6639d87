"""Wall time of the sweep: `dlscope sweep` (1/16/64, ≤ 60 s) and the lab's default sweep step (≤ 12 s).

.venv/bin/python benchmarks/sweep_budget.py
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "sweep"
        start = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "dlscope.cli", "sweep", "--out", str(out), "--no-progress"],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        wall = time.perf_counter() - start
        section = json.loads((out / "results.json").read_text())["sections"]["sweep"]
        print(f"dlscope sweep (1/16/64): {wall:.1f} s wall, sweep step {section['seconds']:.1f} s (budget 60 s)")
        for row in section["rows"]:
            print(
                f"  {row['config']:12} {row['samples_per_s']:9,.0f} samples/s  p50 {row['step_p50_ms']:7.2f} ms  "
                f"p95 {row['step_p95_ms']:7.2f} ms  kernels {row['kernel_pct']:3.0f}%  "
                f"{row['achieved_gflops']:5.1f} GFLOP/s ({row['pct_of_peak']:.1f}% of peak)"
            )

        lab = Path(tmp) / "lab"
        subprocess.run(
            [
                sys.executable, "-m", "dlscope.cli", "lab", "--out", str(lab), "--no-progress",
                "--no-tensorboard", "--train-subset", "2000", "--test-subset", "500", "--epochs", "1",
            ],
            check=True,
            stdout=subprocess.DEVNULL,
        )  # fmt: skip
        seconds = json.loads((lab / "results.json").read_text())["sections"]["sweep"]["seconds"]
        print(f"lab's default sweep step: {seconds:.1f} s (budget 12 s)")


if __name__ == "__main__":
    main()
