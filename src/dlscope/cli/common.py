"""What every command shares: the argument parser class, training and run options, the run pipeline."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dlscope import phase
from dlscope.errors import DlscopeError

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
    g.add_argument(
        "--autotune",
        action="store_true",
        help="time layouts, convolution backends and threads on the first steps; train with the fastest",
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
    g.add_argument("--eval-every", type=int, default=None, metavar="N", help="also evaluate the test set every N steps")
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
        eval_every=args.eval_every,
        autotune=args.autotune,
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
