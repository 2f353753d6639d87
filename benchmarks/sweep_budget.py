"""Time budgets of the sweep: `dlscope sweep` (1/16/64 table, ≤ 60 s) and the lab's default step (≤ 12 s).

Both wall time and CPU time are printed: on a shared machine the wall time depends on the
neighbours, while CPU time ÷ threads bounds what the same work takes on an idle one.

    .venv/bin/python benchmarks/sweep_budget.py
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from dlscope.data.mnist import load_mnist
from dlscope.options import RunOptions
from dlscope.rundir import RunDir
from dlscope.stages.base import Context
from dlscope.stages.sweep import STEP
from dlscope.train import TrainConfig


def children_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "sweep"
        start, cpu_start = time.perf_counter(), children_cpu_seconds()
        subprocess.run(
            [sys.executable, "-m", "dlscope.cli", "sweep", "--out", str(out), "--no-progress"],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        wall, cpu = time.perf_counter() - start, children_cpu_seconds() - cpu_start
        section = json.loads((out / "results.json").read_text())["sections"]["sweep"]
        print(f"dlscope sweep (1/16/64): {wall:.1f} s wall, {cpu:.1f} s CPU; sweep step {section['seconds']:.1f} s")
        for row in section["rows"]:
            print(
                f"  {row['config']:12} {row['samples_per_s']:9,.0f} samples/s  p50 {row['step_p50_ms']:7.2f} ms  "
                f"p95 {row['step_p95_ms']:7.2f} ms  kernels {row['kernel_pct']:3.0f}%  "
                f"{row['achieved_gflops']:5.1f} GFLOP/s ({row['pct_of_peak']:.1f}% of peak)"
            )

        ctx = Context(
            config=TrainConfig(),
            run=RunDir(Path(tmp) / "lab", "lab"),
            options=RunOptions(progress=False),
            data=load_mnist(),
        )
        start, cpu_start = time.perf_counter(), time.process_time()
        STEP.run(ctx)
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu_start
        print(
            f"lab's default sweep step: {wall:.1f} s wall, {cpu:.1f} s CPU on {torch.get_num_threads()} threads "
            "(budget 12 s)"
        )


if __name__ == "__main__":
    main()
