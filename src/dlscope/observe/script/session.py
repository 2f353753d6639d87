"""`dlscope run`: start a command with the bootstrap in every Python process, let it run as it
would (its stdout, stderr and exit status are its own), then turn what its processes recorded
into results sections, a report and one timeline — also after a crash, a kill or Ctrl-C.

    run, exit_code = run_script(ScriptOptions(["python", "train.py"]))
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dlscope.errors import ConfigError, DlscopeError
from dlscope.observe.bootstrap_env import with_bootstrap
from dlscope.observe.distributed.analysis import analyze_ranks
from dlscope.observe.hang.watchdog import Watchdog  # hang
from dlscope.observe.iotrace.tracer import (
    check_command,
    exit_code,
    read_jsonl,
    trace_command,
    wait_command,
)
from dlscope.observe.script import analysis, timeline
from dlscope.observe.script.hooks import PROFILE_ENV
from dlscope.observe.script.records import clocks, read_records
from dlscope.options import HANG_EXIT_CODE, ScriptOptions  # hang: HANG_EXIT_CODE
from dlscope.rundir import RunDir


def _run_plain(argv: list[str], env: dict[str, str], started: Callable[[int], None]) -> tuple[int, int | None]:
    """Return code and the signal that interrupted dlscope meanwhile (handed on to the command's
    process group, as the tracers do)."""
    try:
        child = subprocess.Popen(argv, env=env, process_group=0)
    except OSError as e:
        raise ConfigError(f"cannot start the command: {e.strerror}", argv[0]) from None
    started(child.pid)  # hang: the watchdog follows the job from its first process
    return wait_command(child)


def run_script(options: ScriptOptions, say: Callable[[str], None] = print) -> tuple[RunDir, int]:
    """Run the command under observation; the run directory and the command's exit status."""
    check_command(options.command)
    run = RunDir.create(options.out, "run")
    records_dir = run.sub("processes")
    profile = f"{options.start_after}:{options.wait}:{options.warmup}:{options.profile_steps}"
    base = {**os.environ, **options.extra_env}  # the command's own PYTHONPATH stays, after the bootstrap
    env = with_bootstrap(base, DLSCOPE_RUN_DIR=str(records_dir.resolve()), **{PROFILE_ENV: profile})
    started = clocks()
    iotrace: dict[str, Any] | None = None
    status = "failed"
    watchdog = Watchdog(records_dir, run.path, options.hang, say)  # hang
    try:
        if options.trace_io:
            watchdog.start(None)  # hang: no root pid here; the live files name the processes
            outcome = trace_command(options.command, options.trace_backend, run.sub("iotrace"), say, env)
            iotrace = outcome.section
            code, interrupted = outcome.exit_code, iotrace["interrupted"] is not None
        else:
            returncode, signum = _run_plain(options.command, env, watchdog.start)  # hang
            code, interrupted = exit_code(returncode), signum is not None
        status = "interrupted" if interrupted else ("ok" if code == 0 else "failed")
        code, status = (HANG_EXIT_CODE, "hung") if watchdog.ended else (code, status)  # hang
    finally:
        watchdog.stop()  # hang
        ended = clocks()
        record_sections(run, options, started, ended, iotrace)
        if watchdog.section() is not None:  # hang
            run.record("hang", watchdog.section())  # hang
        run.finish(status)
    run.results["sections"]["run"].update(exit_code=code, interrupted=interrupted)
    run.save()
    return run, code


def record_sections(
    run: RunDir, options: ScriptOptions, started: dict[str, int], ended: dict[str, int], iotrace: dict[str, Any] | None
) -> None:
    records = read_records(run.path / "processes")
    origin = started["realtime"] / 1e9
    found = analysis.sections(records, origin, options.sort_by)
    clock = timeline.ClockMap.sampled(started, ended)
    kineto = [Path(r["trace"]) for rs in records.values() for r in rs if r.get("k") == "profile"]
    syscalls = None
    if iotrace is not None:
        syscalls = read_jsonl(Path(iotrace["exports"]["events"]))
        iotrace["exports"] = {key: run.rel(path) for key, path in iotrace["exports"].items()}
    path = timeline.build(
        records,
        [p for p in kineto if p.exists()],
        syscalls,
        iotrace["backend"] if iotrace else None,
        clock,
        run.path / "timeline.json",
        found["run"]["processes"],
    )
    found["run"].update(
        command=options.command,
        wall_seconds=round((ended["realtime"] - started["realtime"]) / 1e9, 3),
        timeline=run.rel(path),
        clock_drift_ns=clock.drift_ns,
        profile_schedule={
            "start_after": options.start_after,
            "wait": options.wait,
            "warmup": options.warmup,
            "active": options.profile_steps,
        },
        trace_io=options.trace_io,
    )
    if found["top10"].get("trace"):
        found["top10"]["trace"] = run.rel(found["top10"]["trace"])
    for name in ("run", "steps", "anatomy", "top10", "phases"):
        run.record(name, found[name])
    ranked = rank_traces(records)
    if ranked:
        run.record("distributed", distributed_section(ranked, run))
    if iotrace is not None:
        run.record("iotrace", iotrace)
    if options.tensorboard:
        write_tensorboard(run.sub("tensorboard"), found["steps"])


def distributed_section(ranked: dict[int, Path], run: RunDir) -> dict[str, Any]:
    """The ranks' analysis; a trace a killed rank left cut short becomes a note, not a lost report."""
    try:
        section = analyze_ranks(ranked)
    except DlscopeError as e:
        return {"note": f"no per-rank analysis: {e}"}
    section["traces"] = {rank: run.rel(path) for rank, path in section["traces"].items()}
    return section


def rank_traces(records: analysis.Records) -> dict[int, Path]:
    """Each rank's profiler trace, when more than one rank of a distributed job left one."""
    ranked = {}
    for pid, rs in records.items():
        rank = analysis.process_info(pid, rs)["rank"]
        trace = next((Path(r["trace"]) for r in rs if r.get("k") == "profile"), None)
        if rank is not None and trace is not None and trace.exists():
            ranked[rank] = trace
    return ranked if len(ranked) > 1 else {}


def write_tensorboard(directory: Path, steps: dict[str, Any]) -> None:
    """Step time and its anatomy per step, as TensorBoard scalars."""
    from torch.utils.tensorboard import SummaryWriter

    with SummaryWriter(str(directory)) as writer:
        for row in steps["rows"]:
            writer.add_scalar("step/ms", row["ms"], row["step"])
            for part in analysis.PARTS:
                writer.add_scalar(f"anatomy/{part}_ms", row[f"{part}_ms"], row["step"])
