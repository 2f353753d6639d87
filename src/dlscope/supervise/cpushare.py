"""The machine's share, read from outside while the job runs (the job pays nothing for it): at each
of the watchdog's polls, the CPU time the job's processes got, the time the job's cores were busy
and dlscope's own time; what the machine's other processes took is the rest (analysis/machine.py).
Also how long the job's threads waited for a core: their run-queue delay.

    /proc/stat, the lines of the cores the job may run on   busy: user, nice, system, steal (a
                                                           hypervisor's other guests); not irq and
                                                           softirq, which serve the job's own I/O
                                                           as much as anyone's
    /proc/PID/stat of each process of the job             utime + stime + cutime + cstime: its
                                                           threads, ended ones included, and its
                                                           children once it reaped them (a pass's
                                                           DataLoader workers)
    /proc/PID/task/TID/schedstat of the job's threads     ns on a core, ns waiting for one

The job's processes are those with a live file (every Python process of it), every process below
them or below its first process (a decoder it started, torchrun's ranks), and every one seen so
far that is still there (a process that marked its live file exited runs on until it ends). A
process of the job that ended keeps the time last read of it, unless a process of the job reaped
it (its time is then in that one's cutime): the job's time never goes back, and only a process's
last second is lost. dlscope's own are this process and the other processes it started for the
run (an I/O tracer): not the children a program that called dlscope had already started (a
notebook's, a test's busy loops) nor theirs, which are others. One
row per interval between two reads, written to MACHINE_FILE in the processes directory when the
sampler stops.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from dlscope.contract.records import MACHINE_COLUMNS, MACHINE_FILE
from dlscope.fsutil import atomic_write_bytes
from dlscope.supervise.capture import read_proc

CLOCK_TICK = os.sysconf("SC_CLK_TCK")
BUSY_FIELDS = (0, 1, 2, 7)  # of a /proc/stat cpu line: user nice system (idle iowait irq softirq) steal


def _stat_fields(pid: int) -> list[str] | None:
    """/proc/PID/stat from its 3rd field (the state) on; None when the process is gone."""
    stat = read_proc(f"/proc/{pid}/stat")
    return stat.rsplit(")", 1)[1].split() if stat else None


def cores_busy_s(cores: set[int]) -> float:
    """CPU seconds these cores have been busy since boot (a guest's time is inside user)."""
    busy = 0
    for line in (read_proc("/proc/stat") or "").splitlines():
        name, _, rest = line.partition(" ")
        if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cores:
            fields = rest.split()
            busy += sum(int(fields[i]) for i in BUSY_FIELDS if i < len(fields))
    return busy / CLOCK_TICK


def process_cpu_s(pid: int) -> float | None:
    """The process's CPU seconds and those of the children it reaped (None: gone)."""
    fields = _stat_fields(pid)
    return sum(int(fields[i]) for i in (11, 12, 13, 14)) / CLOCK_TICK if fields else None


def process_tree() -> tuple[dict[int, list[int]], dict[int, int]]:
    """pid -> its children, and pid -> its parent, from one pass over /proc."""
    children: dict[int, list[int]] = {}
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (fields := _stat_fields(int(entry))):
            parents[int(entry)] = int(fields[1])
            children.setdefault(int(fields[1]), []).append(int(entry))
    return children, parents


def thread_times(pid: int) -> dict[int, tuple[int, int]]:
    """tid -> (ns on a core, ns waiting for one) of each thread of the process now."""
    out: dict[int, tuple[int, int]] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        fields = (read_proc(f"/proc/{pid}/task/{tid}/schedstat") or "").split()
        if len(fields) >= 2:
            out[int(tid)] = (int(fields[0]), int(fields[1]))
    return out


def below(roots: list[int], children: dict[int, list[int]]) -> set[int]:
    """The roots and every process under them."""
    found: set[int] = set()
    todo = list(roots)
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo.extend(children.get(pid, []))
    return found


def job_cores(root: int | None) -> set[int]:
    """The cores the job may run on: its first process's affinity (else this one's, which it inherits)."""
    try:
        return set(os.sched_getaffinity(root or 0))
    except OSError:  # it has ended already
        return set(os.sched_getaffinity(0))


class MachineShare:
    """`sample(root, live)` at each poll; `write(directory)` the intervals between the reads."""

    def __init__(self) -> None:
        self.cores: set[int] | None = None
        # this process's children already there are not dlscope's (nor what they start): others
        children, _ = process_tree()
        self.before = set(children.get(os.getpid(), []))
        self.last: dict[str, Any] | None = None
        self.rows: list[list[float]] = []
        self.known: dict[int, tuple[int, float]] = {}  # the job's processes at the last read: parent, time
        self.ended_s = 0.0  # the time last read of the job's processes that ended, reaped outside the job

    def read(self, root: int | None, live: list[int]) -> dict[str, Any]:
        """Totals now: the cores' busy time, the job's CPU time, dlscope's own, the job's threads'."""
        if self.cores is None:
            self.cores = job_cores(root)
        children, parents = process_tree()
        here = os.getpid()
        roots = [*live, *self.known, *([root] if root is not None else [])]
        job = below([pid for pid in roots if pid in parents], children) - {here}
        own = below([here], children) - job - below(list(self.before), children)
        now: dict[int, tuple[int, float]] = {}
        threads: dict[tuple[int, int], tuple[int, int]] = {}
        for pid in job:
            cpu = process_cpu_s(pid)
            if cpu is not None:
                now[pid] = (parents[pid], cpu)
                threads.update({(pid, tid): t for tid, t in thread_times(pid).items()})
        for pid, (parent, cpu) in self.known.items():
            if pid not in now and parent not in now:  # ended, and no process of the job reaped it
                self.ended_s += cpu
        self.known = now
        job_s = self.ended_s + sum(cpu for _, cpu in now.values())
        mine = os.times()
        own_s = mine.user + mine.system + sum(process_cpu_s(pid) or 0.0 for pid in own - {here})
        return {"time": time.time(), "busy": cores_busy_s(self.cores), "job": job_s, "own": own_s, "threads": threads}

    def sample(self, root: int | None, live: list[int]) -> None:
        now = self.read(root, live)
        last, self.last = self.last, now
        if last is None:
            return
        before, after = last["threads"], now["threads"]
        both = before.keys() & after.keys()  # a thread's first or last interval is left out of its wait
        ran = sum(after[k][0] - before[k][0] for k in both)
        waited = sum(after[k][1] - before[k][1] for k in both)
        self.rows.append(
            [
                round(now["time"], 3),
                round(now["time"] - last["time"], 4),
                round(now["busy"] - last["busy"], 3),
                round(now["job"] - last["job"], 3),
                round(now["own"] - last["own"], 3),
                round(ran / 1e9, 4),
                round(waited / 1e9, 4),
                sum(1 for k in both if after[k][0] > before[k][0]),
            ]
        )

    def write(self, directory: Path) -> None:
        data = {"cores": sorted(self.cores or ()), "columns": list(MACHINE_COLUMNS), "rows": self.rows}
        atomic_write_bytes(directory / MACHINE_FILE, json.dumps(data).encode())
