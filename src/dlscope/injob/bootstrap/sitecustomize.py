"""Injected by dlscope into every Python process of a command it observes (`dlscope run`,
`dlscope trace --backend proc`): this directory goes first on PYTHONPATH, so Python's `site`
imports this file at start-up — in the command, its children, DataLoader workers, torchrun ranks.

It installs what the environment asks for (dlscope.contract.env names it: the run directory for
the torch hooks of `dlscope run`, dlscope.injob.hooks; the events directory for the audit hook of
the proc I/O backend, dlscope.injob.audit), then runs the `sitecustomize` it shadows, so a site's
own customisation (a venv's, a distribution's) still happens; `usercustomize` is not shadowed and
runs as usual. Stdlib only until an observer is asked for.
"""

import importlib
import os
import sys


def _own_dir_off_sys_path() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]


def _install_observers() -> None:
    # the dlscope that started the command (the one name this file spells: dlscope is not importable
    # before it), not another one the command's environment may hold; on sys.path only while it
    # loads, so the command's own imports resolve as they would
    src = os.environ.get("DLSCOPE_SRC")
    if not src:
        return
    saved = sys.path[:]
    sys.path.insert(0, src)
    try:
        env = importlib.import_module("dlscope.contract.env")
        trace_dir, run_dir = os.environ.get(env.PROC_TRACE_ENV), os.environ.get(env.RUN_DIR_ENV)
        if trace_dir:
            importlib.import_module("dlscope.injob.audit").install(trace_dir)
        if run_dir:
            importlib.import_module("dlscope.injob.hangagent").install(run_dir)  # hang: live file, stacks
            importlib.import_module("dlscope.injob.hooks").install(run_dir)
    finally:
        sys.path[:] = saved


def _chain_shadowed() -> None:
    """Import the next `sitecustomize` on sys.path, as if this one were not there."""
    this = sys.modules.pop("sitecustomize")
    try:
        importlib.import_module("sitecustomize")
    except ImportError as e:
        if e.name != "sitecustomize":
            raise
        sys.modules["sitecustomize"] = this  # site's import expects a module under that name


_own_dir_off_sys_path()  # the command sees the sys.path it would have without dlscope
try:
    _install_observers()
finally:
    _chain_shadowed()
