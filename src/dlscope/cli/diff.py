"""dlscope diff RUN_A RUN_B: where step time went between two runs of `dlscope run`."""

from __future__ import annotations

import argparse

from dlscope.errors import ConfigError
from dlscope.options import RunDiffOptions
from dlscope.runner import answer


def cmd_diff(args: argparse.Namespace) -> int:
    if not 0 <= args.min_change < 100:
        raise ConfigError(f"--min-change must be a percentage in [0, 100), got {args.min_change:g}")
    options = RunDiffOptions(args.run_a, args.run_b, args.min_change, json=args.json, limit=args.limit)
    return answer("diff", options)


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
    p.add_argument(
        "--min-change",
        type=float,
        default=RunDiffOptions.min_change_pct,
        metavar="PCT",
        help="a part changed when its 95%% band excludes 0 and it moved by at least PCT%% of the step "
        f"(default {RunDiffOptions.min_change_pct:g})",
    )
    p.add_argument("--json", action="store_true", help="print the comparison as JSON")
    p.add_argument("--limit", type=int, default=10, help="rows per table of operators, system calls, files")
    p.set_defaults(func=cmd_diff)
