"""dlscope ckpt: verify, inspect, diff, seed003."""

from __future__ import annotations

import argparse
import json

from dlscope.cli.common import (
    Parser,
    add_run_args,
    add_training_args,
    run_steps,
)
from dlscope.cli.lab import keras_seed_options


def cmd_ckpt_verify(args: argparse.Namespace) -> int:
    from dlscope.checkpoint import verify_checkpoint
    from dlscope.console import console
    from dlscope.data.loaders import normalise
    from dlscope.data.mnist import load_mnist

    data = load_mnist(args.data_dir)
    result = verify_checkpoint(args.path, normalise(data.test_images), data.test_labels)
    if result.ok:
        console.print(
            f"[good]ok[/] {args.path}: identical predictions on {result.samples:,} test images "
            f"({result.accuracy_loaded:.2f}%)",
            soft_wrap=True,  # one line however long the path: scripts and tests grep it
        )
        return 0
    console.print(
        f"[bad]MISMATCH[/] {args.path}: predictions differ from the saved fingerprint "
        f"(saved {result.accuracy_saved:.2f}%, now {result.accuracy_loaded:.2f}%)",
        soft_wrap=True,
    )
    return 1


def cmd_ckpt_seed003(args: argparse.Namespace) -> int:
    from dlscope.options import StepOptions

    options = StepOptions(ckpt_anatomy=keras_seed_options(args))
    return run_steps(args, "ckpt-seed003", ["environment", "dataset", "ckpt_anatomy"], step_options=options)


def cmd_ckpt_inspect(args: argparse.Namespace) -> int:
    from dlscope.ckpt.inspect import inspect_checkpoint
    from dlscope.report.sections.ckpt_anatomy import render_anatomy
    from dlscope.report.terminal import print_blocks

    anatomy = inspect_checkpoint(args.path, stats=args.stats)
    if args.json:
        print(json.dumps(anatomy.to_dict(), indent=1, default=str))
    else:
        print_blocks(render_anatomy(anatomy.to_dict(), stats_columns=args.stats, limit=args.limit))
    return 0 if anatomy.safe_to_load else 1


def cmd_ckpt_diff(args: argparse.Namespace) -> int:
    from dlscope.ckpt.diff import diff_checkpoints
    from dlscope.report.sections.ckpt_anatomy import render_diff
    from dlscope.report.terminal import print_blocks

    result = diff_checkpoints(args.a, args.b)
    if args.json:
        print(json.dumps(result, indent=1, default=str))
    else:
        print_blocks(render_diff(result, limit=args.limit))
    return 0 if result["identical"] else 1


def register(sub: argparse._SubParsersAction) -> None:
    ckpt = sub.add_parser("ckpt", help="checkpoints: verify, inspect (never executes the file), diff")
    ckpt_sub = ckpt.add_subparsers(dest="ckpt_command", required=True, parser_class=Parser)
    p = ckpt_sub.add_parser("verify", help="reload a checkpoint and check its test predictions")
    p.add_argument("path")
    p.add_argument("--data-dir", default=None)
    p.set_defaults(func=cmd_ckpt_verify)
    p = ckpt_sub.add_parser(
        "inspect",
        help="what is inside a checkpoint (torch, safetensors, Keras, TF) without running it; "
        "exit 0 safe to torch.load, 1 not",
    )
    p.add_argument("path", help="checkpoint file (format detected from its bytes), or a TF checkpoint prefix")
    p.add_argument("--json", action="store_true", help="print the full anatomy as JSON")
    p.add_argument("--stats", action="store_true", help="read tensor data: min/max/mean/std, zeros, NaN/Inf; CRCs")
    p.add_argument("--limit", type=int, default=40, help="rows per table (default 40; --json lists all)")
    p.set_defaults(func=cmd_ckpt_inspect)
    p = ckpt_sub.add_parser("diff", help="tensors added/removed/changed between two checkpoints; exit 0 identical")
    p.add_argument("a")
    p.add_argument("b")
    p.add_argument("--json", action="store_true")
    p.add_argument("--limit", type=int, default=40, help="rows per table (default 40)")
    p.set_defaults(func=cmd_ckpt_diff)
    p = ckpt_sub.add_parser(
        "seed003",
        help="train seed 003's Keras MLP (Keras 3, torch backend), save .h5 and .keras, report their anatomy",
    )
    add_training_args(p, epochs=5, target=None)
    add_run_args(p)
    p.set_defaults(func=cmd_ckpt_seed003)
