"""`dlscope doctor`'s trials: the user's command, unchanged, run under observation with one change
applied by the bootstrap (injob/change.py), in a scratch working directory of its own that
reads as the one the doctor was started in, ended after its counted steps. Each trial is a run
directory like `dlscope run`'s (results.json with steps and anatomy), so any two can be compared;
this module returns the facts the doctor weighs: the counted steps' seconds, the losses, where the
script builds its loaders and optimizer.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from dlscope.analysis import observed as analysis
from dlscope.analysis import sharing
from dlscope.contract.env import TRIAL_ENV
from dlscope.contract.records import record_fields
from dlscope.errors import Interrupted
from dlscope.options import HangOptions, ScriptOptions
from dlscope.rundir import RunDir, processes_dir

MIN_STEPS = 5  # counted steps a trial needs for a median and its notch
SCRATCH_FILES_LISTED = 20  # the files a trial's script wrote, named in its record (the rest counted)


@dataclass
class Stop:
    """When a trial ends: past `warmup` steps, after `steps` counted steps or `seconds` of them."""

    warmup: int
    steps: int
    seconds: float
    deadline_s: float  # the whole trial, start-up included: its process group is killed past this


@dataclass
class TrialResult:
    name: str
    change: dict[str, Any]
    run: Path
    seconds: list[float]  # the counted steps (past the warm-up), in order
    wall_s: float
    exit_code: int
    stopped: bool  # ended by the doctor after its steps (not by the script, a crash or the deadline)
    deadline_s: float
    anatomy: dict[str, Any]
    top10: dict[str, Any]
    facts: dict[str, Any] = field(default_factory=dict)  # sites, threads, losses, zero_grad, refused, wrote
    machine: dict[str, Any] | None = None  # the machine's share over its steps (analysis/machine.py)
    cost_s: float = 0.0  # wall time in the doctor: start-up, steps, and the reading of its records

    @property
    def past_deadline(self) -> bool:
        """Ended by the doctor's deadline for it (its group killed), not by the script."""
        return self.exit_code == 137 and self.wall_s >= self.deadline_s

    @property
    def ok(self) -> bool:
        """Its steps count: it ended after them, or ran to its end, or ran out of the time the
        doctor gave it after enough of them (MIN_STEPS); never when a write was refused."""
        enough = self.stopped or self.exit_code == 0 or (self.past_deadline and len(self.seconds) >= MIN_STEPS)
        return bool(self.seconds) and not self.facts["refused"] and enough

    def to_json(self, parent: Path) -> dict[str, Any]:
        return {
            "name": self.name,
            "change": self.change,
            "run": str(self.run.relative_to(parent)),
            "steps": len(self.seconds),
            "median_ms": round(float(np.median(self.seconds)) * 1e3, 4) if self.seconds else None,
            "wall_s": round(self.wall_s, 3),
            "cost_s": round(self.cost_s, 3),
            "exit_code": self.exit_code,
            "stopped": self.stopped,
            "ok": self.ok,
            "past_deadline": self.past_deadline,
            "deadline_s": round(self.deadline_s, 3),
            "losses": self.facts["losses"],
            "refused": self.facts["refused"],
            "wrote": self.facts["wrote"],
            "output": str((self.run / "output.txt").relative_to(parent)),
            "output_tail": self.facts.get("output_tail", []),
            "machine": brief_machine(self.machine),
        }


def brief_machine(facts: dict[str, Any] | None) -> dict[str, Any] | None:
    """A trial's machine share, as the doctor's section keeps it."""
    keys = ("others_pct", "others_cores", "free_cores", "cores", "shared")
    return {k: facts[k] for k in keys} if facts else None


def absolute_command(command: list[str], cwd: Path) -> list[str]:
    """The command as it would run from `cwd`: each argument naming an existing file or directory
    there made absolute, so the script (and its inputs) are found from the scratch directory."""
    out = []
    for arg in command:
        candidate = cwd / arg
        out.append(os.path.abspath(candidate) if not arg.startswith("-") and candidate.exists() else arg)
    return out


PROFILE = (1, 0, 1, 3)  # a profiled trial: start after 1 step, wait 0, warm up 1, record 3 (its top-10)


def run_trial(
    parent: RunDir, name: str, command: list[str], change: dict[str, Any], stop: Stop, env: dict, profile: bool = False
) -> TrialResult:
    """One trial of `command` (already absolute) with `change` (trial.py's settings), into
    PARENT/trials/NAME; its scratch working directory is removed after it, its files listed.
    `profile`: a few steps under torch.profiler first (the baseline: which operators the step
    runs), all before the counted ones (`stop.warmup` must cover them)."""
    from dlscope.supervise.session import observe_command

    path = parent.path / "trials" / name
    scratch = path / "cwd"
    run = RunDir(path, "doctor-trial", argv=command)
    scratch.mkdir()
    for entry in os.scandir():  # the scratch directory reads as this one (trial.py: writes stay in it)
        os.symlink(os.path.abspath(entry.path), scratch / entry.name)
    settings = {
        **change,
        "warmup": stop.warmup,
        "stop_after": stop.warmup + stop.steps,
        "stop_seconds": stop.seconds,
        "losses": LOSSES,
        "scratch": str(scratch.resolve()),
        "keep": [str(path.resolve())],
    }
    options = ScriptOptions(
        command=command,
        start_after=PROFILE[0],
        wait=PROFILE[1],
        warmup=PROFILE[2],
        profile_steps=PROFILE[3] if profile else 0,
        hang=HangOptions(hang_after=None),
        extra_env={**env, TRIAL_ENV: json.dumps(settings), "PYTHONDONTWRITEBYTECODE": "1"},
        cwd=str(scratch),
        output=str(path / "output.txt"),
        deadline_s=stop.deadline_s,
    )
    try:
        section = observe_command(run, options, say=lambda text: None)
        run.record("run", section)
        run.finish("interrupted" if section["interrupted"] else "ok" if section["exit_code"] == 0 else "failed")
    finally:
        wrote = written(scratch)
        shutil.rmtree(scratch, ignore_errors=True)
        run.release()
    if section["interrupted"]:  # the user stopped dlscope during the trial: no further trial
        raise Interrupted(signal.Signals[section["interrupted"]])
    observed = analysis.Observed.read(processes_dir(path))
    main = observed.main()
    seconds: list[float] = []
    if main is not None:
        table = observed.stream(main)[1]
        seconds = [float(s) for s in table["seconds"][table["i"] >= stop.warmup]]
    records = [r for rs in observed.records.values() for r in rs]
    facts = trial_facts(records, observed.records.get(main, []) if main is not None else [])
    facts["wrote"] = wrote
    beside = analysis.sharing_of(observed, main) if main is not None else None
    # the training process's threads: its own last count, else its parent's (a forked trainer)
    counted = sharing.threads_of(main, *analysis.torch_threads(observed)) if main is not None else None
    facts["threads"] = counted["threads"] if counted else None
    # the processes that trained while the training one did, and their threads (sharing.py)
    facts["sharing"] = {k: beside[k] for k in ("pids", "threads_total", "cores")} if beside else None
    if not (facts["stopped"] or section["exit_code"] == 0):
        facts["output_tail"] = tail(path / "output.txt")
    return TrialResult(
        name=name,
        change=change,
        run=path,
        seconds=seconds,
        wall_s=section["wall_seconds"],
        exit_code=section["exit_code"],
        stopped=facts["stopped"],
        deadline_s=stop.deadline_s,
        anatomy=run.results["sections"].get("anatomy", {}),
        top10=run.results["sections"].get("top10", {}),
        facts=facts,
        machine=section.get("machine"),
    )


LOSSES = 5  # the first losses recorded in every trial: the numerics guard compares them


def trial_facts(records: list[dict[str, Any]], main: list[dict[str, Any]]) -> dict[str, Any]:
    """What trial.py recorded: in every process (sites, refused writes), in the training one (the rest)."""
    keys = ("what", "file", "line", "arguments", "built_by")
    sites = [{k: r.get(k) for k in keys} for r in records if r.get("k") == "site"]
    for site in sites:
        site["source"] = source_line(site["file"], site["line"])
    zero_grad = next((r for r in main if r.get("k") == "zero_grad"), {})
    loader = next((r for r in main if r.get("k") == "loader"), {})
    layout = next((r["tensors"] for r in main if r.get("k") == "batch_layout"), None)
    copies = next((record_fields(r) for r in main if r.get("k") == "copies"), None)
    return {
        "sites": sites,
        "losses": [r["v"] for r in sorted((r for r in main if r.get("k") == "loss"), key=lambda r: r["i"])],
        "zero_grad_s": zero_grad.get("mean_s"),
        "loader_cpu_frac": loader_cpu_frac(loader),
        **cpu_shares(loader),
        "batch_tensors": layout,
        "copies": copies,  # the counted steps' copies from the CPU to a GPU (where CUDA is available)
        "refused": sorted({r["path"] for r in records if r.get("k") == "refused"}),
        "stopped": any(r.get("k") == "trial_stop" for r in main),
    }


def loader_cpu_frac(loader: dict[str, Any]) -> float | None:
    """How much of its time in DataLoader.__next__ the training thread spent on a CPU, against the
    share it got outside it: ~1 when fetching is CPU work (however busy the machine, the thread
    gets the same share of a core in both), ~0 when it waits (a read, a sleep). None: not known."""
    try:
        inside = loader["cpu_s"] / loader["wall_s"]
        outside = (loader["thread_cpu_s"] - loader["cpu_s"]) / (loader["thread_wall_s"] - loader["wall_s"])
    except (KeyError, ZeroDivisionError):
        return None
    return round(min(inside / outside, 1.0), 3) if outside > 0 else None


def cpu_shares(loader: dict[str, Any]) -> dict[str, float | None]:
    """Over the counted steps: the share of a core the training thread got while it computed
    (outside DataLoader.__next__; below 1 when other jobs held the cores), the cores this process
    used, and the share of the machine's CPUs that stayed idle. None: not known."""
    try:
        outside = (loader["thread_cpu_s"] - loader["cpu_s"]) / (loader["thread_wall_s"] - loader["wall_s"])
        process = loader["process_cpu_s"] / loader["thread_wall_s"]
    except (KeyError, ZeroDivisionError):
        outside = process = None
    idle = loader.get("machine_idle_frac")
    return {
        "thread_share": None if outside is None else round(min(outside, 1.0), 3),
        "process_cores": None if process is None else round(process, 3),
        "machine_idle_frac": None if idle is None else round(idle, 3),
    }


def tail(path: Path, lines: int = 5) -> list[str]:
    """The last lines the command printed (a failed trial's error, shown in the report)."""
    try:
        return path.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return []


def source_line(file: str | None, line: int | None) -> str | None:
    """The line of the user's file a site names, as the doctor read it (for the snippet)."""
    if not file or not line:
        return None
    try:
        with open(file, encoding="utf-8", errors="replace") as f:
            for n, text in enumerate(f, 1):
                if n == line:
                    return text.rstrip("\n")
    except OSError:
        return None
    return None


def written(scratch: Path) -> dict[str, Any]:
    """What the script wrote in its scratch directory (relative names, bytes): kept out of the user's."""
    files = sorted(  # the script's own files, not the symlinks that mirror the user's directory
        Path(root, name) for root, _, names in os.walk(scratch) for name in names if not Path(root, name).is_symlink()
    )
    listed = [{"file": str(p.relative_to(scratch)), "bytes": p.stat().st_size} for p in files[:SCRATCH_FILES_LISTED]]
    return {"files": listed, "count": len(files), "bytes": sum(p.stat().st_size for p in files)}


def cores() -> int:
    """The cores this process may run on (what a trial's workers and threads share)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1
