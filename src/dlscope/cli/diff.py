"""dlscope diff RUN_A RUN_B: where step time went between two runs of `dlscope run`."""

from __future__ import annotations

import argparse

from dlscope.options import FileOptions
from dlscope.runner import answer


def cmd_diff(args: argparse.Namespace) -> int:
    return answer("diff", FileOptions([args.run_a, args.run_b], json=args.json, limit=args.limit))


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "diff",
        help="where step time went between two runs of `dlscope run`: part by part with noise bands, "
        "operators, system calls and files; exit 1 when the step time changed beyond noise",
    )
    p.add_argument(
        "run_a", metavar="RUN_A", help="the baseline: a run directory of `dlscope run` (or its results.json)"
    )
    p.add_argument("run_b", metavar="RUN_B", help="the run compared with it")
    p.add_argument("--json", action="store_true", help="print the comparison as JSON")
    p.add_argument(
        "--limit", type=int, default=10, help="rows per table of operators, system calls, files (default 10)"
    )
    p.set_defaults(func=cmd_diff)
