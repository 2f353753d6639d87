"""From the captured processes of a job (supervise/capture.py) to the facts of one verdict: who
stopped where, who waits in which collective that another rank never entered, who is blocked
on which file, who died. Facts only; report/sections/hang.py words them."""

from __future__ import annotations

import linecache
import os
import sysconfig
from typing import Any

from dlscope.contract.owncode import is_dlscope_code, is_machinery

# frames in these trees are the machinery, not the user's line (scripts: console entry points,
# `dlscope` and `torchrun` themselves)
_LIBRARY_ROOTS = tuple(
    os.path.realpath(sysconfig.get_paths()[kind]) + os.sep for kind in ("stdlib", "purelib", "platlib", "scripts")
)
SOURCE_CHARS = 60  # of the user's line, shown beside file:line
_IO_CALLS = {"read", "write", "pread64", "pwrite64", "readv", "writev", "openat", "fsync", "fdatasync", "flock"}


def _is_user(frame: dict[str, Any]) -> bool:
    path = os.path.realpath(frame["file"])
    installed = f"{os.sep}site-packages{os.sep}" in path or f"{os.sep}dist-packages{os.sep}" in path
    return not (installed or path.startswith(_LIBRARY_ROOTS) or is_dlscope_code(path) or frame["file"].startswith("<"))


def _is_builtin_job(frame: dict[str, Any]) -> bool:
    """dlscope's own training code (the built-in job's), not its observing machinery."""
    path = os.path.realpath(frame["file"])
    return is_dlscope_code(path) and not is_machinery(path)


def _where(frames: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The innermost frame of the user's own code (frames innermost first) — in the built-in job,
    of dlscope's training code; with neither, the innermost that is not dlscope's observing
    code — with its source line, and the innermost frame of all (the library call it is in)."""
    if not frames:
        return None
    user = (
        next((f for f in frames if _is_user(f)), None)
        or next((f for f in frames if _is_builtin_job(f)), None)
        or next((f for f in frames if not is_machinery(os.path.realpath(f["file"]))), frames[0])
    )
    return {
        **user,
        "source": linecache.getline(user["file"], user["line"]).strip()[:SOURCE_CHARS] or None,
        "innermost": frames[0] if frames[0] is not user else None,
    }


def main_thread(process: dict[str, Any]) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """The main thread's kernel state and Python stack (when the process has the bootstrap)."""
    threads = {t["tid"]: t for t in process.get("threads", [])}
    kernel = threads.get(process["pid"])
    live, stacks = process.get("live"), process.get("python") or []
    python = next((s for s in stacks if live and s["ident"] == live["main_thread"]), stacks[-1] if stacks else None)
    return kernel, python


def _blocked_io(process: dict[str, Any]) -> list[dict[str, Any]]:
    """Threads blocked in a system call on a named file (not a socket, a pipe or an event fd)."""
    rows = []
    for thread in process.get("threads", []):
        call = thread["syscall"]
        target = call.get("target") if call else None
        if call and call["name"] in _IO_CALLS and target and target.startswith("/") and not target.startswith("/dev/"):
            rows.append({"tid": thread["tid"], "syscall": call["name"], "path": target, "wchan": thread["wchan"]})
    return rows


def _describe(process: dict[str, Any]) -> dict[str, Any]:
    live = process.get("live") or {}
    kernel, python = main_thread(process)
    return {
        "pid": process["pid"],
        "rank": live.get("rank"),
        "role": "worker" if live.get("loader_worker") else "process",
        "steps": live.get("steps"),
        "phase": live.get("phase"),
        "collectives_entered": live.get("collectives_entered", 0),
        "collectives_finished": live.get("collectives_finished", 0),
        "last_collective": live.get("last_collective"),
        "where": _where(python["frames"]) if python else None,
        "syscall": (kernel or {}).get("syscall"),
        "wchan": (kernel or {}).get("wchan"),
        "blocked_io": _blocked_io(process),
        "python_source": process.get("python_source"),
    }


def verdict(processes: list[dict[str, Any]], idle_seconds: float | None) -> dict[str, Any]:
    """The facts: every process described; the ranks waiting in a collective and the ranks that
    never entered it; the ranks or processes that stopped outside one; the dead; blocked I/O."""
    described = [_describe(p) for p in processes if p["alive"]]
    ranks = [d for d in described if d["rank"] is not None and d["role"] == "process"]
    running = {r["rank"] for r in ranks}
    died = [  # a rank gone while no process of its rank runs (not one torchrun has restarted)
        {
            "pid": p["pid"],
            "rank": p["live"]["rank"],
            "steps": p["live"]["steps"],
            "role": "process",
            "exited_python": p["live"]["exited"],
            "collectives_entered": p["live"]["collectives_entered"],
            "exit": p.get("exit"),
        }
        for p in processes
        if not p["alive"] and p.get("live") and not p["live"]["forked"]
        if p["live"]["rank"] is not None and p["live"]["rank"] not in running
    ]
    waiting = [r for r in ranks if r["collectives_entered"] > r["collectives_finished"]]
    furthest = max((r["collectives_entered"] for r in ranks), default=0)
    collectives = [
        {
            "rank": r["rank"],
            "pid": r["pid"],
            "seq": r["collectives_entered"],
            "op": r["last_collective"],
            "missing_ranks": sorted(
                o["rank"] for o in ranks + died if o["collectives_entered"] < r["collectives_entered"]
            ),
            "syscall": (r["syscall"] or {}).get("name"),
            "wchan": r["wchan"],
        }
        for r in waiting
    ]
    if ranks:  # a rank outside any collective, behind the others: it stopped in its own code
        stopped = [r for r in ranks if r not in waiting and (r["collectives_entered"] < furthest or not waiting)]
    else:
        stopped = [d for d in described if d["role"] == "process" and d["steps"]]
    return {
        "idle_seconds": idle_seconds,
        "stopped": stopped,
        "collectives": collectives,
        "died": died,
        "blocked_io": [
            {**io, "pid": d["pid"], "role": d["role"], "rank": d["rank"], "where": d["where"]}
            for d in described
            for io in d["blocked_io"]
        ],
        "processes": described,
    }


def across_hosts(captures: list[tuple[str, dict[str, Any]]], world_size: int | None) -> dict[str, Any] | None:
    """One verdict from each host's own (host, its last capture's verdict): the furthest collective
    any rank entered, which ranks reached it, which never did (where each is, or that it died), and
    the ranks of the world no host captured. None when no host captured a hang. A rank that reached
    that collective counts whether or not it still waits there: no collective a rank never entered
    completes, so one that ended there ended with an error (its peers were ended meanwhile: hosts
    capture one after another, and one may end its part of the job before another captures)."""
    if not captures:
        return None
    ranks = [
        {**d, "host": host, "died": False}
        for host, found in captures
        for d in found["processes"]
        if d["rank"] is not None and d["role"] == "process"
    ]
    ranks += [{**d, "host": host, "died": True, "where": None} for host, found in captures for d in found["died"]]
    furthest = max((r["collectives_entered"] for r in ranks), default=0)
    reached = [r for r in ranks if r["collectives_entered"] == furthest]
    never = [r for r in ranks if r["collectives_entered"] < furthest]
    seen = {r["rank"] for r in ranks}
    return {
        "seq": furthest,
        "op": next((r["last_collective"] for r in reached if r.get("last_collective")), None),
        "reached": sorted({r["rank"] for r in reached}),
        "never_arrived": [
            {
                "rank": r["rank"],
                "host": r["host"],
                "pid": r["pid"],
                "entered": r["collectives_entered"],
                "died": r["died"],
                "exit": r.get("exit"),
                "phase": r.get("phase"),
                "steps": r.get("steps"),
                "where": r.get("where"),
            }
            for r in sorted(never, key=lambda r: r["rank"])
        ],
        "not_captured": sorted(set(range(world_size)) - seen) if world_size else [],
        "hosts": [{"host": host, "idle_seconds": found.get("idle_seconds")} for host, found in captures],
    }
