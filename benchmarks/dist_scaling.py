"""Data-parallel scaling of the built-in job on this machine's cores, measured by the lab's scaling step.

Configurations, interleaved round by round so load from other processes hits each alike:
    1 rank × 1 thread, 1 rank × 2 threads, 2 ranks × 1 thread (torchrun, DDP, gloo) at several
    --bucket-cap-mb. Each run is dlscope.stages.scaling.measure: a short training launched by
torchrun as the job is (a one-rank run is DDP over one worker), samples/s from its train section
(training steps only: no start-up, no evaluation), the communication shares from the ranks' Kineto
traces through dlscope.analysis.ranks, and the scaling table from its scaling_table.

    python benchmarks/dist_scaling.py [--rounds 3] [--steps 78] [--buckets 25,0.1,0.02]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from dlscope.analysis.ranks import scaling_table
from dlscope.config import TrainConfig
from dlscope.options import DistOptions, RunOptions
from dlscope.report.sections.scaling import WORDS
from dlscope.report.wording import worded
from dlscope.stages.scaling import measure, short_config


def configurations(buckets: list[float]) -> list[dict[str, Any]]:
    single = [{"ranks": 1, "threads": t, "bucket_cap_mb": None} for t in (1, 2)]
    return single + [{"ranks": 2, "threads": 1, "bucket_cap_mb": b} for b in buckets]


def label(c: dict[str, Any]) -> str:
    bucket = f", bucket {c['bucket_cap_mb']:g} MB" if c["bucket_cap_mb"] is not None else ""
    return f"{c['ranks']} rank × {c['threads']} thread{bucket}"


def train(c: dict[str, Any], out: Path, args: argparse.Namespace) -> dict[str, Any]:
    config = short_config(TrainConfig(model=args.model, batch_size=args.batch_size), args.steps, c["threads"])
    dist = DistOptions(nproc_per_node=c["ranks"], bucket_cap_mb=c["bucket_cap_mb"] or DistOptions.bucket_cap_mb)
    measured = measure(config, RunOptions(), dist, out)
    return {k: v for k, v in measured.items() if k not in ("train_seconds", "wall_seconds")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=78, help="training steps of each run (78 × 128 ≈ 10,000 samples)")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--model", default="cnn")
    parser.add_argument("--buckets", default="25,0.1,0.02", help="--bucket-cap-mb values of the 2-rank runs")
    args = parser.parse_args()
    configs = configurations([float(b) for b in args.buckets.split(",")])
    runs: list[list[dict[str, Any]]] = [[] for _ in configs]
    print(f"load average before: {os.getloadavg()}", file=sys.stderr)
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(args.rounds):
            for i, c in enumerate(configs):
                runs[i].append(train(c, Path(tmp) / f"r{round_}-c{i}", args))
                print(f"round {round_ + 1}: {label(c)}: {runs[i][-1]}", file=sys.stderr)
    print(f"load average after: {os.getloadavg()}", file=sys.stderr)
    medians = [
        {**c, **{key: statistics.median(r[key] for r in rs) for key in rs[0]}}
        for c, rs in zip(configs, runs, strict=True)
    ]
    scaling = scaling_table([m for m in medians if m["bucket_cap_mb"] in (None, configs[2]["bucket_cap_mb"])])
    print("| ranks × threads | samples/s | speed-up | ideal | efficiency |")
    print("|---|---:|---:|---:|---:|")
    for row in scaling["rows"]:
        print(
            f"| {row['ranks']} × {row['threads']} | {row['samples_per_s']:,.0f} | {row['speedup']:.2f}× "
            f"| {row['ideal']:.2f}× | {row['efficiency_pct']:.0f}% |"
        )
    for level, text in worded(scaling["findings"], WORDS).items:
        print(f"\n{level}: {text}")
    columns = ["bucket_cap_mb", "all-reduces/step", "bytes/step", "samples/s", "step ms", "compute ms", "comm %"]
    print("\n| " + " | ".join([*columns, "exposed %", "overlap %"]) + " |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for m in medians:
        if m["ranks"] > 1:
            print(
                f"| {m['bucket_cap_mb']:g} | {m['collectives_per_step']:g} | {m['comm_bytes_per_step']:,.0f} "
                f"| {m['samples_per_s']:,.0f} "
                f"| {m['step_ms']:.1f} | {m['compute_ms']:.1f} | {m['comm_pct']:.1f} | {m['exposed_comm_pct']:.1f} "
                f"| {m['overlap_pct']:.0f} |"
            )
    print("\nper round:", json.dumps(runs))


if __name__ == "__main__":
    main()
