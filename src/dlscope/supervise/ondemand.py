"""`dlscope stacks RUN_DIR|PID`: the watchdog's capture of a running job, at any time.

A run directory: every live process of it (its live files in processes/). A PID: that process
and every process below it; when it runs under `dlscope run` (DLSCOPE_RUN_DIR in its
environment) the run's live files give the steps, phases, collectives and Python stacks too.
Any other process gets what /proc gives (threads, wait channels, system calls, files) and no
Python stack: dlscope signals only processes whose bootstrap registered the dump.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from dlscope.contract.env import RUN_DIR_ENV
from dlscope.contract.live import read_all
from dlscope.errors import ConfigError
from dlscope.rundir import processes_dir
from dlscope.supervise.capture import alive
from dlscope.supervise.watchdog import capture_job


def run_dir_of(pid: int) -> Path | None:
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError as e:
        raise ConfigError(f"cannot read its environment: {e.strerror}", f"/proc/{pid}") from None
    for entry in environ:
        if entry.startswith(f"{RUN_DIR_ENV}=".encode()):
            return Path(entry.split(b"=", 1)[1].decode())
    return None


def capture_target(target: str) -> dict[str, Any]:
    """The capture of `target` (a run directory or a PID), as the watchdog writes it."""
    if target.isdigit():
        pid = int(target)
        if not alive(pid):
            raise ConfigError("no such running process", f"/proc/{pid}")
        directory, root = run_dir_of(pid), pid
    else:
        directory, root = processes_dir(Path(target)), None
        if not directory.is_dir():
            raise ConfigError("not a run directory with observed processes (no processes/ in it)", target)
        if not any(alive(v.pid) for v in read_all(directory)):
            raise ConfigError("no process of this run is running", target)
    ends = [v.last_step_end for v in read_all(directory)] if directory is not None else []
    newest = max((e for e in ends if e is not None), default=None)
    return capture_job(directory, root, round(time.time() - newest, 1) if newest else None, running_only=True)
