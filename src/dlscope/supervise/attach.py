"""`dlscope attach RUN|PID --profile-steps N`: the profiler on demand, in a job already running
under `dlscope run`, with no restart.

The request is a file, `<run dir>/processes/profile-request-<pid>` (JSON: {"id", "steps"}), written
whole (a temporary file renamed over it). The observed process looks for it at a step end at most
once every REQUEST_EVERY_S seconds, by the step-end time it already has (one float compare a step,
one stat(2) a second), takes it (reads it, then removes it) and records it (`profile_taken`, with
the step it was taken at); the next step is the profiler's warm-up, the N after it are recorded,
and the window lands beside the scheduled one: a `profile` record (trigger "attach", the request's
id, its step range) and its trace file. A signal was the other way: it costs nothing per step, but
its handler runs inside whatever the script does, and a process that has not installed it dies of
the default action; the file needs no handler and is read where the profiler is driven anyway.

The request file's name and its reading and writing: dlscope.contract.requests (the job imports it).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dlscope.contract.env import RUN_DIR_ENV
from dlscope.contract.records import records_path
from dlscope.contract.requests import request_path, write_request
from dlscope.rundir import processes_dir, results_path


def resolve(target: str) -> tuple[Path, int | None]:
    """A running job's processes/ directory, from its run directory or a PID in it or above it
    (`dlscope run`'s own; then also that PID). One line naming `target` when it is neither, or
    when its run has ended."""
    from dlscope.errors import ConfigError
    from dlscope.supervise.capture import alive, descendants

    if target.isdigit():
        pid = int(target)
        if not alive(pid):
            raise ConfigError("no such running process", f"/proc/{pid}")
        # the process itself, or one below it (`dlscope run`'s own PID: the job is its child)
        directory = next((d for p in descendants(pid) if (d := _run_dir_or_none(p)) is not None), None)
        if directory is None:
            raise ConfigError(f"not a process of a `dlscope run` job (no {RUN_DIR_ENV} in its environment)", target)
        return directory, pid
    directory = processes_dir(Path(target))
    if not directory.is_dir():
        raise ConfigError("not a `dlscope run` directory (no processes/ in it)", target)
    ended = run_status(Path(target))
    if ended is not None:
        raise ConfigError(f"the run has ended (status {ended}): nothing is running", target)
    return directory, None


def target_processes(target: str) -> tuple[Path, list[Any]]:
    """The run's processes/ directory and the live views of the processes to profile: those of
    a run directory, or of a PID and the processes below it (a launcher: torchrun's ranks), that
    run and have ended a training step."""
    from dlscope.contract.live import read_all
    from dlscope.errors import ConfigError
    from dlscope.supervise.capture import alive, descendants

    directory, pid = resolve(target)
    views = read_all(directory)
    if pid is not None:  # the process, or the ones below it that step (a launcher's ranks)
        below = set(descendants(pid))
        views = [v for v in views if v.pid in below]
    running = [v for v in views if alive(v.pid) and not v.exited]
    if not running:
        raise ConfigError("no process of this run is running", target)
    stepping = [v for v in running if not v.forked and v.steps > 0]
    if not stepping:
        raise ConfigError("no training step has ended yet in any of its processes: try again once steps run", target)
    return directory, stepping


def _run_dir_or_none(pid: int) -> Path | None:
    """The run directory in a process's environment; None also when it is gone or unreadable."""
    from dlscope.errors import ConfigError
    from dlscope.supervise.ondemand import run_dir_of

    try:
        return run_dir_of(pid)
    except ConfigError:
        return None


def run_status(run_dir: Path) -> str | None:
    """The status results.json gives a run that has ended; None while it runs (or cannot say)."""
    try:
        status = json.loads(results_path(run_dir).read_text())["run"]["status"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return None if status == "running" else str(status)


def request_profile(
    directory: Path,
    views: list[Any],
    steps: int,
    timeout: float,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """Ask each process of `views` (target_processes) to profile its next `steps` steps; wait (at
    most `timeout` seconds) until each has written its window, or has ended. One entry a process:
    the step it took the request at and its `profile` record as written (None: not delivered)."""
    from dlscope.errors import ConfigError
    from dlscope.supervise.capture import alive

    waiting = [v.pid for v in views if request_path(directory, v.pid).exists()]
    if waiting:
        raise ConfigError(f"a profile request is already waiting for process {waiting[0]} (another dlscope attach?)")
    request = {"id": f"{time.time_ns():x}", "steps": steps, "requested": time.time()}
    tails = {v.pid: _Tail(Path(records_path(directory, v.pid))) for v in views}  # before: a fast taker is seen
    found: dict[int, dict[str, Any]] = {
        v.pid: {"pid": v.pid, "rank": v.rank, "requested_at_step": v.steps, "taken": None, "profile": None}
        for v in views
    }
    status = "timeout"
    try:
        for view in views:
            write_request(directory, view.pid, request)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for pid, tail in tails.items():
                for record in tail.new():
                    if record.get("request") == request["id"] and record.get("k") in ("profile_taken", "profile"):
                        found[pid]["taken" if record["k"] == "profile_taken" else "profile"] = record
            pending = [pid for pid in found if found[pid]["profile"] is None]
            if progress is not None:
                progress(len(found) - len(pending), len(found))
            if not pending or not any(alive(pid) for pid in pending):
                status = "done" if not pending else "ended"
                break
            time.sleep(0.2)
    finally:  # a request no process took is withdrawn (also on Ctrl-C): no window starts unasked later
        for pid in found:
            if found[pid]["taken"] is None:
                request_path(directory, pid).unlink(missing_ok=True)
    return {"run_dir": str(directory.parent), "request": request, "status": status, "processes": list(found.values())}


class _Tail:
    """New complete lines of a growing JSON-lines file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self.offset = path.stat().st_size
        except OSError:
            self.offset = 0

    def new(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return []
        complete = data[: data.rfind(b"\n") + 1]
        self.offset += len(complete)
        records = []
        for line in complete.splitlines():
            try:
                records.append(json.loads(line))
            except ValueError:
                continue
        return records
