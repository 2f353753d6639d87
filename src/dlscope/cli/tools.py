"""Small commands: report, tensorboard, env, models, data."""

from __future__ import annotations

import argparse

from dlscope import runner
from dlscope.cli.common import Parser
from dlscope.options import FileOptions, MnistOptions


def cmd_report(args: argparse.Namespace) -> int:
    return runner.report(args.run, full=args.full)


def cmd_tensorboard(args: argparse.Namespace) -> int:
    return runner.tensorboard(args.run, args.port)


def cmd_env(args: argparse.Namespace) -> int:
    return runner.answer("env", FileOptions())


def cmd_models(args: argparse.Namespace) -> int:
    return runner.answer("models", FileOptions())


def cmd_data_fetch(args: argparse.Namespace) -> int:
    return runner.answer("data-fetch", MnistOptions(mirror=args.mirror, dest=args.dest))


def cmd_data_verify(args: argparse.Namespace) -> int:
    return runner.answer("data-verify", MnistOptions(data_dir=args.data_dir))


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="re-render report.html and report.md from results.json")
    p.add_argument("run", help="run directory")
    p.add_argument(
        "--full",
        action="store_true",
        help="also print the whole report: the summary, every section, how it was measured",
    )
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("tensorboard", help="start TensorBoard on a run, bound to 127.0.0.1")
    p.add_argument("run")
    p.add_argument("--port", type=int, default=6006)
    p.set_defaults(func=cmd_tensorboard)

    p = sub.add_parser("env", help="print the environment table")
    p.set_defaults(func=cmd_env)
    p = sub.add_parser("models", help="list the model zoo")
    p.set_defaults(func=cmd_models)

    data = sub.add_parser("data", help="MNIST: fetch from a mirror, verify a copy")
    data_sub = data.add_subparsers(dest="data_command", required=True, parser_class=Parser)
    p = data_sub.add_parser("fetch", help="download the four .gz files, verified, atomically")
    p.add_argument("--mirror", required=True, help="base URL holding train-images-idx3-ubyte.gz etc.")
    p.add_argument("--dest", default=None, help="cache root (default ~/.cache/dlscope)")
    p.set_defaults(func=cmd_data_fetch)
    p = data_sub.add_parser("verify", help="verify the MNIST files' checksums")
    p.add_argument("--data-dir", default=None)
    p.set_defaults(func=cmd_data_verify)
