"""The hang watchdog: a thread that reads the live status files of the job's processes once a
second (the job pays nothing for it) and, when no step has ended in any of them for
max(FACTOR × the median step, HANG_AFTER seconds), captures every process of the job
(supervise/capture.py), derives the verdict's facts (analysis/hangverdict.py), writes them to `hang-<n>.json`
in the run directory, and then keeps waiting or ends the job, as asked.

Where it runs: in `dlscope run`'s parent, and in the parent of the built-in job's torchrun ranks;
when the built-in job trains in dlscope's own process, in a thread of that process
(`in_this_process`), which it ends by raising in the main thread instead of signalling itself.

Armed at the first step end: start-up (downloads, compilation, rendezvous) has no step to
measure against. A step that runs long on a core is no hang: while a process that has stepped
keeps its main thread computing and no rank waits in a collective, the clock is not running.
A job whose steps resume after a capture re-arms it. The median step is measured from outside:
between two reads, the time the newest step end moved over the number of steps that ended.

Given a `MachineShare` (supervise/cpushare.py), each poll also reads what the job's processes and
the machine's others got of the cores — with the hang watch off too (`dlscope doctor`'s trials).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from dlscope.analysis.hangverdict import verdict
from dlscope.contract.live import LiveView, read_all
from dlscope.options import HangOptions
from dlscope.supervise.capture import alive, capture, descendants, main_thread_runnable_s
from dlscope.supervise.cpushare import MachineShare

POLL_S = 1.0
# a process whose main thread ran, or waited for a core, at least this share of a poll's wall
# time is computing
BUSY_SHARE = 0.5
GRACE_S = 5.0  # between SIGTERM and SIGKILL when the job is ended
END_SIGNAL = signal.SIGRTMIN + 7  # to this process's main thread: the job it runs itself is ended


class EndedHere(BaseException):
    """Raised in the main thread of a process whose own job the watchdog ended (not an Exception:
    no `except Exception` of the job's code may swallow it)."""


def capture_job(
    directory: Path | None, root: int | None, idle_seconds: float | None, running_only: bool = False
) -> dict[str, Any]:
    """Every process of the job now: those with a live file in `directory`, and those below `root`
    (`running_only`: not those with a live file that are gone)."""
    views = {v.pid: v for v in read_all(directory)} if directory is not None else {}
    if running_only:
        views = {pid: v for pid, v in views.items() if alive(pid)}
    pids = sorted(set(views) | set(descendants(root) if root is not None else []))
    processes = capture(pids, directory, views)
    return {"time": time.time(), "processes": processes, "verdict": verdict(processes, idle_seconds)}


def end_job(pids: list[int], grace: float = GRACE_S) -> list[int]:
    """SIGTERM each process, SIGKILL what is left after `grace`; the pids still there after that."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            if alive(pid):
                with contextlib.suppress(ProcessLookupError):  # it ended meanwhile
                    os.kill(pid, sig)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(alive(p) for p in pids):
            time.sleep(0.05)
    return [p for p in pids if alive(p)]


class Watchdog:
    def __init__(
        self,
        directory: Path,
        run_dir: Path,
        options: HangOptions,
        say: Callable[[str], None],
        machine: MachineShare | None = None,
    ) -> None:
        self.directory, self.run_dir, self.options, self.say = directory, run_dir, options, say
        self.machine = machine
        self.root: int | None = None
        self.steps = deque(maxlen=512)  # measured step seconds, newest last
        self.seen: dict[int, tuple[int, float]] = {}  # pid -> (steps, last step end) at the last read
        self.captures: list[dict[str, Any]] = []
        self.ended = False
        self.fired_at: float | None = None  # the last sign of life a capture was taken after
        # pid -> (its main thread's CPU seconds, when read); when a stepping process last computed
        self.cpu: dict[int, tuple[float, float]] = {}
        self.computed_at = 0.0
        self._main_waits = False  # in_this_process: the main thread takes END_SIGNAL
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="dlscope-watchdog", daemon=True)

    def start(self, root: int | None) -> None:
        """Watch the job whose first process is `root` (None: the live files alone)."""
        self.root = root
        if self.machine is not None:
            self.machine.sample(root, [])  # the first read: the job's first process just started
        if self.options.hang_after is not None or self.machine is not None:
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        if self.machine is not None:  # the last interval: the job's first process reaped by now
            self.machine.sample(self.root, [])
            with contextlib.suppress(OSError):  # a disk full loses this reading, never the run's sections
                self.machine.write(self.directory)

    def threshold(self) -> float:
        median = statistics.median(self.steps) if self.steps else 0.0
        return max(self.options.hang_factor * median, self.options.hang_after or 0.0)

    def observe(self, views: list[LiveView]) -> float | None:
        """Learn step times from the live files; the newest step end (None: no step yet)."""
        newest = None
        for v in views:
            if v.last_step_end is None:
                continue
            steps, last = self.seen.get(v.pid, (0, v.started))
            if v.steps > steps and v.last_step_end > last and steps > 0:
                self.steps.append((v.last_step_end - last) / (v.steps - steps))
            self.seen[v.pid] = (v.steps, v.last_step_end)
            newest = max(newest or 0.0, v.last_step_end)
        return newest

    def computing(self, views: list[LiveView]) -> bool:
        """A process that has stepped keeps its main thread on a core, or waiting for one (≥ BUSY_SHARE
        of the time since the last read: on a busy machine a computing thread waits for a core
        much of the time) while no rank is inside a collective: a step longer than the
        threshold (LBFGS's many closures, a long first step), not a hang. A rank that spins in a
        collective that never ends is inside it: still a hang; so is a loop that never stops."""
        if any(v.collectives_entered > v.collectives_finished for v in views if not v.exited):
            return False
        busy, now = False, time.time()
        for v in views:
            if v.loader_worker or v.exited or not v.steps:
                continue
            cpu = main_thread_runnable_s(v.pid)
            if cpu is None:
                continue
            before = self.cpu.get(v.pid)
            self.cpu[v.pid] = (cpu, now)
            if before is not None and now > before[1] and cpu - before[0] >= BUSY_SHARE * (now - before[1]):
                busy = True
        return busy

    def _loop(self) -> None:
        while not self._stop.wait(POLL_S):
            views = read_all(self.directory)
            if self.machine is not None:
                self.machine.sample(self.root, [v.pid for v in views if not v.exited])
            if self.options.hang_after is None:
                continue
            newest = self.observe(views)
            if self.computing(views):
                self.computed_at = time.time()
            if newest is None:
                continue
            moved = max(newest, self.computed_at)  # the job's last sign of life
            if moved == self.fired_at:
                continue
            idle, limit = time.time() - moved, self.threshold()
            if idle > limit:
                self.fired_at = moved
                self._fire(idle, limit)

    def _fire(self, idle: float, limit: float) -> None:
        taken = capture_job(self.directory, self.root, round(idle, 1))
        number = len(self.captures) + 1
        path = self.run_dir / f"hang-{number}.json"
        path.write_text(json.dumps(taken, indent=1))
        median = statistics.median(self.steps) if self.steps else None
        self.captures.append(
            {
                "file": path.name,
                "time": taken["time"],
                "threshold_seconds": round(limit, 1),
                "median_step_seconds": median,
                "verdict": taken["verdict"],
            }
        )
        self.say(f"dlscope: no step ended for {idle:.0f} s (threshold {limit:.0f} s): every process captured in {path}")
        if self.options.on_hang == "end":
            pids = [p["pid"] for p in taken["processes"] if p["alive"]]
            if self.root is not None:
                pids = sorted(set(pids) | set(descendants(self.root)))
            self.say("dlscope: ending the job (--on-hang end)")
            self.ended = True
            here = os.getpid()  # the job's process is this one (in_this_process): its DataLoader workers go
            self.captures[-1]["left_behind"] = end_job([p for p in pids if p != here])
            self._stop.set()
            if here in pids and self._main_waits:
                signal.pthread_kill(threading.main_thread().ident or 0, END_SIGNAL)

    @contextlib.contextmanager
    def in_this_process(self) -> Iterator[None]:
        """Watch a job that runs in this process's main thread, inside the block: ending it raises
        EndedHere there (a blocked system call is interrupted; code that holds the GIL in C for
        good cannot be — nor can this thread then run). Off the main thread: capture only
        (--on-hang wait), since only the main thread can be interrupted."""
        main = threading.current_thread() is threading.main_thread()
        if not main:
            self.options = dataclasses.replace(self.options, on_hang="wait")

        def raise_ended(signum: int, frame: object) -> None:
            if self._main_waits:
                raise EndedHere

        previous = signal.signal(END_SIGNAL, raise_ended) if main else None
        self._main_waits = main
        self.start(None)
        try:
            yield
        except EndedHere:
            pass  # self.ended says it
        finally:
            self._main_waits = False  # a signal still pending runs a handler that now does nothing
            self.stop()
            if main:
                signal.signal(END_SIGNAL, previous)

    def section(self) -> dict[str, Any] | None:
        """The `hang` results section; None when the watchdog never fired."""
        if not self.captures:
            return None
        return {"settings": dataclasses.asdict(self.options), "ended_job": self.ended, "captures": self.captures}
