"""Commands that train or time the built-in job: lab, train, profile, sweep, ops, graph."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from dlscope.cli.common import (
    Parser,
    add_run_args,
    add_training_args,
    device_list,
    int_list,
    print_locations,
    run_pipeline,
    switch_list,
    train_config,
)
from dlscope.errors import DlscopeError
from dlscope.observe.iotrace.tracer import BACKENDS as TRACE_BACKENDS  # stdlib only: cheap


def keras_seed_options(args: argparse.Namespace) -> dict[str, Any]:
    options = {"keras_seed": True, "keras_epochs": args.epochs, "keras_train_subset": args.train_subset}
    if getattr(args, "backend", None):  # dlscope ckpt seed003
        options.update(
            keras_backend=args.backend, keras_optimizer=args.keras_optimizer, keras_batch_size=args.batch_size
        )
    return options


def cmd_lab(args: argparse.Namespace) -> int:
    if args.trace_io:
        return trace_lab(args)
    from dlscope.steps.graph import GraphOptions

    extra: dict[str, Any] = {"graph": GraphOptions(compile=args.compile)}
    if args.keras_seed:
        extra.update(keras_seed_options(args))
    return run_pipeline(args, "lab", [], extra=extra)


def _drop_options(argv: Sequence[str], with_value: set[str], flags: set[str]) -> list[str]:
    kept, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in flags or (arg.split("=", 1)[0] in with_value and "=" in arg):
            continue
        elif arg in with_value:
            skip = True
        else:
            kept.append(arg)
    return kept


def trace_lab(args: argparse.Namespace) -> int:
    """The lab as a traced child process writing into this run; the trace section is added after."""
    from dlscope.report.render import render_report
    from dlscope.rundir import RunDir
    from dlscope.steps import LabContext, LabOptions, iotrace

    config = train_config(args)  # validate before creating anything on disk
    run = RunDir.create(args.out, "lab")
    lab_args = _drop_options(
        args.raw_argv[args.raw_argv.index("lab") + 1 :], {"--out", "--trace-backend"}, {"--trace-io"}
    )
    child = [sys.executable, "-m", "dlscope.cli", "lab", *lab_args, "--out", str(run.path)]
    options = LabOptions(extra={"trace_command": child, "trace_backend": args.trace_backend})
    try:
        section = iotrace.run(LabContext(config=config, run=run, options=options))
    finally:
        run.reload()  # what the traced lab wrote
    run.results["run"]["argv"] = args.raw_argv  # as the user typed it, --trace-io included
    run.record("iotrace", section)
    if run.results["run"]["status"] == "running":  # the lab died before it could say so
        run.finish("failed")
    html, md = render_report(run.path)
    print_locations(run, html, md)
    return section["exit_code"]


def cmd_train(args: argparse.Namespace) -> int:
    return run_pipeline(args, "train", ["environment", "dataset", "model", "train", "checkpoint"])


def cmd_profile(args: argparse.Namespace) -> int:
    return run_pipeline(args, "profile", ["environment", "dataset", "model", "profile"])


def cmd_sweep(args: argparse.Namespace) -> int:
    sweep = {
        "batch_sizes": args.batch_sizes,
        "devices": args.devices,
        "threads": args.threads,
        "cudnn_benchmark": args.cudnn_benchmark,
        "steps": args.steps,
        "warmup": args.warmup,
        "profile_steps": args.profile_steps,
        "rounds": args.rounds,
        "gemm_n": 2048,
        "copy_mbytes": 256,
    }
    from dlscope.experiments.sweep import SweepSettings, available_devices, sweep_grid
    from dlscope.train import TrainConfig

    # validate the grid and settings before a run directory exists
    sweep_grid(args.batch_sizes, args.devices or available_devices(), args.threads or [1], args.cudnn_benchmark)
    SweepSettings(steps=args.steps, warmup=args.warmup, profile_steps=args.profile_steps, rounds=args.rounds)
    # the sweep trains nothing to completion: the config names the model and optimizer it times
    config = TrainConfig(model=args.model, optimizer=args.optimizer, lr=args.lr, seed=args.seed, target_acc=None)
    return run_pipeline(args, "sweep", ["environment", "dataset", "sweep"], config=config, extra={"sweep": sweep})


def ops_options(args: argparse.Namespace, parts: tuple[str, ...]):
    from dlscope.experiments.conv import IMPLS, ConvShape, parse_ints
    from dlscope.steps.ops import OpsOptions

    options = OpsOptions(parts=parts, peak_size=2048)
    if "conv" in parts:
        impls = tuple(args.impl.split(","))
        unknown = [i for i in impls if i not in IMPLS]
        if unknown:
            raise DlscopeError(f"--impl: unknown implementation {', '.join(unknown)}; choose from {', '.join(IMPLS)}")
        n, c, h, w = parse_ints(args.shape, 4, "--shape N,C,H,W")
        k, r, s = parse_ints(args.filters, 3, "--filters K,R,S")
        options.shape = ConvShape(n, c, h, w, k, r, s, args.stride, args.padding)
        options.impls = impls
        options.repeats = args.repeats
        options.loops_budget_s = args.loops_budget
        if args.loop_order_shape == "off":
            options.parts = ("conv",)
        else:
            n, c, h, w, k, r, s = parse_ints(args.loop_order_shape, 7, "--loop-order-shape N,C,H,W,K,R,S")
            options.loop_order_shape = ConvShape(n, c, h, w, k, r, s, 1, r // 2)
    if "memory" in parts:
        options.memory_batch_sizes = parse_ints(args.batch_sizes, len(args.batch_sizes.split(",")), "--batch-sizes")
        if min(options.memory_batch_sizes) < 1:
            raise DlscopeError("--batch-sizes must all be ≥ 1")
    return options


def cmd_ops_conv(args: argparse.Namespace) -> int:
    if args.repeats < 1:
        raise DlscopeError("--repeats must be ≥ 1")
    if args.loops_budget <= 0:
        raise DlscopeError("--loops-budget must be > 0 seconds")
    return run_pipeline(
        args, "ops-conv", ["environment", "ops"], extra={"ops": ops_options(args, ("conv", "loop_order"))}
    )


def cmd_ops_memory(args: argparse.Namespace) -> int:
    return run_pipeline(args, "ops-memory", ["environment", "ops"], extra={"ops": ops_options(args, ("memory",))})


def cmd_graph(args: argparse.Namespace) -> int:
    from dlscope.steps.graph import GraphOptions

    if args.repeats < 1:
        raise DlscopeError("--repeats must be ≥ 1")
    options = GraphOptions(compile=not args.no_compile, cold=not args.warm_cache, repeats=args.repeats)
    return run_pipeline(args, "graph", ["environment", "dataset", "graph"], extra={"graph": options})


def register(sub: argparse._SubParsersAction) -> None:
    from dlscope.models import MODELS
    from dlscope.train import OPTIMIZERS

    p = sub.add_parser("lab", help="the whole lab: environment → train → curves → profile → checkpoint → report")
    add_training_args(p)
    add_run_args(p)
    p.add_argument("--resume", default=None, metavar="CKPT", help="continue a run from its checkpoint")
    p.add_argument(
        "--compile", action="store_true", help="also torch.compile the model in the graph step (tens of seconds)"
    )
    p.add_argument(
        "--keras-seed", action="store_true", help="also train and dissect seed 003's Keras MLP (needs .[keras])"
    )
    p.add_argument(
        "--trace-io", action="store_true", help="trace the lab's file I/O through the OS (see dlscope trace)"
    )
    p.add_argument("--trace-backend", default="auto", choices=["auto", *TRACE_BACKENDS], help="with --trace-io")
    p.set_defaults(func=cmd_lab)

    p = sub.add_parser("train", help="train a model (TensorBoard, checkpoints, report)")
    add_training_args(p)
    add_run_args(p)
    p.add_argument("--resume", default=None, metavar="CKPT", help="continue a run from its checkpoint")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("profile", help="profile real training steps; top-10 operators, trace")
    add_training_args(p)
    add_run_args(p)
    p.set_defaults(func=cmd_profile)

    p = sub.add_parser("sweep", help="batch size × device: throughput, latency, overhead, roofline, operator shift")
    g = p.add_argument_group("sweep")
    g.add_argument("--batch-sizes", type=int_list, default=[1, 16, 64], metavar="B,B,…", help="default 1,16,64")
    g.add_argument(
        "--devices", type=device_list, default=None, metavar="D,D,…", help="cpu, cuda (default: every available)"
    )
    g.add_argument(
        "--threads", type=int_list, default=None, metavar="T,T,…", help="CPU intra-op threads (default: torch's)"
    )
    g.add_argument(
        "--cudnn-benchmark",
        type=switch_list,
        default=[False, True],
        metavar="off,on",
        help="cuDNN autotuning settings to sweep on CUDA (default off,on)",
    )
    g.add_argument("--steps", type=int, default=50, help="timed training steps per configuration (default 50)")
    g.add_argument("--warmup", type=int, default=5, help="warm-up steps after the cold one, not timed (default 5)")
    g.add_argument(
        "--rounds", type=int, default=5, help="timed steps split into rounds interleaved across configurations"
    )
    g.add_argument("--model", default="cnn", choices=list(MODELS), help="model from the zoo (default cnn)")
    g.add_argument("--optimizer", default="adam", choices=OPTIMIZERS)
    g.add_argument("--lr", type=float, default=None, help="learning rate (default per optimizer)")
    g.add_argument("--seed", type=int, default=1)
    add_run_args(p)
    p.set_defaults(func=cmd_sweep, profile_steps=3)

    ops = sub.add_parser("ops", help="operators: a convolution four ways, loop order, memory per layer")
    ops_sub = ops.add_subparsers(dest="ops_command", required=True, parser_class=Parser)
    p = ops_sub.add_parser("conv", help="seven loops, NumPy, im2col + GEMM, torch: checked, timed, % of GEMM peak")
    p.add_argument("--shape", default="1,16,14,14", metavar="N,C,H,W", help="input (default: cnn's conv2, one image)")
    p.add_argument("--filters", default="32,5,5", metavar="K,R,S", help="K filters of R×S (default 32,5,5)")
    p.add_argument("--stride", type=int, default=1)
    p.add_argument("--padding", type=int, default=2)
    p.add_argument("--impl", default="loops,numpy,im2col,torch", help="comma-separated implementations")
    p.add_argument("--repeats", type=int, default=5, help="timed repeats after one warm-up (median)")
    p.add_argument(
        "--loops-budget",
        type=float,
        default=5.0,
        metavar="S",
        help="seconds the pure-Python loops may take; beyond it they run on a sample and are extrapolated",
    )
    p.add_argument(
        "--loop-order-shape",
        default="1,8,224,224,32,3,3",
        metavar="N,C,H,W,K,R,S",
        help="shape of the compiled loop-order experiment (same padding), or 'off'",
    )
    add_training_args(p)
    add_run_args(p)
    p.set_defaults(func=cmd_ops_conv)
    p = ops_sub.add_parser("memory", help="memory per layer against the measured peak, by batch size")
    p.add_argument("--batch-sizes", default="16,64,128", metavar="B,B,…", help="batch sizes to model and measure")
    add_training_args(p)
    add_run_args(p)
    p.set_defaults(func=cmd_ops_memory)

    p = sub.add_parser("graph", help="forward graph, autograd graph, torch.compile's joint graph and generated code")
    p.add_argument("--no-compile", action="store_true", help="skip torch.compile (forward and autograd graphs only)")
    p.add_argument("--warm-cache", action="store_true", help="let Inductor reuse its cache (compile time then warm)")
    p.add_argument("--repeats", type=int, default=20, help="timed training steps, eager and compiled (median)")
    add_training_args(p)
    add_run_args(p)
    p.set_defaults(func=cmd_graph)
