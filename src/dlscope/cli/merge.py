"""dlscope merge RUN_DIR... --out DIR: one job's run directories, one per machine, as one analysis."""

from __future__ import annotations

import argparse


def cmd_merge(args: argparse.Namespace) -> int:
    from dlscope.options import MergeOptions, RunOptions, StepOptions
    from dlscope.runner import Plan, run_command

    merge = MergeOptions(list(args.runs), threads=args.threads)
    plan = Plan("merge", ["merge"], options=RunOptions(out=args.out), step_options=StepOptions(merge=merge))
    return 0 if run_command(plan)["run"]["status"] == "ok" else 1


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "merge",
        help="join the run directories of one job's launchers (one per machine) into one analysis: "
        "every rank's steps as Parquet, stragglers, clock offsets, a hang across hosts",
    )
    p.add_argument(
        "runs",
        nargs="+",
        metavar="RUN_DIR",
        help="a launcher's `dlscope run` directory, a job directory of several (its hosts/), or an earlier merge",
    )
    p.add_argument("--out", default=None, help="run directory (default runs/merge-<time>)")
    p.add_argument(
        "--threads", type=int, default=None, metavar="N", help="threads that write and query (default: every core)"
    )
    p.set_defaults(func=cmd_merge)
