"""The `dlscope` command: one subcommand per capability. Parse, call, print — nothing more.

Each module here registers its subcommands; add a capability by adding a module to COMMANDS."""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Sequence

from dlscope import __version__
from dlscope.cli import attach, ckpt, diff, doctor, lab, merge, pipeline, run, stacks, tools, trace, watch
from dlscope.cli.common import Parser
from dlscope.errors import DlscopeError, from_os_error, interrupt_signal, interrupts_delivered, os_error_in

COMMANDS = [lab, run, merge, doctor, diff, stacks, attach, watch, trace, tools, ckpt, pipeline]


def build_parser() -> Parser:
    parser = Parser(prog="dlscope", description="What a deep-learning training job does to a machine.")
    parser.add_argument("--version", action="version", version=f"dlscope {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser, metavar="COMMAND")
    for module in COMMANDS:
        module.register(sub)
    return parser


def print_error(error: DlscopeError) -> int:
    from dlscope.console import one_line

    print(f"dlscope: error: {one_line(error)}", file=sys.stderr)
    return getattr(error, "exit_status", 2)


def main(argv: Sequence[str] | None = None) -> int:
    raw_argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(raw_argv)
    args.raw_argv = raw_argv
    in_main_thread = threading.current_thread() is threading.main_thread()
    try:
        with interrupts_delivered() if in_main_thread else contextlib.nullcontext():
            return args.func(args)
    except DlscopeError as e:
        return print_error(e)
    except KeyboardInterrupt as e:
        signum = interrupt_signal(e)
        print(f"dlscope: interrupted by {signum.name}", file=sys.stderr)
        return 128 + signum
    except Exception as e:  # an OS fault (also wrapped, as torch does) that no closer layer named
        cause = os_error_in(e)
        if cause is None:
            raise
        return print_error(from_os_error(cause, "write"))
