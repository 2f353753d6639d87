"""The environment that injects dlscope's bootstrap (injob/bootstrap/sitecustomize.py) into
every Python process of a command: one place for `dlscope run` and the proc I/O backend."""

from __future__ import annotations

import os
from pathlib import Path

import dlscope
from dlscope.contract.env import SRC_ENV

BOOTSTRAP_DIR = Path(dlscope.__file__).parent / "injob" / "bootstrap"


def with_bootstrap(env: dict[str, str] | None = None, **settings: str) -> dict[str, str]:
    """`env` (default: this process's) with the bootstrap first on PYTHONPATH, plus `settings`.
    Applied twice (run with --trace-io --trace-backend proc), the bootstrap is listed once."""
    env = dict(os.environ if env is None else env)
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(BOOTSTRAP_DIR)]
    env["PYTHONPATH"] = os.pathsep.join([str(BOOTSTRAP_DIR), *paths])
    env[SRC_ENV] = str(Path(dlscope.__file__).resolve().parent.parent)
    env.update(settings)
    return env
