"""Start the traced command held at a gate, so a tracer can attach before its first syscall,
and stop tracers without leaving any behind."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence

# A bare interpreter (-I -S: no site, no environment) waits for one byte on the gate pipe, closes
# it, then becomes the command (exec: same pid); if dlscope dies first (EOF), it exits instead of
# running the command untraced. sh cannot do this portably: dash redirects single-digit fds only.
_GATE = (
    "import os, sys; fd = int(sys.argv[1]); go = os.read(fd, 1); os.close(fd); "
    "os.execvp(sys.argv[2], sys.argv[2:]) if go else sys.exit(125)"
)
PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """preexec_fn for tracer processes: the kernel sends SIGTERM to the tracer if dlscope dies,
    even by SIGKILL, so no tracer outlives the run."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


class GatedProcess:
    """The command, started but blocked until `release()`; its pid is the command's pid."""

    def __init__(self, argv: Sequence[str], env: Mapping[str, str] | None = None) -> None:
        read_end, self._write_end = os.pipe()
        try:
            gate = [sys.executable, "-I", "-S", "-c", _GATE, str(read_end), *argv]
            self.proc = subprocess.Popen(
                gate, pass_fds=(read_end,), env=None if env is None else dict(env), process_group=0
            )
        except OSError:
            os.close(self._write_end)
            raise
        finally:
            os.close(read_end)
        self.pid = self.proc.pid

    def release(self) -> None:
        os.write(self._write_end, b"go\n")
        os.close(self._write_end)


def stop(proc: subprocess.Popen, timeout: float = 5.0) -> None:
    """SIGINT (tracers flush on it), then SIGTERM, then SIGKILL; returns once it is gone."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL):
        if proc.poll() is not None:
            return
        proc.send_signal(sig)
        try:
            proc.wait(timeout)
            return
        except subprocess.TimeoutExpired:
            continue


def signal_group(pgid: int, signum: int) -> None:
    """Send `signum` to a process group; a group already gone is fine."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


def exit_code(returncode: int) -> int:
    """A child's status as a shell reports it: 128+N for death by signal N."""
    return 128 - returncode if returncode < 0 else returncode
