"""dlscope trace: a command's file I/O through the OS."""

from __future__ import annotations

import argparse
import signal

from dlscope.cli.common import (
    print_locations,
)
from dlscope.errors import DlscopeError, Interrupted
from dlscope.observe.iotrace.tracer import BACKENDS as TRACE_BACKENDS  # stdlib only: cheap
from dlscope.observe.iotrace.tracer import check_command


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
        section = run.results["sections"]["iotrace"]
        mark_interrupted(run, section)
    finally:
        html, md = render_report(run.path)
        print_locations(run, html, md)
        run.release()
    if section["interrupted"]:  # the report is written; now dlscope ends as the user asked
        raise Interrupted(signal.Signals[section["interrupted"]])
    return section["exit_code"]


def mark_interrupted(run, section: dict) -> None:
    """A trace cut short by the user's signal is an interrupted run, though its section is complete."""
    if section["interrupted"]:
        run.results["run"]["signal"] = section["interrupted"]
        run.finish("interrupted")


def register(sub: argparse._SubParsersAction) -> None:
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
