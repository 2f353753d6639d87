"""dlscope run: observe any PyTorch training script, unchanged, on one timeline."""

from __future__ import annotations

import argparse

from dlscope.cli.common import add_hang_args, command_of, from_flags
from dlscope.options import OP_SORT_KEYS, TRACE_BACKENDS


def cmd_run(args: argparse.Namespace) -> int:
    from dlscope.options import HangOptions, RunOptions, ScriptOptions, StepOptions
    from dlscope.runner import Plan, observe

    script = from_flags(ScriptOptions, args, command=command_of(args), hang=from_flags(HangOptions, args))
    options = RunOptions(out=args.out, terminal="full" if args.verbose else "summary")
    plan = Plan("run", ["run"], options=options, step_options=StepOptions(script=script))
    return observe(plan)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "run",
        help="observe any PyTorch training script, unchanged: steps, anatomy, top-10, phases, one timeline",
        allow_abbrev=False,
    )
    p.add_argument("--out", default=None, help="run directory (default runs/run-<time>)")
    p.add_argument(
        "--verbose",
        action="store_true",
        help="print the whole report after the summary: every section's tables and reasoning, how it was measured",
    )
    p.add_argument("--trace-io", action="store_true", help="also trace the command's file I/O through the OS")
    p.add_argument("--trace-backend", default="auto", choices=["auto", *TRACE_BACKENDS], help="tracer for --trace-io")
    p.add_argument(
        "--profile-steps", type=int, default=5, metavar="N", help="active profiled steps (0: off; default 5)"
    )
    p.add_argument("--wait", type=int, default=1, metavar="N", help="profiler schedule: steps skipped (default 1)")
    p.add_argument("--warmup", type=int, default=2, metavar="N", help="profiler schedule: warm-up steps (default 2)")
    p.add_argument("--start-after", type=int, default=1, metavar="N", help="steps before the profiler starts")
    p.add_argument(
        "--sort-by",
        default="self_cpu",
        choices=OP_SORT_KEYS,
        metavar="KEY",
        help=f"top-10 order: {', '.join(OP_SORT_KEYS)}",
    )
    p.add_argument("--tensorboard", action="store_true", help="write step time and anatomy as TensorBoard scalars")
    add_hang_args(p)
    p.add_argument("command_argv", nargs=argparse.REMAINDER, metavar="-- CMD", help="the command and its arguments")
    p.set_defaults(func=cmd_run)
