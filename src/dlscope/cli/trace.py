"""dlscope trace: a command's file I/O through the OS."""

from __future__ import annotations

import argparse

from dlscope.cli.common import command_of
from dlscope.options import TRACE_BACKENDS


def cmd_trace(args: argparse.Namespace) -> int:
    from dlscope.options import RunOptions, StepOptions, TraceOptions
    from dlscope.plan import Plan
    from dlscope.runner import run_command

    command = command_of(args)
    trace = TraceOptions(command, args.backend, args.measure_overhead, args.repeats)
    plan = Plan("trace", ["iotrace"], options=RunOptions(out=args.out), step_options=StepOptions(iotrace=trace))
    plan.argv = args.raw_argv
    results = run_command(plan)
    return results["sections"]["iotrace"]["exit_code"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "trace",
        help="trace a command's file I/O through the OS: phases, files, data-flow diagram",
        usage="dlscope trace [-h] [--backend {auto,ebpf,strace,proc}] [--out RUN]\n"
        "                     [--measure-overhead] [--repeats N] -- CMD [ARGS ...]",
    )
    p.add_argument("--backend", default="auto", choices=["auto", *TRACE_BACKENDS], help="tracer (default auto)")
    p.add_argument("--out", default=None, metavar="RUN", help="run directory (default runs/trace-<time>)")
    p.add_argument("--measure-overhead", action="store_true", help="also time untraced vs traced runs")
    p.add_argument("--repeats", type=int, default=3, metavar="N", help="runs of each kind for --measure-overhead")
    p.add_argument("command_argv", nargs=argparse.REMAINDER, metavar="-- CMD", help="the command and its arguments")
    p.set_defaults(func=cmd_trace)
