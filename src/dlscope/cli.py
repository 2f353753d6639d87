"""The `dlscope` command: one subcommand per capability. Parse, call, print — nothing more."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dlscope import __version__, phase
from dlscope.errors import DlscopeError
from dlscope.observe.iotrace.tracer import BACKENDS as TRACE_BACKENDS  # stdlib only: cheap
from dlscope.observe.iotrace.tracer import check_command

if TYPE_CHECKING:
    from dlscope.train import TrainConfig


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2, as for every other bad input
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def add_training_args(p: argparse.ArgumentParser, epochs: int = 2, target: float | None = 99.0) -> None:
    from dlscope.models import MODELS
    from dlscope.train import LOADERS, OPTIMIZERS, RECIPES, SCHEDULES

    g = p.add_argument_group("training")
    g.add_argument(
        "--recipe",
        default="default",
        choices=list(RECIPES),
        help="a named set of defaults; fast: least time to 99%% (flags that differ from the defaults still win)",
    )
    g.add_argument("--model", default="cnn", choices=list(MODELS), help="model from the zoo (default cnn)")
    g.add_argument("--epochs", type=int, default=epochs, help=f"epochs (default {epochs})")
    g.add_argument("--batch-size", type=int, default=128, help="training batch size (default 128)")
    g.add_argument("--test-batch-size", type=int, default=500)
    g.add_argument("--optimizer", default="adam", choices=OPTIMIZERS)
    g.add_argument("--lr", type=float, default=None, help="peak learning rate (default per optimizer)")
    g.add_argument("--schedule", default="onecycle", choices=SCHEDULES, help="LR schedule (default onecycle)")
    g.add_argument("--gamma", type=float, default=0.7, help="StepLR decay per epoch")
    g.add_argument("--seed", type=int, default=1)
    g.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N or mps")
    g.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    g.add_argument(
        "--target-acc",
        type=float,
        default=target,
        metavar="PCT",
        help=f"stop once test accuracy reaches PCT%% (default {target})",
    )
    g.add_argument(
        "--loader",
        default="resident",
        choices=LOADERS,
        help="resident: tensors in memory, sliced by index; torch: the classic DataLoader",
    )
    g.add_argument("--workers", type=int, default=0, help="DataLoader workers (with --loader torch)")
    g.add_argument("--log-every", type=int, default=50, help="steps per logged training point")
    g.add_argument("--train-subset", type=int, default=None, metavar="N", help="use the first N training images")
    g.add_argument("--test-subset", type=int, default=None, metavar="N", help="use the first N test images")


def add_run_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("run")
    g.add_argument("--out", default=None, help="run directory (default runs/<command>-<time>)")
    g.add_argument("--data-dir", default=None, help="MNIST laid out like torchvision's MNIST/raw (default: embedded)")
    g.add_argument("--no-tensorboard", action="store_true", help="skip TensorBoard logging")
    g.add_argument("--no-progress", action="store_true", help="no live progress bar")
    g.add_argument("--profile-steps", type=int, default=5, help="active profiled training steps (default 5)")
    g.add_argument(
        "--sort-by",
        default="self_cpu",
        choices=["self_cpu", "cpu_total", "self_device", "device_total", "calls", "flops"],
        help="order of the top-10 operator table",
    )


def train_config(args: argparse.Namespace):
    from dlscope.train import TrainConfig

    return TrainConfig.from_recipe(
        args.recipe,
        model=args.model,
        epochs=args.epochs,
        batch_size=args.batch_size,
        test_batch_size=args.test_batch_size,
        optimizer=args.optimizer,
        lr=args.lr,
        schedule=args.schedule,
        gamma=args.gamma,
        seed=args.seed,
        device=args.device,
        threads=args.threads,
        target_acc=args.target_acc,
        loader=args.loader,
        workers=args.workers,
        log_every=args.log_every,
        train_subset=args.train_subset,
        test_subset=args.test_subset,
    )


def run_pipeline(
    args: argparse.Namespace,
    command: str,
    step_names: Sequence[str],
    *,
    config: TrainConfig | None = None,
    extra: dict[str, Any] | None = None,
) -> int:
    from dlscope.console import console
    from dlscope.report.render import render_report
    from dlscope.rundir import RunDir
    from dlscope.steps import STEPS, STEPS_BY_NAME, LabContext, LabOptions, run_steps

    config = config or train_config(args)  # validate before creating anything on disk
    if args.profile_steps < 1:
        raise DlscopeError("--profile-steps must be ≥ 1")
    run = RunDir.create(args.out, command)
    options = LabOptions(
        data_dir=args.data_dir,
        tensorboard=not args.no_tensorboard,
        progress=not args.no_progress,
        profile_active=args.profile_steps,
        profile_sort=args.sort_by,
        resume=getattr(args, "resume", None),
        extra=extra or {},
    )
    ctx = LabContext(config=config, run=run, options=options)
    steps = [STEPS_BY_NAME[name] for name in step_names] if step_names else STEPS
    console.print(f"[phase]dlscope {command}[/] → [path]{run.path}[/]")
    try:
        run_steps(ctx, steps)
    finally:
        with phase("report"):
            html, md = render_report(run.path)
        print_locations(run, html, md)
    return 0


def print_locations(run, html: Path, md: Path) -> None:
    from rich.table import Table

    from dlscope.console import console

    rows = [
        ("report", str(html), f"and {md.name}: one file, works offline"),
        ("results", str(run.path / "results.json"), "the report's single source"),
    ]
    artifacts = {
        "tensorboard": f"dlscope tensorboard {run.path}",
        "profile": "trace.json opens in ui.perfetto.dev",
        "checkpoints": "dlscope ckpt verify <file>",
    }
    rows += [(name, str(run.path / name), hint) for name, hint in artifacts.items() if (run.path / name).exists()]
    table = Table(show_header=False, box=None, padding=(0, 2), title="where everything is", title_justify="left")
    table.add_column()
    # paths are never cut or wrapped (they are what the user copies); the hints wrap instead
    table.add_column(no_wrap=True, min_width=max(len(path) for _, path, _ in rows))
    table.add_column()
    for name, path, hint in rows:
        table.add_row(name, f"[path]{path}[/]", f"[dim]{hint}")
    console.print(table)
    status = run.results["run"]["status"]
    style = "good" if status == "ok" else "bad"
    console.print(f"[{style}]{status}[/] in {run.results['run'].get('wall_seconds', 0):.1f}s")


def keras_seed_options(args: argparse.Namespace) -> dict[str, Any]:
    return {"keras_seed": True, "keras_epochs": args.epochs, "keras_train_subset": args.train_subset}


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


def cmd_trace(args: argparse.Namespace) -> int:
    from dlscope.report.render import render_report
    from dlscope.rundir import RunDir
    from dlscope.steps import LabContext, LabOptions, iotrace, run_steps
    from dlscope.train import TrainConfig

    command = args.command_argv[1:] if args.command_argv[:1] == ["--"] else args.command_argv
    check_command(command)
    if args.repeats < 1:
        raise DlscopeError("--repeats must be ≥ 1")
    run = RunDir.create(args.out, "trace")
    extra = {
        "trace_command": command,
        "trace_backend": args.backend,
        "measure_overhead": args.measure_overhead,
        "overhead_repeats": args.repeats,
    }
    ctx = LabContext(config=TrainConfig(), run=run, options=LabOptions(extra=extra))
    try:
        run_steps(ctx, [iotrace.STEP])
    finally:
        html, md = render_report(run.path)
        print_locations(run, html, md)
    return run.results["sections"]["iotrace"]["exit_code"]


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


def int_list(text: str) -> list[int]:
    """'1,16,64' → [1, 16, 64]; each ≥ 1."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected integers ≥ 1, got {text!r}")
    return values


def device_list(text: str) -> list[str]:
    values = [v.strip() for v in text.split(",") if v.strip()]
    bad = [v for v in values if v != "cpu" and not (v == "cuda" or v.startswith("cuda:"))]
    if not values or bad:
        raise argparse.ArgumentTypeError(f"devices are cpu, cuda or cuda:N, comma-separated; got {text!r}")
    return values


def switch_list(text: str) -> list[bool]:
    """'off,on' → [False, True]."""
    words = {"off": False, "on": True}
    values = [v.strip() for v in text.split(",") if v.strip()]
    if not values or any(v not in words for v in values):
        raise argparse.ArgumentTypeError(f"expected off, on or off,on; got {text!r}")
    return [words[v] for v in values]


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


def cmd_report(args: argparse.Namespace) -> int:
    from dlscope.console import console
    from dlscope.report.render import render_report

    html, md = render_report(args.run)
    console.print(f"wrote [path]{html}[/] and [path]{md}[/]")
    return 0


def cmd_tensorboard(args: argparse.Namespace) -> int:
    logdir = Path(args.run) / "tensorboard"
    if not logdir.is_dir():
        raise DlscopeError("no tensorboard/ directory in this run", args.run)
    os.execvp(
        sys.executable,
        [
            sys.executable,
            "-m",
            "tensorboard.main",
            "--logdir",
            str(logdir),
            "--host",
            "127.0.0.1",
            "--port",
            str(args.port),
        ],
    )
    return 0  # not reached


def cmd_env(args: argparse.Namespace) -> int:
    from rich.table import Table

    from dlscope.console import console
    from dlscope.observe.environment import collect_environment, environment_rows

    table = Table(show_header=False, box=None, padding=(0, 2))
    for category, item, value in environment_rows(collect_environment()):
        table.add_row(f"[dim]{category}", item, f"[metric]{value}")
    console.print(table)
    return 0


def cmd_models(args: argparse.Namespace) -> int:
    from dlscope.console import console
    from dlscope.models import MODELS, build_model

    for name, spec in MODELS.items():
        params = sum(p.numel() for p in build_model(name).parameters())
        console.print(f"[metric]{name:6}[/] {params:>9,} params  {spec.description}")
    return 0


def cmd_data_fetch(args: argparse.Namespace) -> int:
    from dlscope.console import console
    from dlscope.data.mnist import fetch_mnist

    raw = fetch_mnist(args.mirror, args.dest)
    console.print(
        f"[good]verified[/] the four MNIST files into [path]{raw}[/]; use them with --data-dir {raw.parent.parent}"
    )
    return 0


def cmd_data_verify(args: argparse.Namespace) -> int:
    from dlscope.console import console
    from dlscope.data.mnist import load_mnist

    data = load_mnist(args.data_dir)
    for key, path in data.files.items():
        console.print(f"[good]ok[/] {key:13} [path]{path}[/]")
    console.print(
        f"{len(data.train_labels):,} train + {len(data.test_labels):,} test images, "
        f"checksums verified in {data.load_seconds:.2f}s"
    )
    return 0


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
    return run_pipeline(
        args, "ckpt-seed003", ["environment", "dataset", "ckpt_anatomy"], extra=keras_seed_options(args)
    )


def cmd_ckpt_inspect(args: argparse.Namespace) -> int:
    from dlscope.ckpt.inspect import inspect_checkpoint
    from dlscope.ckpt.show import print_anatomy
    from dlscope.console import console

    anatomy = inspect_checkpoint(args.path, stats=args.stats)
    if args.json:
        print(json.dumps(anatomy.to_dict(), indent=1, default=str))
    else:
        print_anatomy(anatomy, console, limit=args.limit)
    return 0 if anatomy.safe_to_load else 1


def cmd_ckpt_diff(args: argparse.Namespace) -> int:
    from dlscope.ckpt.diff import diff_checkpoints
    from dlscope.ckpt.show import print_diff
    from dlscope.console import console

    result = diff_checkpoints(args.a, args.b)
    if args.json:
        print(json.dumps(result, indent=1, default=str))
    else:
        print_diff(result, console, limit=args.limit)
    return 0 if result["identical"] else 1


def cmd_pipeline_prepare(args: argparse.Namespace) -> int:
    from dlscope.console import console
    from dlscope.data.pipeline import prepare_dataset, synthetic_samples
    from dlscope.errors import ConfigError

    formats = tuple(f.strip() for f in args.formats.split(","))
    if args.samples < 1 or args.sample_bytes < 1:
        raise ConfigError("--samples and --sample-bytes must be ≥ 1")
    if args.source == "mnist":
        from dlscope.data.mnist import load_mnist

        mnist = load_mnist(args.data_dir)
        n = min(args.samples, len(mnist.train_labels))
        labels = mnist.train_labels[:n].numpy().astype("uint8")
        samples = mnist.train_images[:n].reshape(n, -1).numpy()
    else:
        labels, samples = synthetic_samples(args.samples, args.sample_bytes, args.seed)
    manifest = prepare_dataset(args.out, labels, samples, args.source, args.shards, formats)
    console.print(
        f"[good]wrote[/] {manifest.samples:,} samples of {manifest.sample_bytes} B into [path]{args.out}[/]: "
        + ", ".join(f"{fmt} ({manifest.data_bytes(fmt) / 1e6:.1f} MB)" for fmt in manifest.formats)
        + f"; one file per sample is {manifest.record_file_bytes} B"
    )
    return 0


def cmd_pipeline_run(args: argparse.Namespace) -> int:
    from rich.table import Table

    from dlscope.console import console
    from dlscope.data.pipeline import ReaderConfig, SimulatedCompute, TrainingCompute, load_manifest, measure_epoch
    from dlscope.data.pipeline.sweep import COLUMNS, row_cells

    manifest = load_manifest(args.data, args.format)
    reader = ReaderConfig(
        args.format, args.read_buffer, args.shuffle_buffer, args.batch_size, args.workers, args.prefetch, args.seed
    )
    consumer = (
        TrainingCompute(args.train, args.device, manifest.sample_bytes, args.seed, args.threads)
        if args.train
        else SimulatedCompute(args.compute_ms / 1000)
    )
    m = measure_epoch(args.data, manifest, reader, consumer, cold=not args.warm, epoch=args.epoch)
    row = {"label": f"{args.format}", **m.to_dict()}
    console.print(
        f"[phase]{args.format}[/] · read buffer {reader.read_buffer:,} B · shuffle buffer {reader.shuffle_buffer:,} "
        f"· batch {reader.batch_size} · workers {reader.workers} · prefetch {reader.prefetch} · {manifest.samples:,} "
        f"samples of {manifest.sample_bytes} B"
    )
    table = Table(show_header=False, box=None, padding=(0, 2))
    for column, cell in zip(COLUMNS[1:], row_cells(row)[1:], strict=True):
        table.add_row(column, f"[metric]{cell:,}" if isinstance(cell, int | float) else f"[metric]{cell}")
    table.add_row("consumer", m.consumer)
    table.add_row("samples", f"{m.samples:,} in {m.steps:,} batches; exactly once: {'yes' if m.exactly_once else 'NO'}")
    table.add_row("order digest", m.order_digest)
    console.print(table)
    return 0 if m.exactly_once else 1


def cmd_pipeline_sweep(args: argparse.Namespace) -> int:
    from dlscope.data.pipeline.sweep import SweepPlan
    from dlscope.train import TrainConfig

    plan = SweepPlan(
        mnist_samples=args.samples,
        small_files=args.small_files,
        compute_ms=args.compute_ms,
        model=args.model,
        device=args.device,
        threads=args.threads,
        seed=args.seed,
        repeats=args.repeats,
    )
    config = TrainConfig(model=args.model, device=args.device, seed=args.seed)
    extra = {"pipeline_plan": plan, "pipeline_remove_data": args.remove_data}
    return run_pipeline(args, "pipeline-sweep", ["environment", "dataset", "pipeline"], config=config, extra=extra)


def add_pipeline_parsers(sub: argparse._SubParsersAction) -> None:
    from dlscope.data.pipeline import FORMATS
    from dlscope.data.pipeline.sweep import SweepPlan
    from dlscope.models import MODELS

    pipeline = sub.add_parser("pipeline", help="input pipelines: small files, shards, read/shuffle buffers, workers")
    pipe_sub = pipeline.add_subparsers(dest="pipeline_command", required=True, parser_class=Parser)

    p = pipe_sub.add_parser("prepare", help="write samples as small files, TFRecord shards and one array")
    p.add_argument("--out", required=True, help="new directory for the dataset")
    p.add_argument("--source", default="mnist", choices=["mnist", "synthetic"])
    p.add_argument("--samples", type=int, default=60_000, help="how many samples (default 60000)")
    p.add_argument("--sample-bytes", type=int, default=529, help="synthetic sample size (529: 550-byte files)")
    p.add_argument("--shards", type=int, default=8, help="TFRecord shards (default 8)")
    p.add_argument("--formats", default=",".join(FORMATS), help=f"comma-separated subset of {','.join(FORMATS)}")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data-dir", default=None, help="MNIST directory (default: embedded)")
    p.set_defaults(func=cmd_pipeline_prepare)

    p = pipe_sub.add_parser("run", help="measure one epoch of one pipeline configuration")
    p.add_argument("data", help="a directory made by `dlscope pipeline prepare`")
    p.add_argument("--format", default="tfrecord", choices=FORMATS)
    p.add_argument("--read-buffer", type=int, default=262_144, metavar="BYTES", help="bytes per read call")
    p.add_argument("--shuffle-buffer", type=int, default=0, metavar="N", help="records (0: no shuffle)")
    p.add_argument("--batch-size", type=int, default=500)
    p.add_argument("--workers", type=int, default=0, help="DataLoader worker processes")
    p.add_argument("--prefetch", type=int, default=2, help="batches prefetched (per worker)")
    p.add_argument("--warm", action="store_true", help="keep the page cache (default: evict it, a cold run)")
    p.add_argument("--compute-ms", type=float, default=5.0, help="simulated compute per batch (default 5 ms)")
    p.add_argument("--train", default=None, choices=list(MODELS), help="train this model instead of simulating")
    p.add_argument("--device", default="auto")
    p.add_argument("--threads", type=int, default=None, help="torch threads of the training consumer")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--epoch", type=int, default=0, help="epoch number (seeds the shuffle)")
    p.set_defaults(func=cmd_pipeline_run)

    p = pipe_sub.add_parser("sweep", help="seed 003's tables and more, with verdicts and a report")
    p.add_argument("--samples", type=int, default=SweepPlan.mnist_samples, help="MNIST samples (default %(default)s)")
    p.add_argument(
        "--small-files", type=int, default=SweepPlan.small_files, help="550-byte files (default %(default)s)"
    )
    p.add_argument(
        "--compute-ms",
        type=float,
        default=SweepPlan.compute_ms,
        help="simulated compute per batch (default %(default)s)",
    )
    p.add_argument(
        "--model", default=SweepPlan.model, choices=list(MODELS), help="training consumer (default %(default)s)"
    )
    p.add_argument("--device", default="auto")
    p.add_argument("--threads", type=int, default=SweepPlan.threads, help="torch threads of the training consumer")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--repeats",
        type=int,
        default=SweepPlan.repeats,
        help="interleaved runs per row, median kept (default %(default)s)",
    )
    p.add_argument("--remove-data", action="store_true", help="delete the prepared datasets afterwards")
    p.add_argument("--out", default=None, help="run directory (default runs/pipeline-sweep-<time>)")
    p.add_argument("--data-dir", default=None, help="MNIST laid out like torchvision's MNIST/raw (default: embedded)")
    p.add_argument("--no-progress", action="store_true", help="no live progress bar")
    # run_pipeline's observation options: nothing here trains under TensorBoard or the profiler
    p.set_defaults(func=cmd_pipeline_sweep, no_tensorboard=True, profile_steps=1, sort_by="self_cpu")


def build_parser() -> Parser:
    from dlscope.models import MODELS
    from dlscope.train import OPTIMIZERS

    parser = Parser(prog="dlscope", description="What a deep-learning training job does to a machine.")
    parser.add_argument("--version", action="version", version=f"dlscope {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)

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

    p = sub.add_parser(
        "trace",
        help="trace a command's file I/O through the OS: phases, files, data-flow diagram",
        usage="dlscope trace [--backend {auto,ebpf,strace,proc}] [--out RUN] [--measure-overhead] -- CMD [ARGS ...]",
    )
    p.add_argument("--backend", default="auto", choices=["auto", *TRACE_BACKENDS], help="tracer (default auto)")
    p.add_argument("--out", default=None, help="run directory (default runs/trace-<time>)")
    p.add_argument("--measure-overhead", action="store_true", help="also time untraced vs traced runs")
    p.add_argument("--repeats", type=int, default=3, help="runs of each kind for --measure-overhead (default 3)")
    p.add_argument("command_argv", nargs=argparse.REMAINDER, metavar="-- CMD", help="the command and its arguments")
    p.set_defaults(func=cmd_trace)

    p = sub.add_parser("report", help="re-render report.html and report.md from results.json")
    p.add_argument("run", help="run directory")
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

    add_pipeline_parsers(sub)
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


if __name__ == "__main__":
    sys.exit(main())
