"""The strace backend: `strace -f -y -T -ttt -s 0 --seccomp-bpf` over the traced syscalls,
its output parsed line by line (never held whole) into events.

Lines look like (pid, wall-clock seconds, call, `-y` paths in <…>, `-T` time in syscall):

    4242 1732248000.123456 openat(AT_FDCWD</work>, "data/x", O_RDONLY|O_CLOEXEC) = 3</work/data/x> <0.000012>
    4242 1732248000.123501 read(3</work/data/x>, ""..., 65536) = 65536 <0.000031>
    4243 1732248000.124000 read(7</dev/urandom>,  <unfinished ...>
    4243 1732248000.124050 <... read resumed>""..., 16) = 16 <0.000050>
    4242 1732248000.125000 openat(AT_FDCWD</work>, "/nope", O_RDONLY) = -1 ENOENT (No such file or directory) <0.000005>
    4242 1732248000.126000 --- SIGCHLD {si_signo=SIGCHLD, ...} ---
    4242 1732248000.127000 +++ exited with 0 +++
"""

from __future__ import annotations

import codecs
import errno
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

from dlscope.contract.ioevents import FD_ARG_CALLS, KINDS, TRACED_SYSCALLS, Event, make_event

PROCESS_CALLS = ("clone", "clone3", "fork", "vfork")
# a path with no directory descriptor (rename, unlink, mkdir, stat) is relative to the process's working
# directory: known from these, from each `AT_FDCWD</dir>` strace annotates, and inherited at fork
CWD_CALLS = ("chdir", "fchdir")
_AT_FDCWD = re.compile(r"AT_FDCWD<((?:[^>\\]|\\.)*)>")
_LINE = re.compile(r"(\d+)\s+(\d+\.\d+)\s+(.*)")
_CALL = re.compile(r"(\w+)\((.*)")
_RESULT = re.compile(
    r"\s*=\s*(?P<ret>-?\d+|0x[0-9a-fA-F]+|\?)(?P<retpath><(?:[^>\\]|\\.)*>)?"
    r"(?:\s+(?P<err>E[A-Z0-9]+)\b[^<]*)?(?:\s*\([^)]*\))?\s*(?:<(?P<dur>\d+\.\d+)>)?\s*\Z"
)
_QUOTED = re.compile(r'"((?:[^"\\]|\\.)*)"')
_FD_PATH = re.compile(r"(-?\d+|AT_FDCWD)<((?:[^>\\]|\\.)*)>")
_UNFINISHED = " <unfinished ...>"


def available() -> str | None:
    """None when usable, else why not."""
    return None if shutil.which("strace") else "strace is not installed (apt-get install strace)"


def command(argv: list[str], output: Path) -> list[str]:
    calls = ",".join(f"?{c}" for c in (*TRACED_SYSCALLS, *PROCESS_CALLS, *CWD_CALLS))  # ?: names this arch lacks
    return ["strace", "-f", "-y", "-T", "-ttt", "-s", "0", "--seccomp-bpf", "-o", str(output), "-e", f"trace={calls}"]


def unescape(text: str) -> str:
    """A C-escaped strace string as text; bytes that are not UTF-8 are kept exactly
    (surrogateescape, as on every backend: os.fsencode gives the kernel's bytes back)."""
    raw = codecs.escape_decode(text.encode("utf-8", "surrogateescape"))[0]
    return raw.decode("utf-8", "surrogateescape")


def _join(directory: str | None, path: str) -> str:
    return os.path.normpath(os.path.join(directory, path)) if directory and not path.startswith("/") else path


def _ret(text: str, err: str | None) -> int | None:
    if text == "?":
        return None
    if text.startswith("0x"):
        return 0  # an address (mmap): success
    value = int(text)
    if value == -1 and err:
        return -getattr(errno, err, 1)
    return value


def parse_call(pid: int, tgid: int, ts: float, body: str, cwd: str | None = None) -> Event | None:
    """One complete `call(args) = result <dur>` into an event (None for calls without a result);
    `cwd`: the process's working directory, for a relative path with no directory descriptor."""
    m = _CALL.match(body)
    if not m:
        return None
    call, rest = m.groups()
    cut = rest.rfind(")")
    while cut >= 0:
        result = _RESULT.match(rest[cut + 1 :])
        if result:
            break
        cut = rest.rfind(")", 0, cut)
    else:
        return None
    args = rest[:cut]
    ret = _ret(result["ret"], result["err"])
    if ret is None:
        return None
    dur = float(result["dur"]) if result["dur"] else None
    retpath = unescape(result["retpath"][1:-1]) if result["retpath"] else None
    quoted = [unescape(q) for q in _QUOTED.findall(args)]
    fds = _FD_PATH.findall(args)
    if call in KINDS["open"] or call in ("newfstatat", "statx", "stat", "lstat", "mkdir", "mkdirat"):
        if not quoted:
            return None
        directory = unescape(fds[0][1]) if fds else cwd
        path = _join(directory, quoted[0]) if quoted[0] else directory
        if call in KINDS["open"] and retpath is not None:
            path = retpath
        fd = ret if call in KINDS["open"] and ret >= 0 else None
        return make_event(ts, tgid, pid, call, ret, dur, path=path, fd=fd)
    if call in KINDS["rename"] or call in KINDS["unlink"]:
        if not quoted:
            return None
        dirs = [unescape(d) for _, d in fds]
        source = _join(dirs[0] if dirs else cwd, quoted[0])
        target = _join(dirs[-1] if dirs else cwd, quoted[1]) if len(quoted) > 1 else None
        return make_event(ts, tgid, pid, call, ret, dur, path=source, target=target)
    if call in FD_ARG_CALLS:
        if not fds:
            return None  # mmap of anonymous memory, or an fd strace could not name
        number, path = fds[0]
        return make_event(ts, tgid, pid, call, ret, dur, path=unescape(path), fd=int(number))
    return None


class StraceParser:
    """Joins unfinished/resumed halves per thread, maps threads to processes via clone(), follows
    each process's working directory (`cwd`: the traced command's own at its start)."""

    def __init__(self, cwd: str | None = None) -> None:
        self.pending: dict[int, tuple[float, str]] = {}
        self.tgid: dict[int, int] = {}
        self.start_cwd = cwd
        self.cwd: dict[int, str | None] = {}  # process → its working directory as last seen

    def feed(self, line: str) -> Event | None:
        m = _LINE.match(line)
        if not m:
            return None
        pid, ts, body = int(m[1]), float(m[2]), m[3]
        if body.startswith(("---", "+++")):  # a signal, or a process exit: no file event
            return None
        if body.endswith(_UNFINISHED):
            self.pending[pid] = (ts, body[: -len(_UNFINISHED)])
            return None
        if body.startswith("<..."):
            start = self.pending.pop(pid, None)
            if start is None:
                return None
            ts, head = start
            body = head + body.split("resumed>", 1)[-1]
        tgid = self.tgid.setdefault(pid, pid)
        call = body.split("(", 1)[0]
        cwd = self.cwd.get(tgid, self.start_cwd)
        if call in PROCESS_CALLS:
            result = _RESULT.search(body)
            if result and result["ret"].isdigit():
                child = int(result["ret"])
                self.tgid[child] = tgid if "CLONE_THREAD" in body else child
                self.cwd.setdefault(child, cwd)  # a new process starts where its parent is
            return None
        if call in CWD_CALLS:
            result = _RESULT.search(body)
            if result and result["ret"] == "0":
                named = _FD_PATH.search(body) if call == "fchdir" else _QUOTED.search(body)
                if named:
                    self.cwd[tgid] = _join(cwd, unescape(named.groups()[-1]))
            return None
        at_cwd = _AT_FDCWD.search(body)
        if at_cwd:
            cwd = self.cwd[tgid] = unescape(at_cwd[1])
        return parse_call(pid, tgid, ts, body, cwd)


def read_events(output: Path, cwd: str | None = None) -> Iterator[Event]:
    """The events of strace's output; `cwd`: the traced command's working directory at its start."""
    parser = StraceParser(cwd)
    with open(output, encoding="utf-8", errors="surrogateescape") as f:
        for line in f:
            event = parser.feed(line.rstrip("\n"))
            if event is not None:
                yield event
