"""dlscope watch: a job running under `dlscope run`, live on the terminal."""

from __future__ import annotations

import argparse

from dlscope.cli.common import from_flags


def cmd_watch(args: argparse.Namespace) -> int:
    from dlscope.options import WatchOptions
    from dlscope.runner import watch

    return watch(from_flags(WatchOptions, args))


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not 0.1 <= value <= 60:
        raise argparse.ArgumentTypeError(f"expected 0.1 to 60 seconds, got {text}")
    return value


def _steps(text: str) -> int:
    if not text.isdigit() or not 10 <= int(text) <= 100_000:
        raise argparse.ArgumentTypeError(f"expected 10 to 100000 steps, got {text!r}")
    return int(text)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "watch",
        help="a job running under `dlscope run`, live: step rate and time, anatomy, data wait, processes, hangs",
    )
    p.add_argument("target", metavar="RUN_DIR|PID", help="a running `dlscope run` directory, or a process id in it")
    p.add_argument("--interval", type=_positive, default=1.0, metavar="S", help="seconds between refreshes (default 1)")
    p.add_argument(
        "--recent", type=_steps, default=200, metavar="N", help="the newest steps the figures are drawn from"
    )
    p.add_argument("--once", action="store_true", help="print one view and return (for scripts)")
    p.set_defaults(func=cmd_watch)
