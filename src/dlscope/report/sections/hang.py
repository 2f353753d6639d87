"""Section hang (`dlscope run`'s watchdog, `dlscope stacks`): the job that stopped moving — who
stopped on which line, who waits in which collective that another rank never entered, who is
blocked reading or writing which file, who died — then every process's state in a table."""

from __future__ import annotations

import os
from typing import Any

from dlscope.findings import Finding
from dlscope.report.blocks import Block, Findings, Para, Table

TITLE = "Hung job: where each process stopped"
NO_STACK = {  # why a process's Python stack is missing (supervise/capture.python_stacks)
    "no_bootstrap": "no dlscope bootstrap in this process",
    "no_answer": "no answer to either stack signal within 2 s",
}


def who(p: dict[str, Any]) -> str:
    if p.get("role") == "worker":
        return f"DataLoader worker pid {p['pid']}"
    return f"rank {p['rank']} (pid {p['pid']})" if p.get("rank") is not None else f"pid {p['pid']}"


def line_of(where: dict[str, Any] | None) -> str:
    if where is None:
        return "(no Python stack)"
    text = f"{os.path.basename(where['file'])}:{where['line']} in {where['function']}"
    if where.get("source"):
        text += f" `{where['source']}`"
    inner = where.get("innermost")
    if inner:
        text += f", inside {inner['function']} ({os.path.basename(inner['file'])}:{inner['line']})"
    return text


def kernel_of(p: dict[str, Any]) -> str:
    call = p.get("syscall")
    if not call:
        return "running" if p.get("wchan") in (None, "0") else f"waiting in {p['wchan']}"
    text = call["name"]
    if call.get("target"):
        text += f" on {call['target']}"
    return text + (f" ({p['wchan']})" if p.get("wchan") not in (None, "0") else "")


def exit_of(dead: dict[str, Any]) -> str:
    status = dead.get("exit")
    if status is None:  # reaped by its parent before the capture: its status went there
        how = (
            "through Python's exit" if dead["exited_python"] else "without Python's exit (a signal, os._exit, a crash)"
        )
        return f"{how}; its exit status went to its parent"
    if "signal" in status:
        return f"killed by signal {status['signal']}"
    return f"with exit status {status['code']}"


def verdict_findings(v: dict[str, Any], hung: bool = True) -> list[tuple[str, str]]:
    """The verdict in words; `hung` False: a capture on demand of a job that may well be moving."""
    items = []
    level, stopped = ("bad", "stopped in") if hung else ("info", "is in")
    for p in v["stopped"]:
        at = f"at step {p['steps']} (phase {p['phase'] or 'none'}; kernel: {kernel_of(p)})"
        items.append((level, f"{who(p)} {stopped} {line_of(p['where'])} {at}"))
    for c in v["collectives"]:
        missing = ", ".join(f"rank {r}" for r in c["missing_ranks"])
        never = f", which {missing} never entered" if missing else " (every rank entered it)"
        wait = f" ({c['syscall']} wait" + (f" in {c['wchan']})" if c["wchan"] not in (None, "0") else ")")
        items.append((level, f"rank {c['rank']} (pid {c['pid']}) waits in {c['op']} #{c['seq']}{never}"
                      + (wait if c["syscall"] else "")))  # fmt: skip
    for io in v["blocked_io"]:
        items.append((level, f"{who(io)} is blocked in {io['syscall']} on {io['path']} at {line_of(io['where'])}"))
    for d in v["died"]:
        items.append(("bad", f"{who(d)} died after step {d['steps']} {exit_of(d)}, while the others wait"))
    if not items:
        items.append((level, "no process stands out: every process's state is in the table below"))
    return items


def process_table(processes: list[dict[str, Any]]) -> Table:
    rows = [
        [
            who(p),
            p["steps"] if p["steps"] is not None else "",
            p["phase"] or "",
            f"{p['collectives_entered']}/{p['collectives_finished']}",
            line_of(p["where"]) if p["where"] else f"({NO_STACK.get(p['python_source'], p['python_source'])})",
            kernel_of(p),
        ]
        for p in processes
    ]
    return Table(
        ["process", "steps", "phase", "coll", "Python (user frame)", "kernel (main thread)"],
        rows,
        "Every process at the capture",
        legend="coll: collectives entered/finished; Python: the innermost frame of the script's own code (of "
        "dlscope's training code in the built-in job), with its line; kernel: the main thread's system call and "
        "the file behind its fd, or its wait channel.",
        optional=("phase", "coll"),
    )


def summary_findings(section: dict[str, Any], sections: dict[str, Any]) -> list[Finding]:
    """The watchdog's captures of a hung job (a capture on demand, `dlscope stacks`, is no hang)."""
    if not section.get("settings"):
        return []
    return [
        Finding(
            "hang.hung",
            "bad",
            {
                "idle_seconds": capture["verdict"]["idle_seconds"],
                "threshold_seconds": capture["threshold_seconds"],
                "verdict": capture["verdict"],
                "ended": section.get("ended_job"),
            },
        )
        for capture in section["captures"]
    ]


HUNG_NAMED = 2  # of a hang's verdict, the first lines the summary says


def _hung(v: dict[str, Any]) -> str:
    said = [text for _, text in verdict_findings(v["verdict"])]
    text = (
        f"The job hung (no step ended for {v['idle_seconds']:.1f} s; threshold {v['threshold_seconds']:.1f} s): "
        + "; ".join(said[:HUNG_NAMED])
        + ("; …" if len(said) > HUNG_NAMED else "")
        + "."
    )
    return text + (" dlscope ended the job (--on-hang end)." if v["ended"] else "")


HEADLINES = {"hang.hung": _hung}  # the summary's words for the warning it shows


def render(section: dict[str, Any]) -> list[Block]:
    blocks: list[Block] = []
    settings = section.get("settings")
    for n, capture in enumerate(section["captures"], 1):
        v = capture["verdict"]
        if settings:
            median = capture.get("median_step_seconds")
            rule = f"max({settings['hang_factor']:g} × the median step" + (f" {median:.3g} s" if median else "")
            text = (
                f"Capture {n} ({capture['file']}): no step ended for {v['idle_seconds']:.1f} s, over the "
                f"threshold of {capture['threshold_seconds']:.1f} s = {rule}, --hang-after "
                f"{settings['hang_after']:g} s)."
            )
            blocks.append(Para(text))
        blocks += [Findings(verdict_findings(v, hung=settings is not None)), process_table(v["processes"])]
    if settings:
        ended = section["ended_job"]
        left = [pid for c in section["captures"] for pid in c.get("left_behind", [])]
        text = (
            (
                "dlscope ended the job (--on-hang end): exit status 124."
                + (f" Still there after SIGKILL: pids {left}." if left else " No process was left behind.")
            )
            if ended
            else "The job was left running (--on-hang wait)."
        )
        blocks.append(Para(text))
    return blocks
