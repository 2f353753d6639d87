"""Errors a user can act on. The CLI prints them as one line and exits with status 2 (a hung job
that dlscope ended: 124)."""

from __future__ import annotations

import _thread
import contextlib
import errno
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any


class DlscopeError(Exception):
    """A fault in the user's input or environment, described in one line."""

    def __init__(self, message: str, path: str | Path | None = None):
        self.path = str(path) if path is not None else None
        self.message = message
        super().__init__(f"{self.path}: {message}" if self.path else message)


class DatasetError(DlscopeError):
    """A dataset file is missing, corrupt or not what it claims to be."""


class CheckpointError(DlscopeError):
    """A checkpoint cannot be written, read or verified."""


class ConfigError(DlscopeError):
    """A configuration value is out of range or inconsistent."""


def require(*checks: tuple[bool, str]) -> None:
    """Raises ConfigError with the message of the first check that fails."""
    for ok, message in checks:
        if not ok:
            raise ConfigError(message)


class RunDirError(DlscopeError):
    """A run directory or its results.json is missing or unreadable."""


HANG_EXIT_CODE = 124  # dlscope ended a hung job (as timeout(1) does)


class HungJobError(DlscopeError):
    """The hang watchdog ended the built-in job (--on-hang end); the CLI exits with HANG_EXIT_CODE."""

    exit_status = HANG_EXIT_CODE


# errno → the cause in words a user acts on (the rest fall back to the OS's own strerror)
OS_CAUSES = {
    errno.ENOSPC: "no space left on the device",
    errno.EDQUOT: "disk quota exceeded",
    errno.EFBIG: "file too large for this file system or the process's size limit",
    errno.EROFS: "read-only file system",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
    errno.ENOTDIR: "a part of this path is a file, not a directory",
    errno.EEXIST: "exists as a file, not a directory",
    errno.EISDIR: "is a directory, not a file",
    errno.ENAMETOOLONG: "name too long",
    errno.ENOENT: "no such file or directory",
    errno.EMFILE: "too many open files",
    errno.EIO: "input/output error",
}


def os_error_in(exc: BaseException) -> OSError | None:
    """The OSError behind `exc` (itself, or its cause: torch wraps ENOSPC in a RuntimeError)."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, OSError) and exc.errno is not None:
            return exc
        if isinstance(exc, DlscopeError):
            return None  # already said in one line
        seen.add(id(exc))
        exc = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)
    return None


def from_os_error(e: OSError, action: str, path: str | Path | None = None) -> DlscopeError:
    """One line for an OS fault: `<path>: cannot <action>: <cause>`; the path the OS names wins."""
    cause = OS_CAUSES.get(e.errno, e.strerror or str(e))
    return DlscopeError(f"cannot {action}: {cause}", e.filename or path)


class Interrupted(KeyboardInterrupt):
    """The user stopped dlscope with a signal: Ctrl-C (a plain KeyboardInterrupt) or SIGTERM."""

    def __init__(self, signum: int = signal.SIGINT) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def interrupt_signal(exc: KeyboardInterrupt) -> signal.Signals:
    return signal.Signals(getattr(exc, "signum", signal.SIGINT))


def raise_interrupted(signum: int, frame: object) -> None:
    """SIGTERM handler: unwind like Ctrl-C, so runs record "interrupted" and tracers stop."""
    raise Interrupted(signum)


@contextlib.contextmanager
def interrupts_delivered() -> Iterator[None]:
    """SIGTERM unwinds like Ctrl-C, and neither is ever lost. A signal's handler runs wherever the
    main thread is, and raised inside a weakref callback (the import lock's, during start-up) or a
    `__del__`, its exception is only printed as "Exception ignored" and the run goes on to its end:
    there the signal is sent again, to be raised in ordinary code. Only in the main thread."""
    previous_handler = signal.signal(signal.SIGTERM, raise_interrupted)
    previous_hook = sys.unraisablehook

    def redeliver(unraisable: Any) -> None:
        if isinstance(unraisable.exc_value, KeyboardInterrupt):
            # from another thread, a moment later: marked pending from here, the handler would run
            # at the next check, still inside this hook, and be ignored again
            signum = interrupt_signal(unraisable.exc_value)
            timer = threading.Timer(0.01, _thread.interrupt_main, (signum,))
            timer.daemon = True
            timer.start()
        else:
            previous_hook(unraisable)

    sys.unraisablehook = redeliver
    try:
        yield
    finally:
        sys.unraisablehook = previous_hook
        signal.signal(signal.SIGTERM, previous_handler)


@contextlib.contextmanager
def os_faults_named(path: str | Path, action: str) -> Iterator[None]:
    """An OS fault no closer layer named (a full disk under TensorBoard's writer thread, torch
    wrapping ENOSPC in a RuntimeError) becomes one line: `<path>: cannot <action>: <cause>`."""
    try:
        yield
    except DlscopeError:
        raise
    except Exception as e:
        cause = os_error_in(e)
        if cause is None:
            raise
        raise from_os_error(cause, action, path) from None
