"""Data-parallel scaling of the built-in job on this machine's cores, from real `dlscope train` runs.

Configurations, interleaved round by round so load from other processes hits each alike:
    1 rank × 1 thread, 1 rank × 2 threads, 2 ranks × 1 thread (torchrun, DDP, gloo) at several
    --bucket-cap-mb. samples/s is the train section's (training steps only: no start-up, no
evaluation); the communication shares come from the ranks' Kineto traces through the distributed
section (dlscope.observe.distributed.analysis), and the scaling table from its scaling_table.

    python benchmarks/dist_scaling.py [--rounds 3] [--train-subset 10000] [--buckets 25,0.1,0.02]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from dlscope.observe.distributed.analysis import scaling_table


def configurations(buckets: list[float]) -> list[dict[str, Any]]:
    single = [{"ranks": 1, "threads": t, "bucket_cap_mb": None} for t in (1, 2)]
    return single + [{"ranks": 2, "threads": 1, "bucket_cap_mb": b} for b in buckets]


def label(c: dict[str, Any]) -> str:
    bucket = f", bucket {c['bucket_cap_mb']:g} MB" if c["bucket_cap_mb"] is not None else ""
    return f"{c['ranks']} rank × {c['threads']} thread{bucket}"


def train(c: dict[str, Any], out: Path, args: argparse.Namespace) -> dict[str, Any]:
    argv = [sys.executable, "-m", "dlscope.cli", "train", "--out", str(out), "--threads", str(c["threads"])]
    argv += ["--model", args.model, "--epochs", "1", "--train-subset", str(args.train_subset), "--test-subset", "1000"]
    argv += ["--target-acc", "100", "--no-progress", "--no-tensorboard", "--batch-size", str(args.batch_size)]
    if c["ranks"] > 1:
        argv += ["--nproc-per-node", str(c["ranks"]), "--bucket-cap-mb", str(c["bucket_cap_mb"])]
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{label(c)} failed: {done.stderr.strip()[-400:]}")
    sections = json.loads((out / "results.json").read_text())["sections"]
    measured = {"samples_per_s": sections["train"]["samples_per_s"]}
    if "distributed" in sections:
        ranks = sections["distributed"]["ranks"]
        measured["comm_pct"] = statistics.fmean(100 * r["comm_ms"] / r["step_ms"] for r in ranks)
        measured["exposed_comm_pct"] = statistics.fmean(r["exposed_comm_pct"] for r in ranks)
        measured["overlap_pct"] = statistics.fmean(r["overlap_pct"] or 0 for r in ranks)
        measured["collectives_per_step"] = ranks[0]["collectives_per_step"]
        measured["comm_bytes_per_step"] = ranks[0]["comm_bytes_per_step"] or 0
        measured["step_ms"] = statistics.fmean(r["step_ms"] for r in ranks)
        measured["compute_ms"] = statistics.fmean(r["compute_ms"] for r in ranks)
    return measured


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--train-subset", type=int, default=10_000)
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
    for level, text in scaling["findings"]:
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
