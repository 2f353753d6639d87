"""The proc backend's recorder, installed by dlscope's bootstrap (injob/bootstrap) into every
Python process `dlscope trace --backend proc` starts.

A PEP 578 audit hook records file events (open, os.* renames, removes, mkdir, listdir, mmap)
and, at each dlscope phase marker, a sample of /proc/self/io. One JSON line per event into
$DLSCOPE_PROC_TRACE_DIR/<pid>.jsonl. Stdlib only, and the hook returns at once for the
hundreds of audit events per second it does not record.
"""

import json
import os
import sys
import threading
import time

from dlscope.contract.records import records_path

_MARKER = "/dev/null/dlscope/phase/"
_EVENTS = {
    "open": "open",
    "os.rename": "rename",
    "os.remove": "unlink",
    "os.rmdir": "unlink",
    "os.mkdir": "mkdir",
    "os.listdir": "getdents",
    "os.scandir": "getdents",
    "mmap.__new__": "mmap",
}
_IO_FIELDS = ("rchar", "wchar", "syscr", "syscw", "read_bytes", "write_bytes")


# What the hook itself reads and writes, subtracted from /proc/self/io so a phase's bytes are
# the program's own: each record is one os.write, each sample one os.read.
_OWN = dict.fromkeys(_IO_FIELDS[:4], 0)


def _proc_io():
    values = {}
    try:
        fd = os.open("/proc/self/io", os.O_RDONLY)
        try:
            data = os.read(fd, 4096)
        finally:
            os.close(fd)
    except OSError:
        return values
    for line in data.decode().splitlines():
        key, _, value = line.partition(":")
        if key in _IO_FIELDS:
            values[key] = int(value) - _OWN.get(key, 0)
    _OWN["rchar"] += len(data)
    _OWN["syscr"] += 1
    return values


def _absolute(path):
    """A path argument as text, joined to the working directory when relative (as the kernel resolves
    it, and as the other backends report it); undecodable bytes kept exactly (surrogateescape)."""
    if path is None:
        return None
    if isinstance(path, os.PathLike):
        path = os.fspath(path)
    path = path.decode("utf-8", "surrogateescape") if isinstance(path, bytes) else str(path)
    if path.startswith("/"):
        return path
    try:
        return os.path.normpath(os.path.join(os.getcwd(), path))
    except OSError:  # the working directory is gone
        return path


def install(directory: str) -> None:
    own = {}  # this process's pid and record file; a forked child (a DataLoader worker) opens its own
    lock = threading.Lock()
    busy = threading.local()

    def open_records():
        own["pid"] = os.getpid()
        path = records_path(directory, own["pid"])
        own["fd"] = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)

    def write(record):
        line = (json.dumps(record) + "\n").encode()
        with lock:
            os.write(own["fd"], line)  # unbuffered: a SIGKILL loses nothing already recorded
            _OWN["wchar"] += len(line)
            _OWN["syscw"] += 1

    def hook(event, args):
        call = _EVENTS.get(event)
        if call is None or getattr(busy, "on", False):
            return
        busy.on = True
        try:
            path = args[0] if args else None
            if call == "mmap":  # mmap.mmap(fileno, ...): the file behind the descriptor; -1 maps no file
                if not isinstance(path, int) or path < 0:
                    return
                try:
                    path = os.readlink(f"/proc/self/fd/{path}")
                except OSError:
                    path = None
            path = None if isinstance(path, int) else _absolute(path)
            pid = own["pid"]
            record = {"ts": time.time(), "pid": pid, "tid": threading.get_native_id(), "call": call, "path": path}
            if call == "open":
                record["mode"] = args[1] if len(args) > 1 and isinstance(args[1], str) else None
                if path is not None and path.startswith(_MARKER):
                    # the sample closes the phase that is ending, so it goes before the marker
                    sample(record["ts"])
                    write(record)
                    return
            elif call == "rename" and len(args) > 1:
                record["target"] = None if isinstance(args[1], int) else _absolute(args[1])
            write(record)
        finally:
            busy.on = False

    def sample(ts=None):
        tid = threading.get_native_id()
        write({"ts": ts or time.time(), "pid": own["pid"], "tid": tid, "call": "procio", "io": _proc_io()})

    def after_fork():
        open_records()
        sample()

    import atexit

    open_records()
    sample()
    atexit.register(sample)
    os.register_at_fork(after_in_child=after_fork)
    sys.addaudithook(hook)
