"""dlscope stacks: where every process of a running job is, now (the watchdog's capture, on demand)."""

from __future__ import annotations

import argparse


def cmd_stacks(args: argparse.Namespace) -> int:
    from dlscope.options import StacksOptions
    from dlscope.runner import answer

    return answer("stacks", StacksOptions(target=args.target, json=args.json))


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "stacks", help="every process of a running job now: Python stacks, system calls, collectives, a verdict"
    )
    p.add_argument("target", metavar="RUN_DIR|PID", help="a `dlscope run` directory, or a process id")
    p.add_argument("--json", action="store_true", help="print the whole capture as JSON")
    p.set_defaults(func=cmd_stacks)
