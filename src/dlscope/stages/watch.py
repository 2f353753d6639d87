"""`dlscope watch`: the running job's views, one per refresh (the runner repeats them and renders
each with report/sections/watch.py). The target is resolved once: a run that ends while watched
is a view that says so, not an error."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dlscope.options import WatchOptions


def start(options: WatchOptions) -> Path:
    """The job's processes/ directory; one line naming the target when it is no running job."""
    from dlscope.supervise.attach import resolve

    return resolve(options.target)[0]


def view(directory: Path, options: WatchOptions) -> dict[str, Any]:
    from dlscope.supervise.watching import snapshot

    return snapshot(directory, options.recent)
