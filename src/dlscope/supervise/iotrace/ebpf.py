"""The eBPF backend: bpftrace on the two `raw_syscalls` tracepoints (stable ABI), picking the
traced calls by syscall number in the kernel, following the process tree through
sched_process_fork, one JSON line per event written to a file dlscope follows.

Two tracepoints instead of one pair per call: bpftrace attaches probes one at a time and the
kernel detaches each with an RCU grace period, ~0.1 s a probe here, so ~70 per-call tracepoints
cost ~7 s of start-up and shut-down, 7 probes under 1 s. What the kernel offers is read from
tracefs: each `syscalls/sys_enter_<call>/format` gives the order of the call's arguments (so
`args[i]` is read at the right position on this kernel), and the absence of `kprobe_events`
means no kprobes. Paths are read at syscall exit from the pointer saved at entry (at entry the
page may not be faulted in yet, and str() would return "").
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from dlscope.contract.ioevents import FD_ARG_CALLS, KINDS, TRACED_SYSCALLS, Event, make_event

TRACEFS_CANDIDATES = (Path("/sys/kernel/tracing"), Path("/sys/kernel/debug/tracing"))
STRLEN = 200  # bpftrace ≤ 0.17 refuses more; a path this long (minus NUL) counts as truncated
PATH_FIELDS = ("filename", "pathname", "oldname")
TARGET_FIELDS = ("newname",)
FD_FIELDS = ("fd", "fildes", "oldfd", "dfd")  # dfd: the directory a *at() path is relative to
ARG_FIELDS = ("cmd",)  # fcntl: tells F_DUPFD* apart
_FIELD = re.compile(r"field:([^;]*?)\s+\**(\w+);")


def tracefs() -> Path | None:
    for path in TRACEFS_CANDIDATES:
        if (path / "events").is_dir():
            return path
    return None


def syscall_fields(root: Path, call: str) -> list[str] | None:
    """Argument names of `syscalls:sys_enter_<call>` on this kernel (None: no such tracepoint)."""
    fmt = root / "events" / "syscalls" / f"sys_enter_{call}" / "format"
    if not fmt.is_file():
        return None
    return [name for _, name in _FIELD.findall(fmt.read_text()) if not name.startswith("common_")][1:]


def bpftrace_version() -> tuple[int, int] | None:
    try:
        out = subprocess.run(["bpftrace", "--version"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r"v?(\d+)\.(\d+)", out)
    return (int(m[1]), int(m[2])) if m else None


def args_operator(version: tuple[int, int]) -> str:
    """Tracepoint fields are `args.x` from bpftrace 0.19 (bpftrace PR #2578), `args->x` before."""
    return "." if version >= (0, 19) else "->"


def available() -> str | None:
    """None when usable, else why not (one line)."""
    if not shutil.which("bpftrace"):
        return "bpftrace is not installed (apt-get install bpftrace)"
    if os.geteuid() != 0:
        return "eBPF needs root or CAP_BPF+CAP_PERFMON; running as an unprivileged user"
    root = tracefs()
    if root is None:
        return "tracefs is not mounted (mount -t tracefs nodev /sys/kernel/tracing)"
    if not (root / "events" / "syscalls").is_dir():
        return "this kernel has no syscall tracepoints (CONFIG_FTRACE_SYSCALLS off)"
    if os.uname().machine not in SYSCALL_NUMBERS:
        return f"no syscall table for {os.uname().machine} here (x86_64 and aarch64 only)"
    if bpftrace_version() is None:
        return "bpftrace does not run (bpftrace --version failed)"
    return None


# Syscall numbers of the traced calls (from the kernel's uapi unistd headers): the program hooks the
# two raw_syscalls tracepoints and picks calls by number, so it attaches 5 probes instead of ~70
# (bpftrace attaches, and detaches at exit, one tracepoint at a time: ~0.1 s each here)
SYSCALL_NUMBERS: dict[str, dict[str, int]] = {
    "x86_64": {
        "open": 2, "openat": 257, "openat2": 437, "creat": 85, "close": 3, "read": 0, "pread64": 17,
        "readv": 19, "preadv": 295, "preadv2": 327, "write": 1, "pwrite64": 18, "writev": 20,
        "pwritev": 296, "pwritev2": 328, "lseek": 8, "fsync": 74, "fdatasync": 75, "rename": 82,
        "renameat": 264, "renameat2": 316, "unlink": 87, "unlinkat": 263, "mkdir": 83, "mkdirat": 258,
        "stat": 4, "lstat": 6, "fstat": 5, "newfstatat": 262, "statx": 332, "getdents64": 217,
        "mmap": 9, "dup": 32, "dup2": 33, "dup3": 292, "fcntl": 72, "chdir": 80, "fchdir": 81,
    },
    "aarch64": {  # the generic table: no open, creat, rename, unlink, mkdir, stat, lstat, dup2
        "openat": 56, "openat2": 437, "close": 57, "read": 63, "pread64": 67, "readv": 65,
        "preadv": 69, "preadv2": 286, "write": 64, "pwrite64": 68, "writev": 66, "pwritev": 70,
        "pwritev2": 287, "lseek": 62, "fsync": 82, "fdatasync": 83, "renameat": 38, "renameat2": 276,
        "unlinkat": 35, "mkdirat": 34, "fstat": 80, "newfstatat": 79, "statx": 291, "getdents64": 61,
        "mmap": 222, "dup": 23, "dup3": 24, "fcntl": 25, "chdir": 49, "fchdir": 50,
    },
}  # fmt: skip
# traced too, for the working directory a relative path is joined to (not file I/O: no event of their own)
CWD_CALLS = ("chdir", "fchdir")
# the kernel names the tracepoint (whose format gives the argument order) after its own function
TRACEPOINT_NAMES = {"stat": "newstat", "lstat": "newlstat", "fstat": "newfstat"}
# getppid, made by dlscope (bpftrace's $2) on each CPU in turn once the command is over: the program
# prints a "mark" line for it into that CPU's buffer, behind every event written there before
MARK_SYSCALL = {"x86_64": 110, "aarch64": 173}


@dataclass
class ScriptPlan:
    script: str
    names: dict[int, str]  # syscall number → name, to read the program's lines
    missing: list[str] = field(default_factory=list)  # traced syscalls this kernel cannot show


@dataclass
class CallArgs:
    """Where a traced call keeps what the events need: argument positions (None: not taken)."""

    number: int
    path: int | None
    target: int | None
    fd: int | None
    arg: int | None


def call_args(root: Path, numbers: dict[str, int]) -> tuple[dict[str, CallArgs], list[str]]:
    calls, missing = {}, []
    for call in (*TRACED_SYSCALLS, *CWD_CALLS):
        fields = syscall_fields(root, TRACEPOINT_NAMES.get(call, call))
        if fields is None or call not in numbers:
            missing.append(call)
            continue

        def position(names: tuple[str, ...], fields: list[str] = fields) -> int | None:
            return next((fields.index(f) for f in names if f in fields), None)

        calls[call] = CallArgs(
            numbers[call], position(PATH_FIELDS), position(TARGET_FIELDS), position(FD_FIELDS), position(ARG_FIELDS)
        )
    return calls, missing


def build_script(root: Path, arrow: str) -> ScriptPlan:
    """The bpftrace program for this kernel and machine; `arrow` from `args_operator`."""
    numbers = SYSCALL_NUMBERS[os.uname().machine]
    calls, missing = call_args(root, numbers)
    # calls that keep their arguments at the same positions share one layout (a branch); BEGIN maps
    # each traced call's number to its layout (1, 2, …; a missing key reads 0: not traced). One map
    # lookup picks the branch: a chain of `$id == N ||` tests for ~36 calls took bpftrace ~0.2 s
    # more to compile and load, paid at each start-up
    layouts: dict[tuple[int | None, ...], list[CallArgs]] = {}
    for c in calls.values():
        layouts.setdefault((c.path, c.target, c.fd, c.arg), []).append(c)
    layout_of = {c.number: i for i, same in enumerate(layouts.values(), 1) for c in same}
    table = " ".join(f"@layout[{number}] = {i};" for number, i in layout_of.items())
    # BEGIN runs once every probe is attached ("attached_probes" is printed before that); the
    # command is traced from its exec on, so the launcher's gate (a shell) stays out of the trace
    lines = [
        f'BEGIN {{ @gated[$1] = 1; {table} printf("ready\\n"); }}',
        "tracepoint:sched:sched_process_exec /@gated[pid]/ { delete(@gated[pid]); @traced[pid] = 1; }",
        "tracepoint:sched:sched_process_fork /@traced[pid]/ { @traced[args{a}child_pid] = 1; "
        'printf("fork\\t%d\\t%d\\t%llu\\n", pid, args{a}child_pid, nsecs); }',
        "tracepoint:sched:sched_process_exit /@traced[pid] && pid == tid/ { delete(@traced[pid]); "
        'printf("exit\\t%d\\t%d\\t%llu\\n", pid, tid, nsecs); }',
    ]
    # at entry: which call, when, and its arguments (by position); the path is read at exit
    enter = ["tracepoint:raw_syscalls:sys_enter /@traced[pid]/ { $id = args{a}id; $l = @layout[$id];"]
    mmap = numbers.get("mmap")
    for i, ((path, target, fd, arg), same) in enumerate(layouts.items(), 1):
        # int32: AT_FDCWD is -100; an mmap of anonymous memory (fd -1) is no file I/O
        skip = f" && !($id == {mmap} && (int32)args{{a}}args[{fd}] < 0)" if any(c.number == mmap for c in same) else ""
        saves = ["@nr[tid] = $id; @ts[tid] = nsecs;"]
        saves += [f"@p1[tid] = args{{a}}args[{path}];"] if path is not None else []
        saves += [f"@p2[tid] = args{{a}}args[{target}];"] if target is not None else []
        saves += [f"@fd[tid] = (int32)args{{a}}args[{fd}];" if fd is not None else "@fd[tid] = -1;"]
        saves += [f"@arg[tid] = (int64)args{{a}}args[{arg}];" if arg is not None else "@arg[tid] = -1;"]
        enter.append(f"  if ($l == {i}{skip}) {{ {' '.join(saves)} }}")
    enter.append("}")
    lines.append("\n".join(enter))
    mark = MARK_SYSCALL[os.uname().machine]
    lines.append(
        f"tracepoint:raw_syscalls:sys_enter /pid == $2 && args{{a}}id == {mark}/ "
        '{ printf("mark\\t%d\\t%llu\\n", cpu, nsecs); }'
    )
    with_path = [i for i, (path, *_) in enumerate(layouts, 1) if path is not None]
    with_target = [i for i, (_, target, *_) in enumerate(layouts, 1) if target is not None]
    head = "%d\\t%d\\t%d\\t%llu\\t%llu\\t%lld\\t%lld\\t%lld"
    values = "$id, pid, tid, @ts[tid], nsecs - @ts[tid], args{a}ret, @fd[tid], @arg[tid]"
    # two path strings in one printf overflow the 512-byte BPF stack: the target goes first, alone
    lines.append(
        "tracepoint:raw_syscalls:sys_exit /@ts[tid]/ { $id = @nr[tid]; $l = @layout[$id];\n"
        f'  if ({_any_layout(with_target)}) {{ printf("target\\t%d\\t%s\\n", tid, str(uptr(@p2[tid]))); }}\n'
        f'  if ({_any_layout(with_path)}) {{ printf("{head}\\t%s\\n", {values}, str(uptr(@p1[tid]))); }}\n'
        f'  else {{ printf("{head}\\n", {values}); }}\n'
        "  delete(@nr[tid]); delete(@ts[tid]); delete(@p1[tid]); delete(@p2[tid]); delete(@fd[tid]); "
        "delete(@arg[tid]);\n}"
    )
    maps = ("@gated", "@traced", "@layout", "@nr", "@ts", "@p1", "@p2", "@fd", "@arg")
    lines.append(f"END {{ {' '.join(f'clear({m});' for m in maps)} }}")
    script = "\n".join(lines).replace("{a}", arrow) + "\n"
    return ScriptPlan(script, {c.number: call for call, c in calls.items()}, missing)


def _any_layout(layouts: list[int]) -> str:
    return " || ".join(f"$l == {i}" for i in layouts) or "0"


def write_program(script: Path) -> tuple[ScriptPlan, tuple[int, int]]:
    """Write the program for this kernel and bpftrace into `script`: (its plan, bpftrace's version)."""
    root = tracefs()
    assert root is not None, "available() checks tracefs first"
    version = bpftrace_version() or (0, 0)
    plan = build_script(root, args_operator(version))
    script.write_text(plan.script)
    return plan, version


def command(script: Path, pid: int, output: Path, marker: int) -> list[str]:
    """bpftrace tracing `pid` from its exec on, printing its lines as JSON into `output` (a file: a
    write to it never waits); `marker` is the process whose getppid() calls print "mark" lines."""
    return ["bpftrace", "-f", "json", "-o", str(output), str(script), str(pid), str(marker)]


def environment() -> dict[str, str]:
    # 2,048 pages = 8 MiB of perf buffer per CPU: Python start-up emits ~30,000 events in seconds
    return {**os.environ, "BPFTRACE_STRLEN": str(STRLEN), "BPFTRACE_PERF_RB_PAGES": "2048"}


@dataclass
class Counters:
    lost: int = 0
    truncated_paths: int = 0  # cut at STRLEN and not recovered
    recovered_paths: int = 0  # cut, then read whole from /proc/PID/fd
    attached_probes: int = 0
    ready: bool = False
    targets: dict[int, str] = field(default_factory=dict)  # tid → rename target printed just before
    marks: dict[int, int] = field(default_factory=dict)  # CPU → when (CLOCK_MONOTONIC ns) its last mark was made


def parse_line(line: str, counters: Counters, names: Mapping[int, str]) -> Event | None:
    """One line of `bpftrace -f json` output into an event (or a fork/exit record); `names` maps
    the syscall numbers the program prints to names (`ScriptPlan.names`)."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError:
        return None  # not bpftrace's JSON (a stray message): nothing to count
    kind, data = record.get("type"), record.get("data")
    if kind == "attached_probes":
        counters.attached_probes = int(data.get("probes", 0))
        return None
    if kind and "lost" in kind:
        counters.lost += int(data.get("events", 0) if isinstance(data, dict) else data or 0)
        return None
    if kind != "printf" or not isinstance(data, str):
        return None
    parts = kernel_text(data).rstrip("\n").split("\t")
    call = parts[0]
    if call == "ready":
        counters.ready = True
        return None
    if call == "mark":
        counters.marks[int(parts[1])] = int(parts[2])
        return None
    if call in ("fork", "exit"):
        return {"call": call, "pid": int(parts[1]), "tid": int(parts[2]), "ts": int(parts[3]) / 1e9}
    if call == "target":
        target = "\t".join(parts[2:])
        counters.truncated_paths += is_cut(target)
        counters.targets[int(parts[1])] = target
        return None
    call = names.get(int(call)) if call.isdigit() else None
    if call is None:
        return None  # not a line of this program
    pid, tid, start, dur, ret, fd, arg = (int(p) for p in parts[1:8])
    path = "\t".join(parts[8:]) if len(parts) > 8 else None
    if call in CWD_CALLS:  # the process's new working directory: named (chdir), or an open directory's fd
        return {"call": "cwd", "pid": pid, "tid": tid, "ts": start / 1e9, "path": path, "fd": fd} if ret == 0 else None
    if path is not None and is_cut(path):
        opened = ret if call in KINDS["open"] else -1
        path = recover_from_fd(pid, opened, path)
        if is_cut(path):
            counters.truncated_paths += 1
        else:
            counters.recovered_paths += 1
    target = counters.targets.pop(tid, None)
    if call in FD_ARG_CALLS:
        event = make_event(start / 1e9, pid, tid, call, ret, dur / 1e9, path=path, fd=fd, target=target)
    else:  # the fd argument of a path call is its directory (dfd); an open's own fd is its result
        opened = ret if call in KINDS["open"] and ret >= 0 else None
        event = make_event(start / 1e9, pid, tid, call, ret, dur / 1e9, path=path, fd=opened, target=target)
        if fd >= 0:
            event["dirfd"] = fd
    if arg >= 0:
        event["arg"] = arg
    return event


def is_cut(path: str) -> bool:
    """str() stopped at the limit: the path is longer than what bpftrace printed."""
    return len(os.fsencode(path)) >= STRLEN - 1


def recover_from_fd(pid: int, fd: int, cut: str) -> str:
    """The whole path of a file an open returned as `fd`, from /proc/PID/fd, when it still names
    a file that starts with what bpftrace printed; else the cut path as it is. (The event reaches
    us after the syscall: the descriptor may be closed, or reused, by then — hence the check.)"""
    if fd < 0:
        return cut
    try:
        full = os.readlink(f"/proc/{pid}/fd/{fd}")
    except OSError:
        return cut
    return full if full.startswith(cut) and len(full) > len(cut) else cut


_HIGH_BYTE = re.compile("\uffffff([0-9a-f]{2})")


def kernel_text(text: str) -> str:
    """A printf line as the kernel's bytes, decoded with surrogateescape like every backend.

    bpftrace 0.17's JSON writer escapes each byte ≥ 0x80 of a string as a sign-extended
    `\\uffffffXX` (so JSON readers see U+FFFF then "ffXX"); those are turned back into the byte XX.
    """
    if "\uffff" not in text:
        return text
    raw, pos = bytearray(), 0
    for m in _HIGH_BYTE.finditer(text):
        raw += text[pos : m.start()].encode("utf-8", "surrogateescape")
        raw.append(int(m[1], 16))
        pos = m.end()
    raw += text[pos:].encode("utf-8", "surrogateescape")
    return raw.decode("utf-8", "surrogateescape")
