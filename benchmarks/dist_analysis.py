"""The per-rank analysis on real `dlscope run -- torchrun` jobs (tests/scripts/ddp_mnist.py, 2 ranks,
gloo): how small an injected delay the straggler detection names, and what the analysis costs
against loading the same traces in HolisticTraceAnalysis (interleaved rounds, medians).

    .venv/bin/python benchmarks/dist_analysis.py [--delays 0,2,5,15,30] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

from dlscope.analysis.ranks import analyze_ranks

SCRIPT = Path(__file__).resolve().parent.parent / "tests" / "scripts" / "ddp_mnist.py"


def observed_job(out: Path, delay_ms: float) -> dict:
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    argv = [sys.executable, "-m", "dlscope.cli", "run", "--out", str(out), "--profile-steps", "5", "--"]
    argv += [*torchrun, str(SCRIPT), "--train", "640", "--slow-rank", "1", "--slow-ms", str(delay_ms)]
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"delay {delay_ms} ms failed: {done.stderr.strip()[-400:]}")
    return json.loads((out / "results.json").read_text())["sections"]


def hta_load(directory: Path) -> None:
    from hta.trace_analysis import TraceAnalysis

    TraceAnalysis(trace_dir=str(directory)).get_comm_comp_overlap(visualize=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--delays", default="0,2,5,15,30", help="ms rank 1 sleeps in each step")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    print(f"load average before: {os.getloadavg()}", file=sys.stderr)
    with tempfile.TemporaryDirectory() as tmp:
        print("| delay ms | named | last at | median lead ms | mean step ms | rank 0 exposed comm ms |")
        print("|---:|---|---:|---:|---:|---:|")
        for delay in [float(d) for d in args.delays.split(",")]:
            out = Path(tmp) / f"d{delay:g}"
            section = observed_job(out, delay)["distributed"]
            named = section["stragglers"]["straggler"]
            by_rank = {r["rank"]: r for r in section["stragglers"]["by_rank"]}
            leads = [c["gap_ms"] for c in section["stragglers"]["collectives"] if c["last_rank"] == 1]
            print(
                f"| {delay:g} | {'rank ' + str(named['rank']) if named else 'none'} "
                f"| {by_rank[1]['last']}/{by_rank[1]['of']} | {statistics.median(leads) if leads else 0:.1f} "
                f"| {section['stragglers']['mean_step_ms']:.1f} | {section['ranks'][0]['exposed_comm_ms']:.1f} |"
            )
        traces = {int(rank): out / path for rank, path in section["traces"].items()}
        megabytes = sum(p.stat().st_size for p in traces.values()) / 1e6
        ours, theirs = [], []
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for _ in range(args.rounds):
                start = time.perf_counter()
                analyze_ranks(traces)
                ours.append(time.perf_counter() - start)
                start = time.perf_counter()
                hta_load(next(iter(traces.values())).parent)
                theirs.append(time.perf_counter() - start)
    print(f"load average after: {os.getloadavg()}", file=sys.stderr)
    a, h = statistics.median(ours), statistics.median(theirs)
    print(
        f"\n{len(traces)} traces, {megabytes:.1f} MB: analyze_ranks {a:.3f} s, HTA load + overlap {h:.3f} s "
        f"(median of {args.rounds} interleaved rounds; ratio {a / h:.2f}×)"
    )


if __name__ == "__main__":
    main()
