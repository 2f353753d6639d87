"""dlscope doctor: what to change in a training script, the gain predicted, and the gain measured."""

from __future__ import annotations

import argparse

from dlscope.cli.common import command_of, from_flags


def cmd_doctor(args: argparse.Namespace) -> int:
    from dlscope.options import DoctorOptions, RunOptions, StepOptions
    from dlscope.runner import Plan, run_command

    doctor = from_flags(DoctorOptions, args, command=command_of(args), budget_s=args.budget)
    plan = Plan("doctor", ["doctor"], options=RunOptions(out=args.out), step_options=StepOptions(doctor=doctor))
    return run_command(plan)["sections"]["doctor"]["exit_code"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "doctor",
        help="what to change in a training script: candidate changes predicted, then measured on the script, unchanged",
        allow_abbrev=False,
    )
    p.add_argument("--out", default=None, help="run directory (default runs/doctor-<time>)")
    p.add_argument(
        "--budget", type=float, default=120.0, metavar="SECONDS", help="wall time for all trials (default 120)"
    )
    p.add_argument("--warmup-steps", type=int, default=3, metavar="N", help="steps of each trial not counted")
    p.add_argument("--max-steps", type=int, default=40, metavar="N", help="counted steps per trial at most")
    p.add_argument("--rounds", type=int, default=3, metavar="N", help="baseline/candidate rounds, interleaved, at most")
    p.add_argument("command_argv", nargs=argparse.REMAINDER, metavar="-- CMD", help="the command and its arguments")
    p.set_defaults(func=cmd_doctor)
