"""Inside an observed process (installed by the bootstrap): keeps the live status file
(contract/live.py) current, counts the collectives this rank enters and finishes, and lets the
parent dump every thread's Python stack on demand.

Stacks. The parent asks for every thread's Python stack with STACK_SIGNAL, which a Python-level
handler answers between two bytecodes of the main thread: it writes the stacks in faulthandler's
format to `<processes>/stacks-<pid>.txt`, reading frames no thread is changing (the main thread
holds the GIL). faulthandler's own dump, from a C signal handler, reads them at any instruction:
a signal landing while the interpreter pushes or pops a frame made it read a half-built one, and
a busy process died of SIGSEGV (in 4 of 4 runs of a stack signal every few ms, after 117–2,286
signals). It stays, on STACK_SIGNAL_IN_C, for a process that does not answer the first signal
(supervise/capture.py waits ANSWER_S): blocked in C with the GIL held, or in a system call the kernel
restarts, where no frame moves. The Python-level handler is installed with SA_RESTART, so the
signal never makes a system call of the job's fail with EINTR. Both signals are real-time ones no
library claims; their default action kills, so the parent sends them only to a process whose
/proc status shows them caught, and a process about to exit ignores them (Python's finalization
would put the default action back while a capture may still be sending). Not `chain=True`:
registered at start-up, the handler it would chain to is that default action.

Collectives. The Python API of torch.distributed (all_reduce, broadcast, barrier, all_gather...)
is wrapped right after `torch.distributed.distributed_c10d` loads, before the package re-exports
it; an async call counts as finished when its Work's future completes. DDP's gradient
all-reduces run from the C++ reducer, invisible to Python: a DDP module with no comm hook of its
own gets torch's `allreduce_hook` (the same averaging as the built-in one) at its first forward,
and that hook calls the wrapped `dist.all_reduce`. A hook the user registers (before or after)
is left alone and counted when it calls the Python API. torch 2.13's Flight Recorder does record
gloo (TORCH_FR_BUFFER_SIZE; `_dump_fr_trace`), but only in the process itself and with every
entry left "scheduled", so it cannot say what finished: not used. Each collective's launch and
completion are also kept as rows of `<pid>.collectives` (injob/recorder.CollectiveFile), with
the step it was launched in: what `dlscope merge` lines the ranks and hosts up by.
"""

from __future__ import annotations

import atexit
import faulthandler
import functools
import os
import signal
import sys
import threading
import time
from types import FrameType
from typing import Any

from dlscope.contract.env import STACK_SIGNAL, STACK_SIGNAL_IN_C
from dlscope.contract.live import LiveStatus
from dlscope.contract.records import COLLECTIVE_EVENTS, COLLECTIVE_OPS, stacks_path
from dlscope.injob.recorder import CollectiveFile

MAX_FRAMES = 100  # per thread, as faulthandler's dump

_LAUNCH, _DONE = COLLECTIVE_EVENTS.index("launch"), COLLECTIVE_EVENTS.index("done")

_live: LiveStatus | None = None
_rows: CollectiveFile | None = None  # each collective's launch and completion (<pid>.collectives)
_stacks_fd: int | None = None
_dumping = False  # STACK_SIGNAL's handler is writing a dump
_hooked = False  # the process-wide hooks (fork, exit, imports) are set once, whatever the installs


def _noop(*_: Any) -> None:
    return None


step_ended = _noop  # bound to the live file's at install: one pack_into per step end
phase = _noop


def install(directory: str, follow_markers: bool = False) -> None:
    """This process's live file and stack dump in `directory`. `follow_markers`: its phase is the
    innermost open `dlscope.phases` marker (the built-in job, whose code marks its phases; `dlscope
    run`'s come from the step machine, injob/hooks.py). Installing again (a process that runs
    several jobs one after the other, as a test does) moves both to the new directory."""
    global _live, _rows, step_ended, phase, _hooked
    rank = os.environ.get("RANK", "")
    _live = LiveStatus(directory, int(rank) if rank.isdigit() else None)
    _rows = CollectiveFile(directory)
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
    from dlscope.injob.after_import import AfterImport

    callbacks = {
        "torch.distributed.distributed_c10d": attach_c10d,
        "torch.nn.parallel.distributed": attach_ddp,
        "torch.utils.data._utils.worker": attach_loader_worker,
    }
    sys.meta_path.insert(0, AfterImport(callbacks, _attach_failed))
    worker = sys.modules.get("torch.utils.data._utils.worker")
    if worker is not None:  # imported already (the built-in job's own process): its loop looked up per worker
        attach_loader_worker(worker)


def uninstall() -> None:
    """Stop keeping the live file and answering the stack signal (the built-in job's own process
    after its training: what follows takes no steps)."""
    global _live, _rows, step_ended, phase
    from dlscope import phases

    phases.listen(None)
    _ignore_stack_signals()
    _live, _rows, step_ended, phase = None, None, _noop, _noop


def _marker_listener(stack: list[str]) -> Any:
    def listener(name: str, edge: str) -> None:
        if edge == "begin":
            stack.append(name)
        elif name in stack:
            del stack[len(stack) - 1 - stack[::-1].index(name)]
        phase(stack[-1] if stack else "")

    return listener


def _exited() -> None:
    _ignore_stack_signals()
    if _live is not None:
        _live.exited()
    if _rows is not None:
        _rows.close()


def _attach_failed(where: str, error: Exception) -> None:
    """Said in the stacks file, which every capture reads: its collectives go uncounted."""
    if _stacks_fd is not None:
        os.write(_stacks_fd, f"dlscope: collectives not counted ({where}): {type(error).__name__}: {error}\n".encode())


def _after_fork() -> None:
    if _rows is not None:
        _rows.after_fork()
    if _live is not None:
        _live.reopen()
        _register_stacks(_live.directory)


def _register_stacks(directory: str) -> None:
    global _stacks_fd
    # caught before the file exists: a parent that sees the file may signal at once
    signal.signal(STACK_SIGNAL, _dump_stacks)
    signal.siginterrupt(STACK_SIGNAL, False)  # SA_RESTART: no system call of the job's sees EINTR
    previous = _stacks_fd
    path = stacks_path(directory, os.getpid())
    _stacks_fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
    # faulthandler writes to the descriptor for the process's life
    faulthandler.register(STACK_SIGNAL_IN_C, file=_stacks_fd, all_threads=True)
    if previous is not None:  # a second install, or a forked child's copy of its parent's descriptor
        os.close(previous)


def _ignore_stack_signals() -> None:
    """No stacks from here on, and no death by a stack signal still on its way."""
    global _stacks_fd
    if _stacks_fd is None:
        return
    faulthandler.unregister(STACK_SIGNAL_IN_C)
    for signum in (STACK_SIGNAL, STACK_SIGNAL_IN_C):
        signal.signal(signum, signal.SIG_IGN)
    os.close(_stacks_fd)
    _stacks_fd = None


def _dump_stacks(signum: int, interrupted: FrameType | None) -> None:
    """STACK_SIGNAL's handler: every thread's stack, innermost first, in faulthandler's format
    (supervise/capture.py reads one format from either signal), in one write. A signal that lands while
    the dump is being made is answered by that dump."""
    global _dumping
    fd = _stacks_fd
    # (a signal landing in this handler before the flag is set, or after it is cleared, finds this
    # handler's frame interrupted: the dump it interrupts answers it)
    if fd is None or _dumping or (interrupted is not None and interrupted.f_code is _dump_stacks.__code__):
        return
    _dumping = True
    try:
        frames = sys._current_frames()
        current = threading.get_ident()
        frames[current] = interrupted  # where the main thread was, not this handler
        lines = []
        for ident, frame in frames.items():
            lines.append(
                f"{'Current thread' if ident == current else 'Thread'} 0x{ident:016x} (most recent call first):"
            )
            lines.extend(_frame_lines(frame))
            lines.append("")
        os.write(fd, "\n".join(lines).encode(errors="backslashreplace"))
    finally:
        _dumping = False


def _frame_lines(frame: FrameType | None) -> list[str]:
    lines = []
    while frame is not None and len(lines) < MAX_FRAMES:
        code, line = frame.f_code, frame.f_lineno
        lines.append(f'  File "{code.co_filename}", line {"???" if line is None else line} in {code.co_name}')
        frame = frame.f_back
    if frame is not None:
        lines.append("  ...")
    return lines


def attach_loader_worker(worker: Any) -> None:
    """A DataLoader worker's loop marks its live file as a DataLoader worker's when it starts: a
    forked child is not one by being forked (forked processes train too: hogwild, A3C)."""
    loop = worker._worker_loop

    @functools.wraps(loop)
    def worker_loop(*args: Any, **kwargs: Any) -> Any:
        if _live is not None:
            _live.loader_worker()
        return loop(*args, **kwargs)

    worker._worker_loop = worker_loop


# collectives ---------------------------------------------------------------------------------
def attach_c10d(c10d: Any) -> None:
    """Wrap the collectives of `torch.distributed.distributed_c10d` (before the package copies them)."""
    for op, name in enumerate(COLLECTIVE_OPS):
        original = getattr(c10d, name, None)
        if original is not None:
            setattr(c10d, name, _counted(name, op, original))


def _counted(name: str, op: int, original: Any) -> Any:
    @functools.wraps(original)
    def collective(*args: Any, **kwargs: Any) -> Any:
        live, rows = _live, _rows
        if live is None or rows is None:
            return original(*args, **kwargs)
        seq, step = live.collective_entered(name), live.steps()
        rows.write(seq, step, _LAUNCH, op, time.time())
        try:
            work = original(*args, **kwargs)
        except BaseException:
            live.collective_finished()  # it returned: it no longer waits
            raise
        if work is not None and hasattr(work, "get_future"):
            work.get_future().then(functools.partial(_finished_future, seq, step, op))
        else:
            live.collective_finished()
            rows.write(seq, step, _DONE, op, time.time())
        return work

    return collective


def _finished_future(seq: int, step: int, op: int, future: Any) -> None:
    """Run by the thread the collective completes on (gloo's, NCCL's watchdog's)."""
    live, rows = _live, _rows
    if live is not None and rows is not None:
        live.collective_finished()
        rows.write(seq, step, _DONE, op, time.time())


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
