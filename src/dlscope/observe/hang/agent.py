"""Inside an observed process (installed by the bootstrap): keeps the live status file
(hang/live.py) current, counts the collectives this rank enters and finishes, and lets the
parent dump every thread's Python stack on demand.

Stacks. `faulthandler.register(STACK_SIGNAL, all_threads=True)` writes every thread's Python
stack to `<processes>/stacks-<pid>.txt` from a C signal handler: it needs no GIL, so it answers
also when the process is blocked in C with the GIL held. The signal is a real-time one no library
claims; its default action kills, so the parent sends it only to a process whose /proc status
shows it caught. Not `chain=True`: registered at start-up, the handler it would chain to is that
default action — the first dump would kill the process it was asked of.

Collectives. The Python API of torch.distributed (all_reduce, broadcast, barrier, all_gather...)
is wrapped right after `torch.distributed.distributed_c10d` loads, before the package re-exports
it; an async call counts as finished when its Work's future completes. DDP's gradient
all-reduces run from the C++ reducer, invisible to Python: a DDP module with no comm hook of its
own gets torch's `allreduce_hook` (the same averaging as the built-in one) at its first forward,
and that hook calls the wrapped `dist.all_reduce`. A hook the user registers (before or after)
is left alone and counted when it calls the Python API. torch 2.13's Flight Recorder does record
gloo (TORCH_FR_BUFFER_SIZE; `_dump_fr_trace`), but only in the process itself and with every
entry left "scheduled", so it cannot say what finished: not used.
"""

from __future__ import annotations

import atexit
import faulthandler
import functools
import os
import signal
import sys
from typing import Any

from dlscope.observe.hang.live import LiveStatus

STACK_SIGNAL = signal.SIGRTMIN + 6
STACKS_PREFIX = "stacks-"
COLLECTIVES = (
    "all_reduce",
    "broadcast",
    "barrier",
    "monitored_barrier",
    "all_gather",
    "all_gather_into_tensor",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "reduce",
    "gather",
    "scatter",
    "all_to_all",
    "all_to_all_single",
    "send",
    "recv",
)

_live: LiveStatus | None = None
_stacks_file: Any = None
_hooked = False  # the process-wide hooks (fork, exit, imports) are set once, whatever the installs


def _noop(*_: Any) -> None:
    return None


step_ended = _noop  # bound to the live file's at install: one pack_into per step end
phase = _noop


def install(directory: str, follow_markers: bool = False) -> None:
    """This process's live file and stack dump in `directory`. `follow_markers`: its phase is the
    innermost open `dlscope.phases` marker (the built-in job, whose code marks its phases; `dlscope
    run`'s come from the step machine, script/hooks.py). Installing again (a process that runs
    several jobs one after the other, as a test does) moves both to the new directory."""
    global _live, step_ended, phase, _hooked
    rank = os.environ.get("RANK", "")
    _live = LiveStatus(directory, int(rank) if rank.isdigit() else None)
    step_ended, phase = _live.step_ended, _live.phase
    _register_stacks(directory)
    if follow_markers:
        from dlscope import phases

        phases.listen(_marker_listener([]))
    if _hooked:
        return
    _hooked = True
    os.register_at_fork(after_in_child=_after_fork)
    atexit.register(_exited)
    from dlscope.observe.script.after_import import AfterImport

    callbacks = {"torch.distributed.distributed_c10d": attach_c10d, "torch.nn.parallel.distributed": attach_ddp}
    sys.meta_path.insert(0, AfterImport(callbacks, _attach_failed))


def uninstall() -> None:
    """Stop keeping the live file and answering the stack signal (the built-in job's own process
    after its training: what follows takes no steps)."""
    global _live, step_ended, phase, _stacks_file
    from dlscope import phases

    phases.listen(None)
    if _stacks_file is not None:
        faulthandler.unregister(STACK_SIGNAL)
        _stacks_file.close()
    _live, _stacks_file, step_ended, phase = None, None, _noop, _noop


def _marker_listener(stack: list[str]) -> Any:
    def listener(name: str, edge: str) -> None:
        if edge == "begin":
            stack.append(name)
        elif name in stack:
            del stack[len(stack) - 1 - stack[::-1].index(name)]
        phase(stack[-1] if stack else "")

    return listener


def _exited() -> None:
    if _live is not None:
        _live.exited()


def _attach_failed(where: str, error: Exception) -> None:
    """Said in the stacks file, which every capture reads: its collectives go uncounted."""
    if _stacks_file is not None:
        _stacks_file.write(f"dlscope: collectives not counted ({where}): {type(error).__name__}: {error}\n")


def _after_fork() -> None:
    if _live is not None:
        _live.reopen()
        _register_stacks(_live.directory)


def _register_stacks(directory: str) -> None:
    global _stacks_file
    previous = _stacks_file
    path = os.path.join(directory, f"{STACKS_PREFIX}{os.getpid()}.txt")
    _stacks_file = open(path, "a", buffering=1)  # noqa: SIM115 — faulthandler writes to its fd for the process's life
    faulthandler.register(STACK_SIGNAL, file=_stacks_file, all_threads=True)
    if previous is not None:  # a second install, or a forked child's copy of its parent's file
        previous.close()


# collectives ---------------------------------------------------------------------------------
def attach_c10d(c10d: Any) -> None:
    """Wrap the collectives of `torch.distributed.distributed_c10d` (before the package copies them)."""
    for name in COLLECTIVES:
        original = getattr(c10d, name, None)
        if original is not None:
            setattr(c10d, name, _counted(name, original))


def _counted(name: str, original: Any) -> Any:
    @functools.wraps(original)
    def collective(*args: Any, **kwargs: Any) -> Any:
        live = _live
        if live is None:
            return original(*args, **kwargs)
        live.collective_entered(name)
        try:
            work = original(*args, **kwargs)
        except BaseException:
            live.collective_finished()  # it returned: it no longer waits
            raise
        if work is not None and hasattr(work, "get_future"):
            work.get_future().then(_finished_future)
        else:
            live.collective_finished()
        return work

    return collective


def _finished_future(future: Any) -> None:
    if _live is not None:
        _live.collective_finished()


def attach_ddp(module: Any) -> None:
    """DDP's bucket all-reduces through the counted Python API (see the module's docstring)."""
    ddp = module.DistributedDataParallel
    forward, builtin = ddp.forward, ddp._register_builtin_comm_hook

    @functools.wraps(builtin)
    def register_builtin(self: Any, *args: Any, **kwargs: Any) -> Any:
        self._dlscope_builtin_hook = True
        return builtin(self, *args, **kwargs)

    @functools.wraps(forward)
    def counted_forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not getattr(self, "_dlscope_seen", False):
            self._dlscope_seen = True
            _default_hook(self)
        return forward(self, *args, **kwargs)

    ddp.forward, ddp._register_builtin_comm_hook = counted_forward, register_builtin


def _default_hook(ddp: Any) -> None:
    if ddp._comm_hooks or getattr(ddp, "_dlscope_builtin_hook", False) or getattr(ddp, "mixed_precision", None):
        return
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    try:
        ddp.register_comm_hook(ddp.process_group, allreduce_hook)
    except Exception:  # a DDP configuration that takes no Python hook: its all-reduces go uncounted
        return
