"""Phase markers every tracer can see: `with dlscope.phase("checkpoint_save"): ...`.

A marker is a system call that fails at once: `open("/dev/null/dlscope/phase/<name>/begin")`
(ENOTDIR, since /dev/null is not a directory). It costs ~1–2 µs when nothing traces, needs no
tracer to be present, and shows up in strace, in eBPF syscall tracepoints and in a PEP 578
audit hook alike — the seed's own trick. This module imports nothing heavy: `import dlscope`
stays light.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable, Iterator

MARKER_PREFIX = "/dev/null/dlscope/phase/"
EDGES = ("begin", "end")
_VALID_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,64}\Z")
_listener: Callable[[str, str], None] | None = None  # (name, edge): the hang agent, in the built-in job


def listen(listener: Callable[[str, str], None] | None) -> None:
    """Also tell `listener` each marker (None: no one)."""
    global _listener
    _listener = listener


def _mark(name: str, edge: str) -> None:
    if not _VALID_NAME.match(name):
        raise ValueError(f"phase name {name!r}: use 1–64 letters, digits, '_', '.', '-'")
    try:  # noqa: SIM105 — contextlib.suppress would double a marker's cost
        os.close(os.open(f"{MARKER_PREFIX}{name}/{edge}", os.O_RDONLY))
    except OSError:  # always: /dev/null is no directory. The failed call is the marker.
        pass
    if _listener is not None:
        _listener(name, edge)


def mark_begin(name: str) -> None:
    """Start phase `name` (for code that cannot use a `with` block, e.g. training observers)."""
    _mark(name, "begin")


def mark_end(name: str) -> None:
    _mark(name, "end")


@contextlib.contextmanager
def phase(name: str) -> Iterator[None]:
    """Mark the code inside the block as phase `name`; phases nest."""
    mark_begin(name)
    try:
        yield
    finally:
        mark_end(name)


def parse_marker(path: str) -> tuple[str, str] | None:
    """(name, edge) when `path` is a phase marker, else None."""
    if not path.startswith(MARKER_PREFIX):
        return None
    name, _, edge = path[len(MARKER_PREFIX) :].partition("/")
    return (name, edge) if edge in EDGES and name else None
