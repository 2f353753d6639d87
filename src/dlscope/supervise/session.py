"""`dlscope run`'s measuring: start a command with the bootstrap in every Python process, let it
run as it would (its stdout, stderr and exit status are its own), then turn what its processes
recorded into results sections and one timeline — also after a crash, a kill or Ctrl-C. The
runner calls it through the `run` step (stages/script.py):

    run_command(Plan("run", ["run"], step_options=StepOptions(script=ScriptOptions(["python", "train.py"]))))
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dlscope.contract.env import PROFILE_ENV, RUN_DIR_ENV
from dlscope.contract.records import clocks
from dlscope.errors import HANG_EXIT_CODE, ConfigError, DlscopeError
from dlscope.options import ScriptOptions
from dlscope.rundir import PROCESSES, RunDir, processes_dir
from dlscope.supervise.bootstrap_env import with_bootstrap
from dlscope.supervise.cpushare import MachineShare
from dlscope.supervise.iotrace.gate import signal_group
from dlscope.supervise.iotrace.tracer import TraceOutcome, exit_code, trace_command, wait_command
from dlscope.supervise.watchdog import Watchdog

if TYPE_CHECKING:
    from dlscope.analysis.observed import Records

# What comes after the command (numpy, the analysis, the timeline: ~0.1 s of imports on an idle
# machine, several times that on a busy one) is imported when it is needed: the command starts
# without waiting for it (tests/test_run.py checks); the report's renderer, which the runner
# imports in a thread while the command runs, brings numpy in meanwhile.


def _run_plain(
    argv: list[str], env: dict[str, str], started: Callable[[int], None], options: ScriptOptions
) -> tuple[int, int | None]:
    """Return code and the signal that interrupted dlscope meanwhile (handed on to the command's
    process group, as the tracers do). Past `options.deadline_s` the group is killed."""
    output = open(options.output, "wb") if options.output else None  # noqa: SIM115 (closed below)
    try:
        child = subprocess.Popen(argv, env=env, process_group=0, cwd=options.cwd, stdout=output, stderr=output)
    except OSError as e:
        raise ConfigError(f"cannot start the command: {e.strerror}", argv[0]) from None
    finally:
        if output is not None:
            output.close()  # the child holds its own copy
    started(child.pid)  # the watchdog follows the job from its first process
    deadline = None
    if options.deadline_s is not None:
        deadline = threading.Timer(options.deadline_s, signal_group, (child.pid, signal.SIGKILL))
        deadline.start()
    try:
        return wait_command(child)
    finally:
        if deadline is not None:
            deadline.cancel()


def observe_command(run: RunDir, options: ScriptOptions, say: Callable[[str], None] = print) -> dict[str, Any]:
    """Run the command under observation into `run`; record the sections drawn from what its
    processes left (steps, anatomy, top10, phases, distributed, iotrace) — also after a crash, a
    kill or Ctrl-C — and return the "run" section: the command, its exit status, the signal that
    interrupted it (a name, or None) and `run_status` (how the runner ends the run)."""
    records_dir = run.fresh_sub(PROCESSES)
    profile = f"{options.start_after}:{options.wait}:{options.warmup}:{options.profile_steps}"
    base = {**os.environ, **options.extra_env}  # the command's own PYTHONPATH stays, after the bootstrap
    env = with_bootstrap(base, **{RUN_DIR_ENV: str(records_dir.resolve()), PROFILE_ENV: profile})
    started = clocks()
    iotrace: dict[str, Any] | None = None
    traced: TraceOutcome | None = None
    code, interrupted = 1, None
    watchdog = Watchdog(records_dir, run.path, options.hang, say, MachineShare())
    try:
        if options.trace_io:
            watchdog.start(None)  # no root pid here: the live files name the processes
            traced = trace_command(options.command, options.trace_backend, run.fresh_sub("iotrace"), say, env)
            iotrace = traced.section
            code, interrupted = traced.exit_code, iotrace["interrupted"]
        else:
            returncode, signum = _run_plain(options.command, env, watchdog.start, options)
            code, interrupted = exit_code(returncode), signal.Signals(signum).name if signum else None
        if watchdog.ended:
            code = HANG_EXIT_CODE  # the watchdog ended a hung job (documented exit status)
    finally:
        watchdog.stop()
        ended = clocks()
        try:
            section = record_sections(run, options, started, ended, iotrace)
            hang = watchdog.section()
            if hang is not None:
                run.record("hang", hang)
        finally:
            if traced is not None:
                traced.settle()  # bpftrace detached its probes meanwhile
    # a run in which no training step was seen is a failed observation, whatever the command's status
    observed = section["steps_seen"] > 0
    section.update(exit_code=code, interrupted=interrupted, run_status="ok" if code == 0 and observed else "failed")
    return section


def record_sections(
    run: RunDir, options: ScriptOptions, started: dict[str, int], ended: dict[str, int], iotrace: dict[str, Any] | None
) -> dict[str, Any]:
    """Record every section but "run", which is returned (the runner records it)."""
    import numpy as np

    from dlscope.analysis import batchflow, timeline
    from dlscope.analysis import observed as analysis
    from dlscope.analysis.ranks import ranks_apart

    # every record file decoded once, here, and handed to each analyser
    events = Path(iotrace["exports"]["events"]) if iotrace is not None else None
    observed = analysis.Observed.read(processes_dir(run.path), events)
    origin = started["realtime"] / 1e9
    found = analysis.sections(observed, origin, options.sort_by)
    clock = timeline.ClockMap.sampled(started, ended)
    backend = iotrace["backend"] if iotrace is not None else None
    if iotrace is not None:
        iotrace["exports"] = {key: run.rel(path) for key, path in iotrace["exports"].items()}
    main = observed.main()
    main_steps = observed.stream(main)[1] if main is not None else np.zeros(0)
    flow = batchflow.read_flow(
        processes_dir(run.path),
        main,
        main_steps,
        analysis.eval_spans(observed, origin),
        observed.syscalls(),
        clock.boottime_to_realtime if backend == "ebpf" else float,
    )
    path = timeline.build(observed, clock, run.path / "timeline.json", found["run"]["processes"], backend, flow)
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
    if found["steps"].get("file"):
        found["steps"]["file"] = run.rel(found["steps"]["file"])
    if found["top10"].get("trace"):
        found["top10"]["trace"] = run.rel(found["top10"]["trace"])
    for window in found["top10"]["windows"]:
        window["trace"] = run.rel(window["trace"])
    for window in found.get("gpu", {}).get("memory", []):
        window["snapshot"] = run.rel(window["snapshot"])
    for window in found.get("gpu", {}).get("profiled", []):
        window["trace"] = run.rel(window["trace"])
    batches = None
    if flow is not None:
        batches = batchflow.section(flow, main_steps, run.path / "batches.csv", iotrace is not None)
        verdict = found["anatomy"].get("verdict") or {}
        if verdict.get("key") == "input_bound" and batches["keeping_ahead"]:
            # the wait for batches the workers had built already is not their building
            verdict["batches_ready_pct"] = batches["keeping_ahead"]["ready_pct"]
    # first in the report, as in the terminal: its warnings (a shared machine, ranks apart) come first;
    # the runner records it whole, in this place, once the command's exit status is known
    run.record("run", found["run"])
    for name in ("steps", "anatomy", "top10", "phases", "gpu"):
        if name in found:
            run.record(name, found[name])
    ranked = rank_traces(observed.records)
    distributed = None
    if ranked:
        recorded = {rank: r["recorded"] for rank, r in ranked.items()}
        traces = {rank: Path(r["trace"]) for rank, r in ranked.items()}
        distributed = distributed_section(traces, run, recorded)
        if found["steps"].get("machine_shared"):
            distributed["machine_shared"] = found["steps"]["machine_shared"]
        run.record("distributed", distributed)
    apart = ranks_apart(analysis.rank_processes(observed), distributed)
    if apart is not None:  # said first, as the machine's share is
        found["run"]["findings"] = [apart.to_json(), *found["run"].get("findings", [])]
    if iotrace is not None:
        run.record("iotrace", iotrace)
    if batches is not None:
        run.record("batches", {**batches, "file": run.rel(run.path / "batches.csv")})
    if options.tensorboard and found["steps"]["count"]:
        main = found["steps"]["main_pid"]
        write_tensorboard(run.sub("tensorboard"), observed.stream(main)[1], observed.steps[main].codes)
    return found["run"]


def distributed_section(
    ranked: dict[int, Path], run: RunDir, recorded: dict[int, list[list[Any]]] | None = None
) -> dict[str, Any]:
    """The ranks' analysis (over the training steps each rank's window recorded, `recorded`); a
    trace a killed rank left cut short becomes a note, not a lost report."""
    from dlscope.analysis.ranks import analyze_ranks

    try:
        section = analyze_ranks(ranked, recorded=recorded)
    except DlscopeError as e:
        return {"note": f"no per-rank analysis: {e}"}
    section["traces"] = {rank: run.rel(path) for rank, path in section["traces"].items()}
    return section


def rank_traces(records: Records) -> dict[int, dict[str, Any]]:
    """Each rank's first profile record (its trace), when more than one rank of a distributed job
    left one."""
    from dlscope.analysis import observed as analysis

    ranked = {}
    for pid, rs in records.items():
        rank = analysis.process_info(pid, rs)["rank"]
        profile = next((r for r in rs if r.get("k") == "profile"), None)
        if rank is not None and profile is not None and Path(profile["trace"]).exists():
            ranked[rank] = profile
    return ranked if len(ranked) > 1 else {}


TENSORBOARD_POINTS = 20_000  # per scalar: a longer run is written every k-th step (the step file has all)


def write_tensorboard(directory: Path, table: Any, codes: dict[str, list[str | None]]) -> None:
    """Step time and its anatomy per step, as TensorBoard scalars in an event file written with
    TensorBoard's own record writer. Not torch's SummaryWriter nor TensorBoard's EventFileWriter:
    they load TensorFlow when it is installed (and Keras, and torch through it), hundreds of MiB
    in this process for a file of records."""
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.summary.writer.record_writer import RecordWriter

    from dlscope.analysis import steptable

    def scalar(tag: str, value: float, step: int) -> bytes:
        summary = Summary(value=[Summary.Value(tag=tag, simple_value=value)])
        return Event(wall_time=time.time(), step=step, summary=summary).SerializeToString()

    loader = codes["data_source"].index("loader")
    positions = steptable.stride_positions(len(table), TENSORBOARD_POINTS)
    directory.mkdir(parents=True, exist_ok=True)
    name = f"events.out.tfevents.{time.time():.0f}.{socket.gethostname()}"  # the name TensorBoard looks for
    with open(directory / name, "wb") as file:
        records = RecordWriter(file)
        records.write(Event(wall_time=time.time(), file_version="brain.Event:2").SerializeToString())
        for first in range(0, len(positions), steptable.CHUNK):
            chunk = table[positions[first : first + steptable.CHUNK]]
            parts = steptable.part_seconds(chunk, loader)
            for k, step in enumerate(chunk["i"].tolist()):
                records.write(scalar("step/ms", float(chunk["seconds"][k]) * 1e3, step))
                for part in steptable.PARTS:
                    records.write(scalar(f"anatomy/{part}_ms", parts[part][k] * 1e3, step))
