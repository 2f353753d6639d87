"""The `dlscope` command: one subcommand per capability. Parse, call, print — nothing more.

Each module here registers its subcommands; add a capability by adding a module to COMMANDS."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from dlscope import __version__
from dlscope.cli import ckpt, lab, pipeline, run, tools, trace
from dlscope.cli.common import Parser
from dlscope.errors import DlscopeError

COMMANDS = [lab, run, trace, tools, ckpt, pipeline]


def build_parser() -> Parser:
    parser = Parser(prog="dlscope", description="What a deep-learning training job does to a machine.")
    parser.add_argument("--version", action="version", version=f"dlscope {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for module in COMMANDS:
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    raw_argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(raw_argv)
    args.raw_argv = raw_argv
    try:
        return args.func(args)
    except DlscopeError as e:
        print(f"dlscope: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("dlscope: interrupted", file=sys.stderr)
        return 130
