"""What every command shares: the parser class, training and run flags, and the call into the runner.

Nothing here imports torch: `dlscope --help` and the file-only commands start fast."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from dlscope.cli.help import HelpFormatter, Subcommands, examples_epilog
from dlscope.options import OP_SORT_KEYS

if TYPE_CHECKING:
    from dlscope.config import TrainConfig
    from dlscope.options import ProfileOptions, RunOptions, StepOptions


Options = TypeVar("Options")


def flag_values(kind: type, args: argparse.Namespace) -> dict[str, Any]:
    """The fields of `kind` (a dataclass) that have a flag of the same name, with the flags' values."""
    return {f.name: getattr(args, f.name) for f in dataclasses.fields(kind) if hasattr(args, f.name)}


def from_flags(kind: type[Options], args: argparse.Namespace, **given: Any) -> Options:
    """Options (a dataclass) from the flags of the same names; `given`: the fields whose flags differ."""
    return kind(**{**flag_values(kind, args), **given})


class Given(argparse.Action):
    """Stores the value and notes that the user typed the option (`--resume` keeps the
    checkpoint's setting unless the user gave one)."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        setattr(namespace, self.dest, values)
        setattr(namespace, f"{self.dest}_given", True)


class Parser(argparse.ArgumentParser):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        command = (kwargs.get("prog") or "dlscope").removeprefix("dlscope").strip()
        kwargs.setdefault("epilog", examples_epilog(command))
        kwargs.setdefault("formatter_class", HelpFormatter)
        kwargs.setdefault("allow_abbrev", False)  # `--trace-i` is an error, never a guess
        super().__init__(*args, **kwargs)
        self.register("action", "parsers", Subcommands)

    def error(self, message: str) -> None:  # one line, exit 2, as for every other bad input
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def command_of(args: argparse.Namespace) -> list[str]:
    """The command after `--` (run, trace, doctor): the arguments as given, the `--` dropped."""
    return args.command_argv[1:] if args.command_argv[:1] == ["--"] else args.command_argv


def add_training_args(p: argparse.ArgumentParser, epochs: int = 2, target: float | None = 99.0) -> None:
    from dlscope.config import LOADERS, OPTIMIZERS, RECIPES, SCHEDULES

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
        help="time threads, convolution backends, layouts and the optimizer's kernel on the first steps "
        "(torch.compile too when the run is long enough to pay it back); train with the fastest",
    )
    g.add_argument("--model", default="cnn", help="model from the zoo, listed by `dlscope models` (default cnn)")
    g.add_argument(
        "--epochs",
        type=int,
        default=epochs,
        action=Given,
        help=f"epochs (default {epochs}; with --resume: the total to reach, default the checkpoint's)",
    )
    g.add_argument("--batch-size", type=int, default=128, help="training batch size (default 128)")
    g.add_argument("--test-batch-size", type=int, default=500)
    g.add_argument("--optimizer", default="adam", choices=OPTIMIZERS)
    g.add_argument("--lr", type=float, default=None, help="peak learning rate (default per optimizer)")
    g.add_argument("--schedule", default="onecycle", choices=SCHEDULES, help="LR schedule (default onecycle)")
    g.add_argument("--gamma", type=float, default=0.7, help="StepLR decay per epoch")
    g.add_argument("--seed", type=int, default=1)
    g.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N or mps")
    g.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch intra-op threads (per rank with --nproc-per-node: default cores / ranks)",
    )
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


def add_dist_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("distributed (torchrun, DDP)")
    g.add_argument(
        "--nproc-per-node",
        type=int,
        default=1,
        metavar="N",
        help="train in N processes (ranks) on this machine under torchrun; --batch-size stays the global "
        "batch, each rank takes batch/N of it (default 1: no torchrun)",
    )
    g.add_argument("--nnodes", type=int, default=1, metavar="M", help="machines in the job (default 1)")
    g.add_argument("--node-rank", type=int, default=0, metavar="R", help="this machine's index, 0…M-1")
    g.add_argument(
        "--rdzv-endpoint", default=None, metavar="HOST:PORT", help="c10d rendezvous every node reaches (M > 1)"
    )
    g.add_argument("--max-restarts", type=int, default=0, metavar="K", help="restart the ranks K times after a failure")
    g.add_argument(
        "--bucket-cap-mb", type=float, default=25.0, metavar="MB", help="DDP gradient bucket size (default 25)"
    )
    g.add_argument(
        "--ckpt-format",
        default="torch",
        choices=["torch", "dcp"],
        help="torch: last.pt by rank 0; dcp: torch.distributed.checkpoint directory by every rank",
    )


def _seconds_or_off(text: str) -> float | None:
    if text == "off":
        return None
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds or off, got {text!r}") from None


def add_hang_args(p: argparse.ArgumentParser) -> None:
    """The hang watchdog's flags (dlscope run, and the training of lab and train)."""
    g = p.add_argument_group("hang watchdog")
    g.add_argument(
        "--hang-after",
        type=_seconds_or_off,
        default=90.0,
        metavar="S|off",
        help="hung when no step ends for max(--hang-factor × median step, S) seconds (default 90; off: no watchdog)",
    )
    g.add_argument("--hang-factor", type=float, default=20.0, metavar="K", help="see --hang-after (default 20)")
    g.add_argument(
        "--on-hang",
        default="wait",
        choices=["wait", "end"],
        help="after capturing a hung job: keep waiting (default), or end it (exit status 124)",
    )


def add_run_args(p: argparse.ArgumentParser, tensorboard: bool = False) -> None:
    g = p.add_argument_group("run")
    g.add_argument("--out", default=None, help="run directory (default runs/<command>-<time>)")
    g.add_argument("--data-dir", default=None, help="MNIST laid out like torchvision's MNIST/raw (default: embedded)")
    g.add_argument("--no-progress", action="store_true", help="no live progress bar")
    if tensorboard:
        g.add_argument("--no-tensorboard", action="store_true", help="skip TensorBoard logging")


def add_profile_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("profiler")
    g.add_argument("--profile-steps", type=int, default=5, help="active profiled training steps (default 5)")
    g.add_argument(
        "--sort-by",
        default="self_cpu",
        choices=OP_SORT_KEYS,
        metavar="KEY",
        help="order of the top-10 operator table: self_cpu, cpu_total, self_device, device_total, calls or flops "
        "(default self_cpu)",
    )


def profile_options(args: argparse.Namespace) -> ProfileOptions:
    from dlscope.options import ProfileOptions

    return ProfileOptions(active=args.profile_steps, sort_by=args.sort_by)


def train_config(args: argparse.Namespace) -> TrainConfig:
    from dlscope.config import TrainConfig

    return TrainConfig.from_recipe(args.recipe, **flag_values(TrainConfig, args))


def run_options(args: argparse.Namespace) -> RunOptions:
    from dlscope.options import RunOptions

    return RunOptions(
        out=args.out,
        data_dir=args.data_dir,
        tensorboard=not getattr(args, "no_tensorboard", False),
        progress=not args.no_progress,
    )


def run_builtin_command(
    args: argparse.Namespace,
    command: str,
    steps: Sequence[str],
    *,
    config: TrainConfig | None = None,
    step_options: StepOptions | None = None,
) -> int:
    """Run `steps` of the built-in job through the runner (every training command ends here)."""
    from dlscope.options import StepOptions
    from dlscope.plan import Plan
    from dlscope.runner import run_command, run_traced

    plan = Plan(
        command,
        list(steps),
        config or train_config(args),  # validated before anything is created on disk
        run_options(args),
        step_options or StepOptions(),
        args.raw_argv,
    )
    if getattr(args, "trace_io", False):
        return run_traced(plan, args.trace_backend)
    run_command(plan)
    return 0


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
