"""dlscope stacks: where every process of a running job is, now (the watchdog's capture, on demand)."""

from __future__ import annotations

import argparse
import json


def cmd_stacks(args: argparse.Namespace) -> int:
    from dlscope.observe.hang.ondemand import capture_target
    from dlscope.options import StacksOptions
    from dlscope.report.sections import hang
    from dlscope.report.terminal import print_blocks

    options = StacksOptions(target=args.target, as_json=args.json)
    taken = capture_target(options.target)
    if options.as_json:
        print(json.dumps(taken, indent=1))
    else:
        print_blocks(hang.render({"captures": [{"verdict": taken["verdict"]}]}))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "stacks",
        help="every process of a running job now: Python stacks, system calls, collectives, a verdict",
    )
    p.add_argument("target", metavar="RUN_DIR|PID", help="a `dlscope run` directory, or a process id")
    p.add_argument("--json", action="store_true", help="print the whole capture as JSON")
    p.set_defaults(func=cmd_stacks)
