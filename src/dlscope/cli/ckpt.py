"""dlscope ckpt: verify, inspect, diff, seed003."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from dlscope.cli.common import (
    Parser,
    add_run_args,
    add_training_args,
    run_builtin_command,
)
from dlscope.cli.lab import keras_seed_options
from dlscope.errors import CheckpointError


def cmd_ckpt_verify(args: argparse.Namespace) -> int:
    from pathlib import Path

    from dlscope.checkpoint import verify_checkpoint
    from dlscope.ckpt.tf_fmt import bundle_index
    from dlscope.console import console
    from dlscope.data.loaders import normalise
    from dlscope.data.mnist import load_mnist

    index = bundle_index(Path(args.path))
    if index is not None:
        return verify_tf_bundle(index)
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


def verify_tf_bundle(index) -> int:
    """A TF checkpoint or SavedModel: every tensor's CRC32C, as TF checks them on restore."""
    from dlscope.ckpt.tf_fmt import verify_bundle
    from dlscope.console import console, safe

    anatomy = verify_bundle(index)
    bad = [f for f in anatomy.findings if f.level == "bad"]
    for f in bad:
        console.print(f"[bad]MISMATCH[/] {safe(f.where)}: {safe(f.what)}")
    if bad:
        return 1
    console.print(f"[good]ok[/] {safe(index)}: the CRC32C of all {len(anatomy.tensors):,} tensors match")
    return 0


def cmd_ckpt_seed003(args: argparse.Namespace) -> int:
    from dlscope.options import StepOptions

    os.environ["KERAS_BACKEND"] = args.backend  # the flag wins over the environment; keras reads it at import
    if args.backend == "tensorflow":
        from dlscope.data.pipeline.tfdata import import_tensorflow

        import_tensorflow()  # missing TF: one line before any run directory is made

    options = StepOptions(ckpt_anatomy=keras_seed_options(args))
    return run_builtin_command(args, "ckpt-seed003", ["environment", "dataset", "ckpt_anatomy"], step_options=options)


WORST_FIRST = ("dangerous", "damaged", "safe", "skipped")


def cmd_ckpt_scan(args: argparse.Namespace) -> int:
    from dlscope.ckpt.scan import EXIT_CODES, scan_paths

    reports = [r.to_dict() for r in scan_paths(args.paths, frozenset(args.allow))]
    if not reports:
        raise CheckpointError("no files to scan", args.paths[0])
    worst = min((r["verdict"] for r in reports), key=WORST_FIRST.index)
    if args.json:  # CI's form: no rich, no report modules to import
        print(json.dumps({"verdict": worst, "exit_code": EXIT_CODES[worst], "files": reports}, indent=1))
    else:
        from dlscope.report.sections.ckpt_scan import render_scan
        from dlscope.report.terminal import print_blocks

        print_blocks(render_scan(reports, limit=args.limit))
    return EXIT_CODES[worst]


def cmd_ckpt_inspect(args: argparse.Namespace) -> int:
    from dlscope.ckpt.inspect import inspect_checkpoint
    from dlscope.ckpt.scan import scan_file
    from dlscope.report.blocks import Findings
    from dlscope.report.sections.ckpt_anatomy import render_anatomy
    from dlscope.report.sections.ckpt_scan import VERDICT_LEVEL, render_scan
    from dlscope.report.terminal import print_blocks

    # the scanner's verdict decides the exit status; a TF prefix or shard is no single file it knows
    scan = scan_file(args.path, crc=args.stats) if Path(args.path).is_file() else None
    scan = scan if scan is not None and scan.format != "unknown" else None
    try:
        anatomy = inspect_checkpoint(args.path, stats=args.stats)
    except CheckpointError:
        if scan is None or scan.verdict != "dangerous":
            raise
        # no anatomy, but what loading it would run is known: report the attack, not a corrupt file
        if args.json:
            print(json.dumps(scan.to_dict(), indent=1))
        else:
            print_blocks(render_scan([scan.to_dict()], limit=args.limit))
        return scan.exit_code
    if scan is not None and scan.verdict == "dangerous":
        anatomy.safe_to_load = False  # e.g. a second pickle after the one torch.load reads
    if args.json:
        verdict = {"verdict": scan.verdict, "exit_code": scan.exit_code, "summary": scan.summary()} if scan else {}
        print(json.dumps({**anatomy.to_dict(), **verdict}, indent=1, default=str))
    else:
        print_blocks(render_anatomy(anatomy.to_dict(), stats_columns=args.stats, limit=args.limit))
        if scan is not None:
            print_blocks([Findings([(VERDICT_LEVEL[scan.verdict], scan.summary())])])
    if scan is not None and scan.verdict != "safe":
        return scan.exit_code  # dangerous 1, damaged 2
    return 0 if anatomy.safe_to_load and not anatomy.corrupt else 1  # a CRC mismatch (--stats) is 1


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
