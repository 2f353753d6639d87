"""The eBPF backend: bpftrace on syscall tracepoints (stable ABI), following the process tree
through sched_process_fork, one JSON line per event streamed from its stdout.

What the kernel offers is read from tracefs: each `syscalls/sys_enter_<call>/format` names the
arguments (so the script is generated to match this kernel), and the absence of
`kprobe_events` means no kprobes. Paths are read at syscall exit from the pointer saved at
entry (at entry the page may not be faulted in yet, and str() would return "").
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from dlscope.observe.iotrace.events import FD_ARG_CALLS, KINDS, TRACED_SYSCALLS, Event, make_event

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
    if bpftrace_version() is None:
        return "bpftrace does not run (bpftrace --version failed)"
    return None


@dataclass
class ScriptPlan:
    script: str
    calls: list[str]
    missing: list[str] = field(default_factory=list)  # traced syscalls without a tracepoint here


def build_script(root: Path, arrow: str) -> ScriptPlan:
    """The bpftrace program for this kernel; `arrow` from `args_operator`."""
    # BEGIN runs once every probe is attached ("attached_probes" is printed before that); the
    # command is traced from its exec on, so the launcher's gate (a shell) stays out of the trace
    lines = [
        'BEGIN { @gated[$1] = 1; printf("ready\\n"); }',
        "tracepoint:sched:sched_process_exec /@gated[pid]/ { delete(@gated[pid]); @traced[pid] = 1; }",
    ]
    lines.append(
        "tracepoint:sched:sched_process_fork /@traced[pid]/ { @traced[args{a}child_pid] = 1; "
        'printf("fork\\t%d\\t%d\\t%llu\\n", pid, args{a}child_pid, nsecs); }'.replace("{a}", arrow)
    )
    lines.append(
        "tracepoint:sched:sched_process_exit /@traced[pid] && pid == tid/ { delete(@traced[pid]); "
        'printf("exit\\t%d\\t%d\\t%llu\\n", pid, tid, nsecs); }'
    )
    calls, missing = [], []
    for call in TRACED_SYSCALLS:
        fields = syscall_fields(root, call)
        if fields is None:
            missing.append(call)
            continue
        calls.append(call)
        path = next((f for f in PATH_FIELDS if f in fields), None)
        target = next((f for f in TARGET_FIELDS if f in fields), None)
        fd = next((f for f in FD_FIELDS if f in fields), None)
        arg = next((f for f in ARG_FIELDS if f in fields), None)
        guard = f" && (int32)args{arrow}{fd} >= 0" if call == "mmap" else ""  # anonymous memory: fd -1
        saves = ["@ts[tid] = nsecs;"]
        saves += [f"@p1[tid] = (uint64)args{arrow}{path};"] if path else []
        saves += [f"@p2[tid] = (uint64)args{arrow}{target};"] if target else []
        saves += [f"@fd[tid] = (int32)args{arrow}{fd};"] if fd else []  # int: AT_FDCWD is -100
        saves += [f"@arg[tid] = (int64)args{arrow}{arg};"] if arg else []
        lines.append(f"tracepoint:syscalls:sys_enter_{call} /@traced[pid]{guard}/ {{ {' '.join(saves)} }}")
        fmt = ["%d", "%d", "%llu", "%llu", "%lld", "%lld", "%lld"]
        values = ["pid", "tid", "@ts[tid]", "nsecs - @ts[tid]", f"args{arrow}ret"]
        values += ["@fd[tid]" if fd else "-1", "@arg[tid]" if arg else "-1"]
        if path:
            fmt.append("%s")
            values.append("str(@p1[tid])")
        # two path strings in one printf overflow the 512-byte BPF stack: the target goes first, alone
        before = 'printf("target\\t%d\\t%s\\n", tid, str(@p2[tid])); ' if target else ""
        out = "\\t".join([call, *fmt])
        saved = (("@p1", path), ("@p2", target), ("@fd", fd), ("@arg", arg))
        clear = " ".join(f"delete({m}[tid]);" for m, on in saved if on)
        lines.append(
            f'tracepoint:syscalls:sys_exit_{call} /@ts[tid]/ {{ {before}printf("{out}\\n", {", ".join(values)}); '
            f"delete(@ts[tid]); {clear} }}"
        )
    lines.append("END { clear(@gated); clear(@traced); clear(@ts); clear(@p1); clear(@p2); clear(@fd); clear(@arg); }")
    return ScriptPlan("\n".join(lines) + "\n", calls, missing)


def command(script: Path, pid: int) -> list[str]:
    return ["bpftrace", "-f", "json", str(script), str(pid)]


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


def parse_line(line: str, counters: Counters) -> Event | None:
    """One line of `bpftrace -f json` output into an event (or a fork/exit record)."""
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
    if call in ("fork", "exit"):
        return {"call": call, "pid": int(parts[1]), "tid": int(parts[2]), "ts": int(parts[3]) / 1e9}
    if call == "target":
        target = "\t".join(parts[2:])
        counters.truncated_paths += is_cut(target)
        counters.targets[int(parts[1])] = target
        return None
    pid, tid, start, dur, ret, fd, arg = (int(p) for p in parts[1:8])
    path = "\t".join(parts[8:]) if len(parts) > 8 else None
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
