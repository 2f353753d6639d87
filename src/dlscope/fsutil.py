"""Crash-safe file writes: a reader sees the old file or the complete new one, never a torn one."""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

from dlscope.errors import from_os_error, os_error_in

TEMP_MARK = ".dlscope-tmp-"


def fsync_dir(directory: Path) -> None:
    """Persist a rename: the directory entry itself must reach the disk."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_open(path: str | Path) -> Iterator[BinaryIO]:
    """Open a temp file beside `path` for writing; on success it replaces `path` durably.

    Sequence: temp file in the same directory (same filesystem, so the rename is atomic) →
    write → flush → fsync → os.replace → fsync of the directory. On any exception the temp
    file is removed and `path` is untouched; an OS fault (full disk, read-only, a file where a
    directory should be) becomes one DlscopeError naming the path and the cause.
    """
    path = Path(path)
    tmp = path.parent / f"{TEMP_MARK}{path.name}.{os.getpid()}"
    try:
        make_dirs(path.parent)
        f = open(tmp, "wb")  # noqa: SIM115 — closed explicitly: it must close before the rename
    except OSError as e:
        raise from_os_error(e, "write", path) from None
    try:
        yield f
        f.flush()
        os.fsync(f.fileno())
        f.close()
        os.replace(tmp, path)
        fsync_dir(path.parent)
    except BaseException as e:
        with contextlib.suppress(OSError):  # on a full disk close() fails again: unlink regardless
            f.close()
        tmp.unlink(missing_ok=True)
        cause = os_error_in(e) if isinstance(e, Exception) else None
        if cause is None:
            raise
        raise from_os_error(cause, "write", path) from None


def make_dirs(path: str | Path) -> Path:
    """mkdir -p, with OS faults as one DlscopeError (a file in the way, read-only, no space)."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise from_os_error(e, "create directory", path) from None
    return path


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    with atomic_open(path) as f:
        f.write(data)
    return Path(path)


def atomic_write_with(path: str | Path, writer: Callable[[BinaryIO], None]) -> Path:
    with atomic_open(path) as f:
        writer(f)
    return Path(path)


def clean_stale_temps(directory: str | Path) -> list[Path]:
    """Remove temp files left by writers that died (their pid is gone); return what was removed."""
    directory = Path(directory)
    removed: list[Path] = []
    if not directory.is_dir():
        return removed
    for tmp in directory.glob(f"{TEMP_MARK}*"):
        pid = tmp.name.rsplit(".", 1)[-1]
        if pid.isdigit() and pid_alive(int(pid)) and int(pid) != os.getpid():
            continue  # another live process is writing it
        tmp.unlink(missing_ok=True)
        removed.append(tmp)
    return removed


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


_UNDECODABLE = re.compile("[\udc80-\udcff]")
# json.dumps builds an encoder at each call, and JSONEncoder.encode its C part at each call: a syscall
# trace's exports write texts per event (tens of thousands), so the common one's C part is built once
# (its `markers` dict still catches a circular value)
_READABLE = json.JSONEncoder(ensure_ascii=False)
_c_readable = json.encoder.c_make_encoder and json.encoder.c_make_encoder(
    {}, _READABLE.default, json.encoder.encode_basestring, None, ": ", ", ", False, False, True
)


def json_text(value: Any, **options: Any) -> str:
    """JSON text (non-ASCII kept readable) in which the undecodable bytes of a kernel path, held as
    lone surrogates (surrogateescape), are written as \\udcXX escapes: the text always encodes as
    UTF-8, and json.loads gives the exact path back (os.fsencode gives its bytes)."""
    if options:
        text = json.dumps(value, ensure_ascii=False, **options)
    elif _c_readable:
        text = "".join(_c_readable(value, 0))
    else:  # an interpreter without json's C speedups
        text = _READABLE.encode(value)
    return text if text.isascii() else _UNDECODABLE.sub(lambda m: f"\\u{ord(m[0]):04x}", text)
