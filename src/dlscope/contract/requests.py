"""The profile request `dlscope attach` leaves for a running job's process,
`<run dir>/processes/profile-request-<pid>` (JSON: {"id", "steps"}): written whole (a temporary file
renamed over it) by dlscope.supervise.attach, taken (read, then removed) by the process at a step end
(dlscope.injob.hooks) at most once every REQUEST_EVERY_S seconds. Not named .json: tools given the
folder of profiler traces (HTA, TensorBoard) take every .json there for one. Stdlib only."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

REQUEST_PREFIX = "profile-request-"
REQUEST_EVERY_S = 1.0  # how often a running process looks for a request (at a step end)


def request_path(directory: str | Path, pid: int) -> Path:
    return Path(directory) / f"{REQUEST_PREFIX}{pid}"


def take_request(directory: str, pid: int) -> dict[str, Any] | None:
    """The request waiting for process `pid`, removed as it is read (None: none, or not yet whole)."""
    path = os.path.join(directory, f"{REQUEST_PREFIX}{pid}")
    try:
        with open(path, "rb") as f:
            request = json.loads(f.read())
        os.unlink(path)
    except (OSError, ValueError):
        return None
    steps = request.get("steps") if isinstance(request, dict) else None
    return request if isinstance(steps, int) and steps > 0 else None


def write_request(directory: Path, pid: int, request: dict[str, Any]) -> None:
    path = request_path(directory, pid)
    partial = path.with_name(f".{path.name}.partial")  # not a request until renamed: never read half-written
    partial.write_text(json.dumps(request))
    os.replace(partial, path)
