"""`dlscope watch`: one view of a running job (supervise/watching.py's facts), refreshed by
the runner. Two tables that fit 80 columns: the job's figures now, and its processes."""

from __future__ import annotations

from typing import Any

from dlscope.report.blocks import Block, Para, Table, Verdict

TITLE = "The job now"
SHOWN_PARTS = ("data", "gap", "forward", "backward", "optimizer", "other")
PART_NAMES = {"gap": "gap before forward"}
MAX_LISTED = 12  # processes listed one a row; beyond, DataLoader workers are counted instead


def ms(value: float) -> str:
    return f"{value:.3g} ms" if value < 100 else f"{value:,.0f} ms"


def ago(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{seconds:.1f} s ago" if seconds < 120 else f"{seconds / 60:.0f} min ago"


def duration(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}h {rest // 60:02d}m {rest % 60:02d}s" if hours else f"{rest // 60}m {rest % 60:02d}s"


def figures(section: dict[str, Any]) -> list[list[str]]:
    recent = section["recent"]
    rows = []
    if recent is None:
        rows.append(["steps", "no training step has ended yet"])
    else:
        rate = f" · {recent['per_second']:,.2f} a second" if recent["per_second"] else ""
        rows.append(["steps", f"{section['steps']:,} ended{rate} (process {section['main_pid']})"])
        rows.append(
            [
                "step time",
                f"p50 {ms(recent['p50_ms'])} · p90 {ms(recent['p90_ms'])} · p99 {ms(recent['p99_ms'])} · "
                f"max {ms(recent['max_ms'])}, over steps {recent['first']:,}–{recent['last']:,}",
            ]
        )
        rows.append(["slowest", " · ".join(f"step {s['step']:,}: {ms(s['ms'])}" for s in recent["slowest"])])
        mean = recent["mean_ms"]
        step = sum(mean.values()) or 1.0
        always = ("forward", "backward", "optimizer", "other")  # data and gap: when there is some
        shares = [
            f"{PART_NAMES.get(p, p)} {100 * mean[p] / step:.0f}%" for p in SHOWN_PARTS if mean[p] > 0 or p in always
        ]
        rows.append(["anatomy", " · ".join(shares)])
        if recent["data_source"] == "loader":
            wait = f"{ms(mean['data'])} a step ({100 * mean['data'] / step:.1f}%) drawing from the DataLoader"
        else:
            wait = f"no data source seen; the gap before forward is {ms(mean['gap'])} a step"
        rows.append(["data wait", wait])
        if recent["profiling"]:
            rows.append(["profiler", f"recording now ({recent['profiling']} step)"])
    checkpoint = section["checkpoint"]
    if checkpoint is None:
        rows.append(["checkpoint", "none yet"])
    else:
        files = ", ".join(checkpoint["files"]) or checkpoint["kind"]
        verb = "saved" if checkpoint["kind"] == "checkpoint_save" else "loaded"
        when = ago(section["time"] - checkpoint["end"])
        took = ms(checkpoint["seconds"] * 1e3) if checkpoint["seconds"] < 1 else f"{checkpoint['seconds']:.1f} s"
        rows.append(["checkpoint", f"{verb} {files} in {took}, {when}"])
    rows.append(["state", state(section)])
    return rows


def state(section: dict[str, Any]) -> str:
    hang = section["hang"]
    idle = hang["idle_s"]
    if section["ended"]:
        return "ended: no process of the job runs" if section["status"] == "ended" else f"ended ({section['status']})"
    if hang["state"] == "captured":
        return f"hung: no step for {idle:.1f} s; the watchdog captured it ({hang['captures'][-1]})"
    if hang["state"] == "stalled":
        return f"stalled: no step for {idle:.1f} s (the median step is {ms(section['recent']['p50_ms'])})"
    if hang["state"] == "no_steps":
        return "starting: no step yet"
    return f"running: the last step ended {ago(idle)}"


def process_state(p: dict[str, Any]) -> str:
    if not p["running"]:
        return "ended"
    if p["collectives_waiting"] > 0:
        return f"in {p['last_collective']}"
    return "running"


def render(section: dict[str, Any]) -> list[Block]:
    elapsed = duration(section["time"] - section["started"])
    processes = section["processes"]
    workers = [p for p in processes if p["worker"]]
    listed = processes if len(processes) <= MAX_LISTED else [p for p in processes if not p["worker"]]
    blocks: list[Block] = [
        Para(f"dlscope watch {section['run_dir']} · {elapsed} since the job started"),
        Table(["figure", "now"], figures(section), "The job now"),
        Table(
            ["pid", "rank", "role", "steps", "last step", "phase", "state"],
            [
                [
                    str(p["pid"]),
                    "-" if p["rank"] is None else str(p["rank"]),
                    "worker" if p["worker"] else "main",
                    p["steps"],
                    ago(p["last_step_ago_s"]),
                    p["phase"] or "-",
                    process_state(p),
                ]
                for p in listed
            ],
            f"Processes ({len(processes)})",
            optional=("role", "rank", "phase"),
        ),
    ]
    if len(listed) < len(processes):
        running = sum(p["running"] for p in workers)
        blocks.append(Para(f"And {len(workers)} DataLoader workers, {running} of them running."))
    if section["ended"]:
        blocks.append(Verdict("ended", "good" if section["status"] in ("ok", "ended") else "warn", ended_text(section)))
    return blocks


def ended_text(section: dict[str, Any]) -> str:
    status = "" if section["status"] == "ended" else f" ({section['status']})"
    return f"the job has ended{status}; dlscope run writes its report to {section['run_dir']}/report.html"
