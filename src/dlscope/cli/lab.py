"""Commands that train or time the built-in job: lab, train, profile, sweep, ops, graph."""

from __future__ import annotations

import argparse

from dlscope.cli.common import (
    Parser,
    add_dist_args,
    add_hang_args,
    add_profile_args,
    add_run_args,
    add_training_args,
    device_list,
    from_flags,
    int_list,
    profile_options,
    run_builtin_command,
    switch_list,
)
from dlscope.errors import ConfigError, DlscopeError
from dlscope.options import (
    TRACE_BACKENDS,
    AnatomyOptions,
    DistOptions,
    GraphOptions,
    HangOptions,
    ScalingOptions,
    StepOptions,
    SweepOptions,
    TrainOptions,
)

LAB_STEPS = [
    "environment",
    "dataset",
    "model",
    "train",
    "profile",
    "sweep",
    "checkpoint",
    "ckpt_anatomy",
    "ops",
    "graph",
    "pipeline",
]
TRAIN_STEPS = ["environment", "dataset", "model", "train", "checkpoint"]
RANK_STEPS = ["ranks", "distributed"]  # added after train when it runs in several ranks
SCALING = "scaling"  # the lab's last rank step: by default with --nproc-per-node, else named in --steps


def step_list(text: str) -> list[str]:
    """'train,profile' → the lab's steps in lab order, with the ones they need before them."""
    names = [s.strip() for s in text.split(",") if s.strip()]
    unknown = [s for s in names if s not in [*LAB_STEPS, SCALING]]
    if not names or unknown:
        raise argparse.ArgumentTypeError(f"steps are {','.join([*LAB_STEPS, SCALING])}; got {text!r}")
    if any(s in names for s in ("checkpoint", "ckpt_anatomy", SCALING)) and "train" not in names:
        names.append("train")  # checkpoints are of the trained model; scaling follows the job in ranks
    return [s for s in [*LAB_STEPS, SCALING] if s in names]


def keras_seed_options(args: argparse.Namespace) -> AnatomyOptions:
    options = AnatomyOptions(keras_seed=True, keras_epochs=args.epochs, keras_train_subset=args.train_subset)
    if getattr(args, "backend", None):  # dlscope ckpt seed003
        options.keras_backend, options.keras_optimizer = args.backend, args.keras_optimizer
        options.keras_batch_size = args.batch_size
    return options


def train_options(args: argparse.Namespace) -> TrainOptions:
    """--resume, --epochs only when typed (a resumed run keeps its checkpoint's otherwise), the watchdog."""
    epochs = args.epochs if getattr(args, "epochs_given", False) else None
    return TrainOptions(resume=args.resume, epochs=epochs, hang=from_flags(HangOptions, args))


def with_rank_steps(steps: list[str], dist: DistOptions) -> list[str]:
    """After a launched train step: what each rank recorded, the analysis of their traces, and (when
    asked for) scaling."""
    if not dist.launched or "train" not in steps:
        return steps
    rest = [s for s in steps if s != SCALING]
    at = rest.index("train") + 1
    return [*rest[:at], *RANK_STEPS, *([SCALING] if SCALING in steps else []), *rest[at:]]


def lab_steps(selected: list[str] | None, dist: DistOptions) -> list[str]:
    """--steps (default: every lab step, and scaling when the job runs in ranks) with the rank steps."""
    in_ranks_here = dist.nproc_per_node > 1  # scaling compares this machine's ranks with its threads
    if selected is None:
        selected = [*LAB_STEPS, SCALING] if in_ranks_here else LAB_STEPS
    elif SCALING in selected and not in_ranks_here:
        raise DlscopeError("--steps scaling compares ranks with threads: it needs --nproc-per-node N ≥ 2")
    return with_rank_steps(selected, dist)


def cmd_lab(args: argparse.Namespace) -> int:
    options = StepOptions(
        train=train_options(args),
        profile=profile_options(args),
        graph=GraphOptions(compile=args.compile),
        ckpt_anatomy=keras_seed_options(args) if args.keras_seed else AnatomyOptions(),
        dist=from_flags(DistOptions, args),
        scaling=ScalingOptions(steps=args.scaling_steps, rounds=args.scaling_rounds),
    )
    return run_builtin_command(args, "lab", lab_steps(args.steps, options.dist), step_options=options)


def cmd_train(args: argparse.Namespace) -> int:
    options = StepOptions(train=train_options(args), dist=from_flags(DistOptions, args))
    return run_builtin_command(args, "train", with_rank_steps(TRAIN_STEPS, options.dist), step_options=options)


def cmd_profile(args: argparse.Namespace) -> int:
    options = StepOptions(profile=profile_options(args))
    return run_builtin_command(args, "profile", ["environment", "dataset", "model", "profile"], step_options=options)


def cmd_sweep(args: argparse.Namespace) -> int:
    from dlscope.config import TrainConfig

    sweep = from_flags(SweepOptions, args, gemm_n=2048, copy_mbytes=256)
    # the sweep trains nothing to completion: the config names the model and optimizer it times
    config = TrainConfig(model=args.model, optimizer=args.optimizer, lr=args.lr, seed=args.seed, target_acc=None)
    steps = ["environment", "dataset", "sweep"]
    return run_builtin_command(args, "sweep", steps, config=config, step_options=StepOptions(sweep=sweep))


def ops_options(args: argparse.Namespace, parts: tuple[str, ...]):
    from dlscope.options import IMPLS, ConvShape, OpsOptions

    options = OpsOptions(parts=parts, gemm_n=2048)
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
    options = StepOptions(ops=ops_options(args, ("conv", "loop_order")))
    return run_builtin_command(args, "ops-conv", ["environment", "ops"], step_options=options)


def cmd_ops_memory(args: argparse.Namespace) -> int:
    options = StepOptions(ops=ops_options(args, ("memory",)))
    return run_builtin_command(args, "ops-memory", ["environment", "ops"], step_options=options)


def cmd_graph(args: argparse.Namespace) -> int:
    options = GraphOptions(compile=not args.no_compile, cold=not args.warm_cache, repeats=args.repeats)
    return run_builtin_command(
        args, "graph", ["environment", "dataset", "graph"], step_options=StepOptions(graph=options)
    )


def register(sub: argparse._SubParsersAction) -> None:
    from dlscope.config import OPTIMIZERS

    p = sub.add_parser(
        "lab",
        help="the whole lab: environment, dataset, model, train, profile, sweep, checkpoint, checkpoint "
        "anatomy, operators, graphs, input pipeline → one report",
    )
    add_training_args(p)
    add_dist_args(p)
    add_run_args(p, tensorboard=True)
    add_hang_args(p)
    add_profile_args(p)
    p.add_argument(
        "--steps",
        type=step_list,
        default=None,
        metavar="S,S,…",
        help=f"run only these lab steps (default all: {','.join(LAB_STEPS)}; and {SCALING} with --nproc-per-node)",
    )
    g = p.add_argument_group("scaling (with --nproc-per-node N)")
    g.add_argument(
        "--scaling-steps",
        type=int,
        default=ScalingOptions.steps,
        metavar="K",
        help="training steps of each short scaling run",
    )
    g.add_argument(
        "--scaling-rounds",
        type=int,
        default=ScalingOptions.rounds,
        metavar="R",
        help="rounds that alternate the three configurations",
    )
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
    add_dist_args(p)
    add_run_args(p, tensorboard=True)
    add_hang_args(p)
    p.add_argument("--resume", default=None, metavar="CKPT", help="continue a run from its checkpoint")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("profile", help="profile real training steps; top-10 operators, trace")
    add_training_args(p)
    add_run_args(p)
    add_profile_args(p)
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
    g.add_argument("--model", default="cnn", help="model from the zoo, listed by `dlscope models` (default cnn)")
    g.add_argument("--optimizer", default="adam", choices=OPTIMIZERS)
    g.add_argument("--lr", type=float, default=None, help="learning rate (default per optimizer)")
    g.add_argument("--seed", type=int, default=1)
    g.add_argument("--profile-steps", type=int, default=3, help="profiled steps per configuration (default 3)")
    add_run_args(p)
    p.set_defaults(func=cmd_sweep)

    ops = sub.add_parser("ops", help="operators: a convolution four ways, loop order, memory per layer")
    ops_sub = ops.add_subparsers(dest="ops_command", required=True, parser_class=Parser)
    p = ops_sub.add_parser("conv", help="seven loops, NumPy, im2col + GEMM, torch: checked, timed, %% of GEMM peak")
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


def parse_ints(text: str, count: int, what: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise ConfigError(f"{what} must be {count} comma-separated integers, got {text!r}") from None
    if len(values) != count:
        raise ConfigError(f"{what} must be {count} comma-separated integers, got {text!r}")
    return values
