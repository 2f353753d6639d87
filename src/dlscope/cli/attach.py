"""dlscope attach: the profiler on demand in a job already running under `dlscope run`."""

from __future__ import annotations

import argparse

from dlscope.cli.common import from_flags


def cmd_attach(args: argparse.Namespace) -> int:
    from dlscope.options import AttachOptions
    from dlscope.runner import answer

    return answer("attach", from_flags(AttachOptions, args))


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("attach", help="profile the next N steps of a job running under `dlscope run`, with no restart")
    p.add_argument("target", metavar="RUN_DIR|PID", help="a running `dlscope run` directory, or a process id in it")
    p.add_argument(
        "--profile-steps",
        type=int,
        required=True,
        metavar="N",
        help="steps to profile, from the next step boundary (after one warm-up step)",
    )
    p.add_argument(
        "--timeout", type=float, default=600.0, metavar="S", help="seconds to wait for the window (default 600)"
    )
    p.add_argument("--json", action="store_true", help="print the windows as JSON")
    p.set_defaults(func=cmd_attach)
