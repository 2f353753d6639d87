"""One path for every command: plan → run directory → steps → results.json → report.

    run_command(Plan("train", ["environment", "dataset", "model", "train", "checkpoint"], config, options))

Each step's section is recorded the moment it exists (a crash keeps the earlier ones) and shown
on the terminal as the same Blocks the report renders. `--trace-io` runs the same plan in a
child process under the tracer: the child writes the steps, the parent adds the trace section and
renders the report once.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from dlscope.errors import (
    CheckpointError,
    ConfigError,
    DatasetError,
    DlscopeError,
    Interrupted,
    interrupt_signal,
    os_faults_named,
)
from dlscope.options import RunOptions
from dlscope.phases import phase
from dlscope.plan import Plan, plan_from_json, plan_to_json
from dlscope.rundir import results_path


def check_plan(plan: Plan) -> None:
    """Refuse a plan that cannot run, before anything is created."""
    from dlscope.stages.registry import STEP_MODULES, step_named

    if "train" in plan.steps and plan.step_options.train.resume:
        from dlscope.restore import load_checkpoint

        load_checkpoint(plan.step_options.train.resume)  # a bad file: one line, and nothing created
    unknown = [s for s in plan.steps if s not in STEP_MODULES]
    if unknown:
        raise ConfigError(f"unknown step {', '.join(unknown)}; choose from {', '.join(STEP_MODULES)}")
    for i, name in enumerate(plan.steps):
        if "trained" in step_named(name).needs and "train" not in plan.steps[:i]:
            raise ConfigError(f"step {name} needs the train step before it")
    plan.step_options.dist.check(plan.config.batch_size, plan.config.autotune)
    keras_on_tf = "ckpt_anatomy" in plan.steps and plan.step_options.ckpt_anatomy.keras_backend == "tensorflow"
    if keras_on_tf or ("pipeline" in plan.steps and "tfdata" in plan.step_options.pipeline.plan.engines):
        from dlscope.experiments.pipeline.tfdata import import_tensorflow

        import_tensorflow()  # missing TF: one line before any run directory is made
    # `dlscope trace|run|doctor -- CMD`: a command that cannot start, one line and nothing created
    given = plan.step_options
    observed = {"iotrace": given.iotrace, "run": given.script, "doctor": given.doctor}
    for name in OBSERVING_STEPS & set(plan.steps):
        from dlscope.supervise.iotrace.tracer import check_command

        check_command(observed[name].command if observed[name] else [])
    if "sweep" in plan.steps:
        from dlscope.stages.sweep import grid

        grid(plan.step_options.sweep)
    if "merge" in plan.steps and plan.step_options.merge is not None:
        from dlscope.stages.merge import check

        check(plan.step_options.merge)  # two jobs, no run, a damaged Parquet file: one line, nothing created
    check_inputs(plan)


def check_inputs(plan: Plan) -> None:
    """The data, checkpoint and devices the plan names exist here: a run that cannot work fails
    before it prints its environment and dataset, not once it reaches them."""
    data_dir, resume = plan.options.data_dir, plan.step_options.train.resume
    if data_dir is not None and not Path(data_dir).expanduser().is_dir():
        raise DatasetError("data directory does not exist", data_dir)
    if resume is not None and "train" in plan.steps and not Path(resume).exists():
        raise CheckpointError("checkpoint to resume from not found", resume)
    if not set(plan.steps) - {"environment", "iotrace", "run", "doctor", "merge"}:
        return  # nothing runs on a device here: no torch needed
    from dlscope.train import resolve_device

    devices = [plan.config.device]
    if "sweep" in plan.steps:
        devices += plan.step_options.sweep.devices or []
    for device in devices:
        resolve_device(device)


def run_command(plan: Plan, render: bool = True) -> dict[str, Any]:
    """Run the plan's steps into a new (or given) run directory; its results as recorded."""
    from dlscope.console import console
    from dlscope.rundir import RunDir

    check_plan(plan)
    if render and set(plan.steps) <= OBSERVING_STEPS:
        start_importing_the_renderer()
    run = RunDir.create(plan.options.out, plan.command, argv=plan.argv)
    try:
        if render:
            console.print(f"[phase]dlscope {plan.command}[/] → [path]{run.path}[/]")
        run_steps(plan, run)
    except KeyboardInterrupt as e:
        if run.results["run"]["status"] == "running":  # stopped before the first step began
            run.results["run"]["signal"] = interrupt_signal(e).name
            run.finish("interrupted")
        raise
    finally:
        if render:
            finish_report(run, plan.options.terminal)
        run.release()
    return run.results


def observe(plan: Plan) -> int:
    """`dlscope run`: the command observed into its run directory; its exit status. A launcher of a
    job on several machines (torchrun --nnodes N > 1) writes its run as its node's part of the
    job directory --out (<out>/hosts/<host>-<pid>: launchers sharing one --out never write into
    each other's) and, the last of the job's nodes to finish, merges them all into --out."""
    import socket

    from dlscope.rundir import MERGE_LOCK, RunDir, node_part
    from dlscope.supervise.launcher import nodes_of

    script = plan.step_options.script
    if script is None or nodes_of(script.command) <= 1:
        return run_command(plan)["sections"]["run"]["exit_code"]
    job = Path(plan.options.out) if plan.options.out else RunDir.fresh_path(plan.command)
    part = node_part(job, socket.gethostname(), os.getpid())
    results = run_command(dataclasses.replace(plan, options=dataclasses.replace(plan.options, out=str(part))))
    merge_when_whole(job, job / MERGE_LOCK)
    return results["sections"]["run"]["exit_code"]


def merge_when_whole(job: Path, lock: Path) -> None:
    """Merge the job directory's node parts into it when this launcher finds the job whole. The
    check and the merge hold `lock` (flock, blocking): a launcher that finishes meanwhile checks
    after, and finds the merge done or its own part the last one in."""
    import fcntl

    from dlscope.options import MergeOptions, StepOptions
    from dlscope.stages.merge import whole_job

    with open(lock, "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        whole = whole_job(job)
        if whole.error is not None:
            say(f"dlscope: the job's runs in {job} are not merged: {whole.error}")
        elif whole.merged_already:
            say(f"dlscope: merged already into {job}")
        elif whole.parts is None:
            say(
                f"dlscope: {whole.ranks} of {whole.world_size or '?'} ranks in {job}: the report of the whole job "
                "comes once the other nodes' runs are in (launchers sharing this --out), or from `dlscope merge`"
            )
        if whole.parts is None:
            return
        merge = MergeOptions([str(p) for p in whole.parts])
        run_command(Plan("merge", ["merge"], options=RunOptions(out=str(job)), step_options=StepOptions(merge=merge)))


# Steps that observe a command in a child process: their own process waits while it runs
OBSERVING_STEPS = {"iotrace", "run", "doctor"}


def start_importing_the_renderer() -> None:
    """Import the report's renderer and matplotlib (~2 s on a quiet 2-core machine, several under
    load) in a thread while this process waits for a command, so the report is written sooner
    once the command ends."""

    def load() -> None:
        # a failure is left to the report's own import, which raises it where the user sees it
        with suppress(Exception):
            from dlscope.report import plots, render  # noqa: F401

    threading.Thread(target=load, name="dlscope-report-import", daemon=True).start()


def run_steps(plan: Plan, run: Any) -> None:
    from dlscope.console import console
    from dlscope.report.sections import SECTIONS
    from dlscope.report.terminal import print_blocks
    from dlscope.stages.base import Context
    from dlscope.stages.registry import step_named

    if plan.config.threads:  # once, for every step (the Trainer applies it again for API users)
        import torch

        torch.set_num_threads(plan.config.threads)
    ctx = Context(plan.config, run, plan.options, plan.step_options, task=progress_task(plan.options.progress), say=say)
    status, command_failed = "failed", False
    step = None
    each_section = plan.options.terminal == "sections"  # else the summary, once the run ends (finish_report)
    try:
        for name in plan.steps:
            step = step_named(name)
            section_renderer = SECTIONS[name]
            console.rule(f"[phase]{section_renderer.TITLE}", align="left", style="dim")
            provide(ctx, step.needs)
            start = time.perf_counter()
            place = len(run.results["steps"])  # its section goes before those it records itself
            with phase(step.name), os_faults_named(run.path, f"run the {step.name} step"):
                section = step.run(ctx)  # the phase is visible to --trace-io, ~µs otherwise
            section["seconds"] = round(time.perf_counter() - start, 3)
            run.record(step.name, section, at=place)
            if each_section:
                print_blocks(section_renderer.render(run.results["sections"][step.name]))
                print_also(step, run)
            if section.get("interrupted"):  # a traced command cut short by the user: recorded, now stop
                raise Interrupted(signal.Signals[section["interrupted"]])
            command_failed |= section.get("run_status") == "failed"  # the user's command (dlscope run) failed
        status = "failed" if command_failed else "ok"
    except KeyboardInterrupt as e:
        status = "interrupted"
        run.results["run"]["signal"] = interrupt_signal(e).name
        raise
    except Exception as e:
        run.results["run"]["error"] = str(e) if isinstance(e, DlscopeError) else f"{type(e).__name__}: {e}"
        if isinstance(e, DlscopeError) and step is not None and each_section:  # what it recorded of its failure
            print_also(step, run)
        raise
    finally:
        run.finish(status)


def print_also(step: Any, run: Any) -> None:
    """The sections `step` recorded itself, after its own."""
    from dlscope.console import console
    from dlscope.report.sections import SECTIONS
    from dlscope.report.terminal import print_blocks

    for name in (n for n in step.also if n in run.results["sections"]):
        console.rule(f"[phase]{SECTIONS[name].TITLE}", align="left", style="dim")
        print_blocks(SECTIONS[name].render(run.results["sections"][name]))


def say(text: str) -> None:
    from dlscope.console import err_console, safe

    err_console.print(safe(text))


def provide(ctx: Any, needs: tuple[str, ...]) -> None:
    """Build what a step needs and nothing more: data for most, a trainer for a few."""
    if ("dataset" in needs or "trainer" in needs) and ctx.data is None:
        from dlscope.data.mnist import load_mnist

        ctx.data = load_mnist(ctx.options.data_dir)
    if "trainer" in needs and ctx.trainer is None:
        from dlscope.autotune import autotune
        from dlscope.train import Trainer

        tuner = autotune if ctx.config.autotune else None
        ctx.trainer = Trainer(ctx.config, ctx.data, tuner=tuner)  # alone (`dlscope profile`): a fresh model


def progress_task(enabled: bool):
    """ctx.task for steps: a transient progress bar on stderr (steps never import rich)."""

    @contextmanager
    def task(description: str, total: int | None = None) -> Iterator[Any]:
        from dlscope.console import step_progress

        with step_progress(enabled) as progress:
            handle = progress.add_task(description, total=total)

            class Bar:
                def update(self, description: str | None = None, total: int | None = None, advance: int = 0) -> None:
                    progress.update(handle, description=description, total=total, advance=advance)

            yield Bar()

    return task


def finish_report(run: Any, terminal: str = "sections") -> None:
    """Print the summary (or the whole report) where the terminal shows one, render report.html/md
    and say where everything is. A rendering failure while a step's error is already on its way
    out is reported in one line, so it never hides the original error."""
    from dlscope.report.render import render_report

    failing = sys.exc_info()[1] is not None
    try:
        if terminal != "sections":
            print_report(run.results, full=terminal == "full")
        with phase("report"):
            html, md = render_report(run.path)
    except Exception as e:
        if not failing:
            raise
        print(f"dlscope: the report could not be rendered after the failure ({type(e).__name__}: {e})", file=sys.stderr)
        return
    print_locations(run, html, md)


def print_report(results: dict[str, Any], full: bool) -> None:
    """The summary on the terminal; `full`: the whole report as report.md reads (the summary, every
    section, how it was measured)."""
    from dlscope.report.blocks import Section
    from dlscope.report.render import report_sections
    from dlscope.report.runsummary import SUMMARY, summary_blocks
    from dlscope.report.terminal import print_sections

    if full:
        print_sections(report_sections(results))
    elif summary := summary_blocks(results):
        print_sections([Section(*SUMMARY, summary)])


def print_locations(run: Any, html: Path, md: Path) -> None:
    from rich.table import Table

    from dlscope.console import console, safe

    rows = [
        ("report", str(html), f"and {md.name}: one file, works offline"),
        ("results", str(results_path(run.path)), "the report's single source"),
    ]
    artifacts = {
        "tensorboard": f"dlscope tensorboard {run.path}",
        "profile": "trace.json opens in ui.perfetto.dev",
        "checkpoints": "dlscope ckpt verify <file>",
        "iotrace": "events.jsonl, trace.json, phases.csv, files.csv",
    }
    written = [name for name in artifacts if _written(run.path / name, run.started)]
    rows += [(name, str(run.path / name), artifacts[name]) for name in written]
    name_width = max(len(name) for name, _, _ in rows)
    path_width = max(len(path) for _, path, _ in rows)
    # paths are never cut or wrapped by us (they are what the user copies), nor is a path in a hint
    # (`dlscope tensorboard RUN`): the hints wrap at their spaces in what the two columns and the
    # padding (2 at each edge, 4 between columns) leave, or each row goes on two lines of its own,
    # the path first (a hint may go on from it: "and report.md")
    room = console.width - name_width - path_width - 12
    if room < max(len(word) for _, _, hint in rows for word in hint.split()):
        console.print("where everything is")
        for name, path, hint in rows:
            console.print(f"{name}: [path]{safe(path)}[/]", soft_wrap=True)
            console.print(f"  [dim]{safe(hint)}[/]", soft_wrap=True)
    else:
        table = Table(show_header=False, box=None, padding=(0, 2), title="where everything is", title_justify="left")
        table.add_column()
        table.add_column(no_wrap=True, min_width=path_width)
        table.add_column()
        for name, path, hint in rows:
            table.add_row(name, f"[path]{safe(path)}[/]", f"[dim]{safe(hint)}")
        console.print(table)
    info = run.results["run"]
    style = "good" if info["status"] == "ok" else "bad"
    console.print(f"[{style}]{info['status']}[/] in {info.get('wall_seconds', 0):.1f}s")


def _written(directory: Path, since: float) -> bool:
    """`directory` holds something written since `since` (less a second: a file system stamps
    with a coarser clock than time.time's): an --out given again keeps what an earlier run wrote
    there (the iotrace of a run with --trace-io), which is not this run's."""
    try:
        return any(entry.stat().st_mtime >= since - 1.0 for entry in directory.rglob("*"))
    except OSError:  # not there, or gone meanwhile
        return False


# --- commands that answer on the terminal: no run directory ------------------------------------

# command → its step (dlscope.stages.answers) and renderer (dlscope.report.sections); named, not
# imported, so that `--json` never loads rich or the report
ANSWERS = {
    name: (f"dlscope.stages.answers:{function}", f"dlscope.report.sections.{renderer}:{function}")
    for name, function, renderer in [
        ("ckpt-verify", "ckpt_verify", "answers"),
        ("ckpt-inspect", "ckpt_inspect", "answers"),
        ("ckpt-scan", "ckpt_scan", "answers"),
        ("ckpt-diff", "ckpt_diff", "answers"),
        ("env", "environment", "answers"),
        ("pipeline-run", "pipeline_run", "pipeline"),
        ("pipeline-prepare", "pipeline_prepare", "pipeline"),
        ("models", "models", "answers"),
        ("data-fetch", "data_fetch", "answers"),
        ("data-verify", "data_verify", "answers"),
        ("stacks", "stacks", "answers"),
        ("attach", "attach", "answers"),
        ("diff", "run_diff", "answers"),
    ]
}
WAITING_ANSWERS = {"attach"}  # steps that wait on a running job: given a progress bar (ctx.task's)


def answer(command: str, options: Any) -> int:
    """Run the command's step; print its section as JSON (--json) or render it; its exit status."""
    import importlib

    def named(where: str) -> Any:
        module, _, function = where.partition(":")
        return getattr(importlib.import_module(module), function)

    step, renderer = ANSWERS[command]
    waits = {"task": progress_task(sys.stderr.isatty())} if command in WAITING_ANSWERS else {}
    section, status = named(step)(options, **waits)
    if getattr(options, "json", False):
        print(json.dumps(section, indent=1, default=str))
    else:
        from dlscope.report.terminal import print_blocks

        print_blocks(named(renderer)(section, options))
    return status


def report(run_dir: str, full: bool = False) -> int:
    """`dlscope report RUN`: the last stage alone, on a run directory from results.json; `full`: the
    whole report on the terminal too."""
    from dlscope.console import console, safe
    from dlscope.report.render import render_report
    from dlscope.rundir import load_results

    html, md = render_report(run_dir)
    if full:
        print_report(load_results(run_dir), full=True)
    console.print(f"wrote [path]{safe(str(html))}[/] and [path]{safe(str(md))}[/]")
    return 0


def tensorboard(run_dir: str, port: int) -> int:
    """`dlscope tensorboard RUN`: this process becomes TensorBoard on the run's logs, bound to 127.0.0.1."""
    logdir = Path(run_dir) / "tensorboard"
    if not Path(run_dir).is_dir():
        raise DlscopeError("no such run directory", run_dir)
    if not logdir.is_dir():
        raise DlscopeError("no tensorboard/ directory in this run", run_dir)
    print("dlscope: set Smoothing to 0 in TensorBoard's settings: test points are one per epoch", file=sys.stderr)
    board = [sys.executable, "-m", "tensorboard.main", "--logdir", str(logdir), "--host", "127.0.0.1"]
    os.execvp(sys.executable, [*board, "--port", str(port)])
    return 0  # not reached


def watch(options: Any) -> int:
    """`dlscope watch`: the running job's view, redrawn in place every `options.interval` seconds
    until its processes end (then the last view stays) or the user presses Ctrl-C."""
    from dlscope.console import console
    from dlscope.report.sections import watch as renderer
    from dlscope.report.terminal import blocks_text, print_blocks
    from dlscope.stages import watch as step

    directory = step.start(options)  # a target that is no running job: one line, before any drawing
    section = step.view(directory, options)
    if options.once:
        print_blocks(renderer.render(section))
        return 0
    from rich.live import Live

    with Live(console=console, auto_refresh=False, redirect_stderr=False) as live:
        try:
            while True:
                live.update(blocks_text(renderer.render(section), console), refresh=True)
                if section["ended"]:
                    break
                time.sleep(options.interval)
                section = step.view(directory, options)
        except KeyboardInterrupt:  # the user is done watching; the job goes on
            pass
    return 0


# --- --trace-io: the same plan in a traced child -------------------------------------------------


def run_traced(plan: Plan, backend: str) -> int:
    """The plan in a child process traced by `backend`; one report with the iotrace section added."""
    from dlscope.rundir import RunDir
    from dlscope.stages import iotrace

    check_plan(plan)
    start_importing_the_renderer()  # this process only waits for the traced child
    run = RunDir.create(plan.options.out, plan.command, argv=plan.argv)
    child = [sys.executable, "-m", "dlscope.runner", plan_to_json(plan, str(run.path))]
    trace = dataclasses.replace(plan.step_options.iotrace, command=child, backend=backend)
    from dlscope.console import console

    section: dict[str, Any] = {}
    stopped_by = None  # the user's signal, while the child ran or before
    try:
        console.print(f"[phase]dlscope {plan.command} --trace-io[/] → [path]{run.path}[/]")
        with run.lent_to_children():
            section = iotrace.trace(run, trace, say=say)
        stopped_by = section.get("interrupted")
    except KeyboardInterrupt as e:
        stopped_by = interrupt_signal(e).name
        raise
    finally:
        run.reload()  # what the traced child wrote
        if section:
            run.record("iotrace", section)
        if stopped_by:
            run.results["run"]["signal"] = stopped_by
            run.finish("interrupted")
        elif run.results["run"]["status"] == "running":  # the child died before it could say so
            run.finish("failed")
        finish_report(run)
        run.release()
    if stopped_by:  # the report is written; now dlscope ends as the user asked
        raise Interrupted(signal.Signals[stopped_by])
    return section.get("exit_code", 1)


def child_main(argv: list[str]) -> int:
    """`python -m dlscope.runner PLAN_JSON` (--trace-io's traced child): run a plan into an existing
    run dir, no report. `… --rank PLAN_JSON`: one of torchrun's ranks trains the plan's train step."""
    from dlscope.console import console
    from dlscope.errors import DlscopeError, interrupts_delivered

    if argv[0] == "--rank":
        from dlscope.injob import hangagent as agent
        from dlscope.rundir import processes_dir

        # the hang agent before torch loads (building the plan's config does): it counts the
        # collectives as the ranks enter them
        processes = processes_dir(Path(json.loads(argv[1])["options"]["out"] or "."))
        processes.mkdir(parents=True, exist_ok=True)  # a scaling round's run dir has none yet
        agent.install(str(processes), follow_markers=True)
        from dlscope.distributed.worker import train_rank

        try:
            train_rank(plan_from_json(argv[1]))
        except DlscopeError as e:
            print(f"dlscope: error: rank {os.environ.get('RANK')}: {e}", file=sys.stderr, flush=True)
            return 2
        return 0
    try:
        with interrupts_delivered():  # the parent forwards the user's signal
            run_command(plan_from_json(argv[0]), render=False)
    except DlscopeError as e:
        console.print(f"dlscope: error: {e}", markup=False)
        return getattr(e, "exit_status", 2)  # 124: the hang watchdog ended the training
    except KeyboardInterrupt as e:
        return 128 + interrupt_signal(e)
    return 0


if __name__ == "__main__":
    sys.exit(child_main(sys.argv[1:]))
