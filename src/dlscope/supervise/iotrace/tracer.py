"""Trace a command with one backend and turn what it saw into tables and exports.

    outcome = trace_command(["python", "train.py"], "auto", Path("runs/x/iotrace"))
    outcome.exit_code, outcome.section["phases"], outcome.section["files"]

Backends in order of preference: ebpf (root, syscall tracepoints), strace, proc (no privileges,
Python only). `auto` takes the first that is available; a requested one that is not says why in
one line and the next is used. Whatever happens to the command — non-zero exit, crash,
SIGKILL, Ctrl-C — what was seen is analysed. The tracer's exit (bpftrace detaching its probes, ~0.1 s
each) goes on beside the analysis: `outcome.settle()` returns once it is gone, and no tracer outlives
dlscope (its stopping thread is no daemon; the kernel signals it if dlscope dies).
"""

from __future__ import annotations

import os
import shutil
import signal
import statistics
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dlscope.analysis.syscalls import Analysis
from dlscope.contract.ioevents import TRACED_SYSCALLS, Event, FdTables, Reorder
from dlscope.contract.records import RECORDS_SUFFIX, per_process
from dlscope.errors import DlscopeError, interrupt_signal
from dlscope.options import TRACE_BACKENDS
from dlscope.supervise.iotrace import ebpf, proc, strace
from dlscope.supervise.iotrace.exports import FILE_COLUMNS, PHASE_COLUMNS, EventWriters, write_csv
from dlscope.supervise.iotrace.gate import GatedProcess, die_with_parent, exit_code, signal_group, stop
from dlscope.supervise.iotrace.hookpoints import hook_map, kernel_offers

ATTACH_TIMEOUT_S = 90.0
# bpftrace reads the kernel's per-CPU buffers behind the command: a syscall-heavy command leaves a
# backlog when it ends, which a stop would throw away unseen (not counted as lost). The tracer is
# stopped once a mark made on each CPU after the command ended has come through (`drain`), or, where
# no mark can be made, once its output has been silent DRAIN_QUIET_S; either within DRAIN_LIMIT_S.
DRAIN_QUIET_S = 0.3
# marks that never come (bpftrace seeing other pids than dlscope's, in another PID namespace) end the
# drain once its output has been silent this long
MARKS_SILENCE_S = 5.0
# the reader follows bpftrace's output file: this much read at a time, and a pause when it has caught up
FOLLOW_CHUNK = 1 << 20
FOLLOW_POLL_S = 0.02
SPOOL_FILE = "bpftrace.lines"  # bpftrace's output as it writes it; removed once read
DRAIN_LIMIT_S = 120.0
GRACE_S = 10.0  # after the user's signal, how long the command may take to exit before SIGKILL
Say = Callable[[str], None]
Env = dict[str, str] | None  # the command's environment (None: dlscope's own)


class TraceError(DlscopeError):
    """The command cannot be traced (no backend works, or the command cannot start)."""


class BackendUnavailable(Exception):
    """This backend cannot run here; the message says why in one line."""


BACKENDS = {"ebpf": ebpf, "strace": strace, "proc": proc}


def availability() -> dict[str, str | None]:
    """Backend → None when usable here, else why not."""
    return {name: backend.available() for name, backend in BACKENDS.items()}


@dataclass
class Collected:
    """A backend's raw output, before analysis."""

    backend: str
    returncode: int
    command_seconds: float
    interrupted: int | None  # the signal that stopped dlscope while the command ran
    events: Callable[[], Iterator[Event]]
    needs_fd_resolution: bool = False
    notes: dict[str, Any] = field(default_factory=dict)
    scratch: Path | None = None  # the backend's own intermediate files, removed once analysed
    stopping: threading.Thread | None = None  # the tracer's exit, still under way

    def settle(self) -> None:
        """Return once the tracer process is gone."""
        if self.stopping is not None:
            self.stopping.join()

    def discard(self) -> None:
        if self.scratch is None:
            return
        if self.scratch.is_dir():
            shutil.rmtree(self.scratch)
        else:
            self.scratch.unlink(missing_ok=True)


def wait_command(proc: subprocess.Popen) -> tuple[int, int | None]:
    """The command's return code, and the signal that interrupted dlscope meanwhile (None when
    nothing did). The traced command runs in a process group of its own (`process_group=0`), so
    a Ctrl-C at the terminal reaches dlscope alone; dlscope hands the user's signal to that whole
    group, tracer included, and kills the group if it is still there after GRACE_S."""
    try:
        return proc.wait(), None
    except KeyboardInterrupt as e:
        signum = interrupt_signal(e)
    signal_group(proc.pid, signum)
    try:
        return proc.wait(GRACE_S), signum
    except (subprocess.TimeoutExpired, KeyboardInterrupt):  # too slow, or a second Ctrl-C
        signal_group(proc.pid, signal.SIGKILL)
        return proc.wait(), signum


def collect_strace(argv: Sequence[str], work: Path, env: Env = None) -> Collected:
    output = work / "strace.txt"
    start = time.perf_counter()
    child = subprocess.Popen(
        [*strace.command(list(argv), output), "--", *argv], preexec_fn=die_with_parent, process_group=0, env=env
    )
    returncode, interrupted = wait_command(child)  # strace exits with the command's status, signal included
    seconds = time.perf_counter() - start
    if not output.exists():
        raise BackendUnavailable(f"strace did not start (exit {returncode})")
    cwd = os.getcwd()  # the command's at its start (it inherits dlscope's)
    return Collected("strace", returncode, seconds, interrupted, lambda: strace.read_events(output, cwd))


def collect_proc(argv: Sequence[str], work: Path, env: Env = None) -> Collected:
    events_dir = work / "proc-events"
    shutil.rmtree(events_dir, ignore_errors=True)  # records of an earlier trace into this folder
    events_dir.mkdir(parents=True)
    start = time.perf_counter()
    try:
        child = subprocess.Popen(list(argv), env=proc.environment(events_dir, env), process_group=0)
    except OSError as e:
        raise TraceError(f"cannot start the command: {e.strerror}", argv[0]) from None
    returncode, interrupted = wait_command(child)
    seconds = time.perf_counter() - start
    # report.sections.iotrace says what the proc backend cannot see
    notes: dict[str, Any] = {"python_processes": len(per_process(events_dir, RECORDS_SUFFIX))}
    return Collected(
        "proc", returncode, seconds, interrupted, lambda: proc.read_events(events_dir), notes=notes, scratch=events_dir
    )


class EbpfReader(threading.Thread):
    """Follows the file bpftrace writes its lines to, into the trace's sink as they come, while
    the command runs: each line parsed into an event and handed on, so the analysis and the
    exports are done with the command but for the last moment's events (before, they were all
    read back and analysed after it: 5.4 s after Ctrl-C of a job whose start-up made ~46,000
    events, at load 14 on 2 cores). A file, not a pipe: a write to a file never waits, so bpftrace
    drains the kernel's per-CPU buffers at its own pace whatever this thread's (through a pipe, a
    reader slowed by a loaded machine blocked bpftrace and the kernel dropped 36,000 events of a
    two-rank job at load 4, rank 0's phase markers among them). `ready` is set once the probes are
    attached, or when bpftrace has ended without; `finish()` once it has exited: the rest of the
    file is read, then the thread ends. A sink that fails stops taking events; its error is raised
    after the command (`failed`)."""

    def __init__(self, path: Path, sink: TraceSink, counters: ebpf.Counters, names: Mapping[int, str]) -> None:
        super().__init__(daemon=True)
        self.path, self.sink, self.counters, self.names = path, sink, counters, names
        self.ready = threading.Event()
        self.exited = threading.Event()
        self.lines = 0
        self.failed: BaseException | None = None

    def wait_quiet(self) -> None:
        """Return once no line has come for DRAIN_QUIET_S (bpftrace has drained its buffers, or so
        it seems), or after DRAIN_LIMIT_S."""
        self._wait(DRAIN_QUIET_S, lambda: False)

    def _wait(self, quiet: float, done: Callable[[], bool]) -> None:
        """Return once `done()`, once no line has come for `quiet` seconds, or after DRAIN_LIMIT_S;
        read in short polls (a sleep of `quiet` at a time took up to twice that)."""
        now = time.monotonic()
        deadline, seen, last_line = now + DRAIN_LIMIT_S, self.lines, now
        while not done() and now < deadline and now - last_line < quiet:
            time.sleep(FOLLOW_POLL_S)
            now = time.monotonic()
            if self.lines != seen:
                seen, last_line = self.lines, now

    def finish(self) -> None:
        """No line beyond what the file holds now is wanted (bpftrace has drained or exited)."""
        self.exited.set()

    def drain(self, tracer: subprocess.Popen) -> None:
        """Return once every event the command made has been read: a getppid() on each CPU in turn
        prints a "mark" line into that CPU's buffer behind every event written there before, so the
        last CPU's mark read means all is read (bpftrace's $2 is dlscope's pid). Where a thread cannot
        be moved to a CPU, once no line has come for DRAIN_QUIET_S (a guess: a loaded machine can
        hold bpftrace off a core longer). Also returns when bpftrace has exited, when marks do not
        come and its output has been silent MARKS_SILENCE_S, or after DRAIN_LIMIT_S."""
        since = time.monotonic_ns()
        cpus = mark_each_cpu()
        if cpus is None:
            self.wait_quiet()
            return
        marks = self.counters.marks  # run() fills it
        self._wait(MARKS_SILENCE_S, lambda: tracer.poll() is not None or all(marks.get(c, 0) >= since for c in cpus))

    def run(self) -> None:
        pending = ""
        with open(self.path, encoding="utf-8", errors="replace", newline="") as f:
            while True:
                chunk = f.read(FOLLOW_CHUNK)
                if not chunk:
                    if not self.exited.is_set():
                        time.sleep(FOLLOW_POLL_S)
                        continue
                    chunk = f.read()  # what it wrote before it exited and after the read above
                    if not chunk:
                        break
                pending += chunk
                *lines, pending = pending.split("\n")
                for line in lines:
                    self.take(line)
        if pending:
            self.take(pending)
        self.ready.set()

    def take(self, line: str) -> None:
        self.lines += 1
        event = ebpf.parse_line(line, self.counters, self.names)
        if self.counters.ready:
            self.ready.set()
        if event is not None and self.failed is None:
            try:
                self.sink.add(event)
            except Exception as e:  # raised in the main thread once the command is over
                self.failed = e


def mark_each_cpu() -> list[int] | None:
    """getppid() on each CPU this process may run on, from a thread of its own (the caller's own
    CPUs stay as they were): the CPUs marked, or None where the kernel refused to move the thread."""
    cpus = sorted(os.sched_getaffinity(0))
    refused: list[OSError] = []

    def mark() -> None:
        try:
            for cpu in cpus:
                os.sched_setaffinity(0, {cpu})  # this thread only; it moves before the call returns
                os.getppid()
        except OSError as e:
            refused.append(e)

    marker = threading.Thread(target=mark, name="dlscope-marks")
    marker.start()
    marker.join()
    return None if refused else cpus


def collect_ebpf(argv: Sequence[str], work: Path, env: Env = None, sink: TraceSink | None = None) -> Collected:
    """The events go to `sink` as the command runs (by default one writing its exports into `work`)."""
    script = work / "trace.bt"
    plan, version = ebpf.write_program(script)
    if sink is None:
        sink = TraceSink(work, os.getcwd())
    sink.resolve_fds = True  # bpftrace sees descriptor numbers; their paths are known from the opens
    log, lines = work / "bpftrace.log", work / SPOOL_FILE
    lines.write_bytes(b"")  # there before the reader opens it; bpftrace appends to it
    try:
        child = GatedProcess(argv, env)
    except OSError as e:
        raise TraceError(f"cannot start the command: {e.strerror}", argv[0]) from None
    with open(log, "w") as log_file:
        command = ebpf.command(script, child.pid, lines, os.getpid())
        tracer = subprocess.Popen(
            command,
            stdout=subprocess.DEVNULL,
            stderr=log_file,
            env=ebpf.environment(),
            preexec_fn=die_with_parent,
            process_group=0,  # a Ctrl-C at the terminal must not stop it before the command ends
        )
    counters = ebpf.Counters()
    reader = EbpfReader(lines, sink, counters, plan.names)
    reader.start()
    drained, stopping = False, None
    try:
        deadline = time.monotonic() + ATTACH_TIMEOUT_S
        while not reader.ready.wait(0.1) and tracer.poll() is None and time.monotonic() < deadline:
            pass
        if tracer.poll() is not None:
            reader.finish()  # ended before it attached: its last lines, an error among them
            reader.ready.wait(ATTACH_TIMEOUT_S)
        if not counters.ready:
            raise BackendUnavailable(f"bpftrace did not attach: {_last_error(log)}")
        start = time.perf_counter()
        child.release()
        returncode, interrupted = wait_command(child.proc)
        seconds = time.perf_counter() - start
        reader.drain(tracer)  # the per-CPU buffers read before bpftrace stops reading them
        drained = True
    finally:
        if drained:  # bpftrace detaches its probes (~0.1 s each) beside the analysis: `settle` waits
            reader.finish()
            stopping = threading.Thread(target=stop, args=(tracer,), name="dlscope-tracer-stop")
            stopping.start()
        else:  # its last lines (an error among them) read too
            stop(tracer)
            reader.finish()
        signal_group(child.pid, signal.SIGKILL)  # only still there when tracing failed: nothing to flush
        reader.join()
        lines.unlink(missing_ok=True)
    if reader.failed is not None:
        if stopping is not None:
            stopping.join()
        raise reader.failed
    notes = {
        "bpftrace_version": ".".join(map(str, version)),
        "lost_events": counters.lost,
        "truncated_paths": counters.truncated_paths,
        "recovered_paths": counters.recovered_paths,
        "attached_probes": counters.attached_probes,
        "missing_tracepoints": plan.missing,
        "string_limit": ebpf.STRLEN,
    }
    # all its events are in the sink already
    return Collected("ebpf", returncode, seconds, interrupted, lambda: iter(()), True, notes, stopping=stopping)


def _last_error(log: Path) -> str:
    text = log.read_text(errors="replace")
    lines = [line for line in text.splitlines() if "error" in line.lower() and "MEMLOCK" not in line]
    return lines[-1].strip() if lines else "no error message (see bpftrace.log)"


COLLECTORS = {"ebpf": collect_ebpf, "strace": collect_strace, "proc": collect_proc}


def check_command(argv: Sequence[str]) -> None:
    """Refuse, in one line, a command that cannot start — before anything is written."""
    if not argv:
        raise TraceError("no command to trace: dlscope trace [options] -- CMD [ARGS...]")
    if shutil.which(argv[0]) is None:
        raise TraceError("command not found (not an executable on PATH nor a path to one)", argv[0])


def collect(
    argv: Sequence[str], backend: str, work: Path, say: Say, env: Env = None, sink: TraceSink | None = None
) -> tuple[Collected, list[dict[str, str]]]:
    """Run the command under `backend` (or the next one that works); also what was skipped and why.
    A backend that streams (ebpf) hands its events to `sink` as the command runs; the others'
    come from the returned Collected's `events`, after it."""
    check_command(argv)
    order = list(TRACE_BACKENDS) if backend == "auto" else [backend, *(b for b in TRACE_BACKENDS if b != backend)]
    skipped = []
    for name in order:
        try:
            reason = BACKENDS[name].available()
            if reason:
                raise BackendUnavailable(reason)
            if name == "ebpf":  # streams: its events reach the sink as the command runs
                return collect_ebpf(argv, work, env, sink), skipped
            return COLLECTORS[name](argv, work, env), skipped
        except BackendUnavailable as e:
            skipped.append({"backend": name, "why": str(e)})
            say(f"{name} unavailable: {e}; trying the next backend")
    raise TraceError("no tracing backend works here: " + "; ".join(f"{s['backend']}: {s['why']}" for s in skipped))


class TraceSink:
    """What a trace's events become: in time order (Reorder's window), with fd → path filled in
    where the backend saw only numbers (`resolve_fds`), added to the analysis's tables and
    written to the exports (events.jsonl, trace.json). Fed from the ebpf reader's thread while
    the command runs, or after it (strace, proc); `close` hands on the last window."""

    def __init__(self, out_dir: Path, cwd: str) -> None:
        self.cwd, self.resolve_fds = cwd, False
        self.analysis = Analysis()
        self.writers = EventWriters(out_dir)
        self.fds = FdTables()
        self.order = Reorder(self._ordered)
        self.add = self.order.push

    def _ordered(self, event: Event) -> None:
        call = event["call"]
        if self.resolve_fds:
            if call == "fork":
                self.fds.fork(event["pid"], event["tid"])
                return
            if call == "exit":
                self.fds.exit(event["pid"])
                return
            if call == "cwd":
                self.fds.chdir(event, self.cwd)
                return
            if call != "phase" and "dirfd" not in event:  # paths relative to the cwd (AT_FDCWD)
                cwd = self.fds.cwds.get(event["pid"], self.cwd)
                for key in ("path", "target"):
                    path = event.get(key)
                    if path and not path.startswith("/"):
                        event[key] = os.path.normpath(os.path.join(cwd, path))
            if call != "phase":
                self.fds.resolve(event, event.pop("arg", None))
        self.analysis.add(event)
        self.writers.add(event)

    def close(self) -> None:
        try:
            self.order.flush()
        finally:
            self.writers.close()
        self.analysis.finish()


@dataclass
class TraceOutcome:
    backend: str
    exit_code: int
    section: dict[str, Any]
    settle: Callable[[], None]  # returns once the tracer process is gone (it may still be detaching)


def trace_command(argv: Sequence[str], backend: str, out_dir: Path, say: Say = print, env: Env = None) -> TraceOutcome:
    """Trace `argv` and its children; tables into the returned section, exports into out_dir."""
    out_dir.mkdir(parents=True, exist_ok=True)
    sink = TraceSink(out_dir, os.getcwd())
    try:
        collected, skipped = collect(argv, backend, out_dir, say, env, sink)
        sink.resolve_fds = collected.needs_fd_resolution
        for event in collected.events():  # strace's, proc's: after the command (ebpf's came as it ran)
            sink.add(event)
    finally:
        sink.close()
    analysis, writers = sink.analysis, sink.writers
    collected.discard()
    section = analysis.summary()
    phases_csv = write_csv(out_dir / "phases.csv", section["phases"], PHASE_COLUMNS)
    files_csv = write_csv(out_dir / "files.csv", analysis.file_rows(), FILE_COLUMNS)
    seen = [call for call in TRACED_SYSCALLS if call in section["calls"]]
    section.update(
        {
            "backend": collected.backend,
            "requested_backend": backend,
            "skipped_backends": skipped,
            "command": list(argv),
            "exit_code": exit_code(collected.returncode),
            "interrupted": signal.Signals(collected.interrupted).name if collected.interrupted else None,
            "command_seconds": round(collected.command_seconds, 3),
            "notes": collected.notes,
            "kernel": kernel_offers(),
            "hook_points": hook_map(seen),
            "exports": {
                "events": str(writers.events_path),
                "perfetto_trace": str(writers.trace_path),
                "phases_csv": str(phases_csv),
                "files_csv": str(files_csv),
            },
        }
    )
    return TraceOutcome(collected.backend, exit_code(collected.returncode), section, collected.settle)


def timed_run(argv: Sequence[str], backend: str | None, work: Path) -> float:
    """Wall seconds of one run of the command: untraced (backend None) or collected by `backend`
    (collection only: the analysis after it is not part of the command's slowdown; ebpf's runs
    beside the command, as in a trace)."""
    if backend is None:  # output goes where a traced run's goes: same cost
        start = time.perf_counter()
        subprocess.run(list(argv), check=False)
        return time.perf_counter() - start
    work.mkdir(parents=True, exist_ok=True)
    try:
        collected = COLLECTORS[backend](argv, work)
        collected.settle()
        return collected.command_seconds
    finally:
        shutil.rmtree(work, ignore_errors=True)


def measure_overhead(argv: Sequence[str], backend: str, work: Path, repeats: int = 3) -> dict[str, Any]:
    """Untraced and traced runs, interleaved (noise hits both alike); medians and their ratio."""
    plain, traced = [], []
    for i in range(repeats):
        plain.append(timed_run(argv, None, work))
        traced.append(timed_run(argv, backend, work / f"overhead-{i}"))
    return {
        "backend": backend,
        "repeats": repeats,
        "untraced_seconds": [round(s, 3) for s in plain],
        "traced_seconds": [round(s, 3) for s in traced],
        "ratio": round(statistics.median(traced) / statistics.median(plain), 3),
    }
