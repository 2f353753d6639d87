"""dlscope ckpt: verify, inspect, diff, seed003."""

from __future__ import annotations

import argparse
import os

from dlscope.cli.common import Parser, add_run_args, add_training_args, from_flags, run_builtin_command
from dlscope.cli.lab import keras_seed_options
from dlscope.options import FileOptions
from dlscope.runner import answer


def file_options(args: argparse.Namespace, *paths: str) -> FileOptions:
    return from_flags(FileOptions, args, paths=list(paths))


def cmd_ckpt_verify(args: argparse.Namespace) -> int:
    return answer("ckpt-verify", file_options(args, args.path))


def cmd_ckpt_seed003(args: argparse.Namespace) -> int:
    from dlscope.options import StepOptions

    os.environ["KERAS_BACKEND"] = args.backend  # the flag wins over the environment; keras reads it at import
    options = StepOptions(ckpt_anatomy=keras_seed_options(args))
    return run_builtin_command(args, "ckpt-seed003", ["environment", "dataset", "ckpt_anatomy"], step_options=options)


def cmd_ckpt_scan(args: argparse.Namespace) -> int:
    return answer("ckpt-scan", file_options(args, *args.paths))


def cmd_ckpt_inspect(args: argparse.Namespace) -> int:
    return answer("ckpt-inspect", file_options(args, args.path))


def cmd_ckpt_diff(args: argparse.Namespace) -> int:
    return answer("ckpt-diff", file_options(args, args.a, args.b))


def register(sub: argparse._SubParsersAction) -> None:
    ckpt = sub.add_parser("ckpt", help="checkpoints: verify, inspect (never executes the file), diff")
    ckpt_sub = ckpt.add_subparsers(dest="ckpt_command", required=True, parser_class=Parser)
    p = ckpt_sub.add_parser(
        "verify", help="reload a checkpoint and check its test predictions; a TF checkpoint: every tensor's CRC32C"
    )
    p.add_argument("path")
    p.add_argument("--data-dir", default=None)
    p.set_defaults(func=cmd_ckpt_verify)
    p = ckpt_sub.add_parser(
        "inspect",
        help="what is inside a checkpoint (torch, safetensors, Keras, TF, DCP) without running it; "
        "exit 0 safe to torch.load, 1 not",
    )
    p.add_argument(
        "path",
        help="checkpoint file (format detected from its bytes), a TF checkpoint prefix, or a "
        "torch.distributed.checkpoint directory",
    )
    p.add_argument("--json", action="store_true", help="print the full anatomy as JSON")
    p.add_argument(
        "--stats", action="store_true", help="read tensor data: min/max/mean/std, zeros, NaN/Inf; CRCs (exit 1 on one)"
    )
    p.add_argument("--limit", type=int, default=40, help="rows per table (default 40; --json lists all)")
    p.set_defaults(func=cmd_ckpt_inspect)
    p = ckpt_sub.add_parser(
        "scan",
        help="would loading these files run code? every pickle simulated, nothing executed; "
        "exit 0 safe, 1 dangerous, 2 damaged or not a checkpoint (the worst file decides)",
    )
    p.add_argument(
        "paths",
        nargs="+",
        help="checkpoint files, or directories to scan recursively (where files that are no model file, "
        "such as a README or config.json, are skipped)",
    )
    p.add_argument("--json", action="store_true", help="print every file's verdict, findings and pickle events")
    p.add_argument(
        "--allow",
        action="append",
        default=[],
        metavar="MODULE.NAME",
        help="also trust this global (like torch.serialization.add_safe_globals); repeatable",
    )
    p.add_argument("--limit", type=int, default=20, help="rows per table (default 20; --json lists all)")
    p.set_defaults(func=cmd_ckpt_scan)
    p = ckpt_sub.add_parser("diff", help="tensors added/removed/changed between two checkpoints; exit 0 identical")
    p.add_argument("a")
    p.add_argument("b")
    p.add_argument("--json", action="store_true")
    p.add_argument("--limit", type=int, default=40, help="rows per table (default 40)")
    p.set_defaults(func=cmd_ckpt_diff)
    p = ckpt_sub.add_parser(
        "seed003",
        help="train seed 003's Keras MLP (Keras 3, torch or TensorFlow backend), save .h5, .keras and a TF "
        "checkpoint, profile it, report their anatomy",
    )
    p.add_argument(
        "--backend",
        default="torch",
        choices=["torch", "tensorflow"],
        help="Keras backend (tensorflow needs the tf extra; default torch)",
    )
    p.add_argument(
        "--keras-optimizer", default="rmsprop", choices=["rmsprop", "adam"], help="default rmsprop (the handout: adam)"
    )
    add_training_args(p, epochs=5, target=None)
    add_run_args(p)
    p.set_defaults(func=cmd_ckpt_seed003)
