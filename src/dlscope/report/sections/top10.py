"""Section top10 (`dlscope run`): the profiler's top-10 operators over real steps of the script."""

from __future__ import annotations

from typing import Any

from dlscope.report.blocks import Block, Method, Para, Table

TITLE = "Top-10 operators of the script"


def operators_table(rows: list[dict[str, Any]], title: str) -> Table:
    return Table(
        ["operator", "calls", "self ms", "self %", "µs/call"],
        [
            [
                r["name"].removeprefix("aten::"),
                r["calls"],
                round(r["self_cpu_us"] / 1000, 3),
                r["self_cpu_pct"],
                round(r["us_per_call"], 1),
            ]
            for r in rows
        ],
        title,
        legend="aten:: omitted from names. self: time in the operator itself, over the profiled steps.",
        optional=("µs/call",),  # a long operator name (a fused attention's backward) keeps its line at 80 columns
    )


def step_range(window: dict[str, Any]) -> str:
    if window.get("first_step") is None:
        return "?"
    first, last = window["first_step"], window["last_step"]
    return str(first) if first == last else f"{first}–{last}"


TRIGGERS = {"schedule": "scheduled", "attach": "dlscope attach"}


def windows_blocks(windows: list[dict[str, Any]], shown_in_full: dict[str, Any] | None) -> list[Block]:
    """Every profiler window with its step range; each one not already shown, with its top operators."""
    if not windows or (len(windows) == 1 and shown_in_full is not None):
        return []
    blocks: list[Block] = [
        Table(
            ["process", "started by", "steps", "profiled", "top operator", "self %"],
            [
                [
                    str(w["pid"]),
                    TRIGGERS.get(w["trigger"], w["trigger"]),
                    step_range(w),
                    w["active_steps"],
                    w["rows"][0]["name"].removeprefix("aten::") if w["rows"] else "-",
                    w["rows"][0]["self_cpu_pct"] if w["rows"] else None,
                ]
                for w in windows
            ],
            f"Profiler windows ({len(windows)}): steps counted from 0 in each process",
            optional=("self %",),
        )
    ]
    for w in windows:
        if shown_in_full is not None and w["pid"] == shown_in_full["pid"] and w["trace"] == shown_in_full["trace"]:
            continue
        title = (
            f"Top {len(w['rows'])} of {w['operators']} operators, process {w['pid']}, steps {step_range(w)} "
            f"({TRIGGERS.get(w['trigger'], w['trigger'])}; trace {w['trace']})"
        )
        blocks.append(operators_table(w["rows"], title))
    return blocks


PHASES = {"eval": "an evaluation", "checkpoint_save": "a checkpoint save", "checkpoint_load": "a checkpoint load"}


def between_blocks(between: dict[str, Any] | None) -> list[Block]:
    """What ran inside the window but in none of its steps (an evaluation, a checkpoint): said, and
    its top operators apart from the steps'."""
    if not between:
        return []
    after: dict[int, list[str]] = {}
    for p in between.get("phases", []):
        after.setdefault(p["after_step"], []).append(PHASES.get(p["phase"], p["phase"]))
    what = "; ".join(f"{' and '.join(names)} after step {step}" for step, names in after.items())
    text = (
        f"Not in these steps: {what or 'what ran between them'}, inside the profiler's window — "
        f"{between['calls']:,} operator calls, {between['self_cpu_total_us'] / 1e3:,.1f} ms of self CPU time, "
        "left out of the top-10."
    )
    table = Table(
        ["operator", "calls", "self ms"],
        [[r["name"].removeprefix("aten::"), r["calls"], round(r["self_cpu_us"] / 1000, 3)] for r in between["rows"]],
        f"Operators outside the profiled steps (top {len(between['rows'])} of {between['operators']})",
    )
    return [Para(text), table]


def before_window(cost: dict[str, Any]) -> str:
    n = cost.get("unprofiled_steps")
    return "" if n is None else f" in the {n} step{'' if n == 1 else 's'} around the window"


def render(section: dict[str, Any]) -> list[Block]:
    windows = section.get("windows", [])
    if not section.get("rows"):
        why = {
            "no_steps": "no training step was seen, so nothing was profiled",
            "unfinished": f"the profiler had not finished when the command ended ({section.get('steps')} steps seen)",
            "off": "the profiler was off (--profile-steps 0)",
            "forked": (
                f"the training process (pid {section.get('pid')}) is a forked child of the command's (hogwild-style "
                "training), and dlscope runs no profiler window in a forked process"
            ),
            "too_few": (
                f"the run ended after {section.get('steps')} steps, before the profiler's window had ended (it "
                f"needs {section.get('needed')}: --start-after, --wait, --warmup and --profile-steps)"
            ),
        }
        no_profile = Para(f"No operator profile: {why.get(section.get('why_empty', ''), 'nothing recorded')}.")
        return [no_profile, *windows_blocks(windows, None)]
    cost = section["profiled_cost"]
    first = next((w for w in windows if w["pid"] == section["pid"]), None)
    steps = "" if first is None else f"steps {step_range(first)}"
    if first is not None and first.get("cut"):
        steps += f"; the window stopped there, past {first['cut']:g} s of recording"
    n = section["active_steps"]
    blocks: list[Block] = [
        operators_table(
            section["rows"],
            f"Top 10 of {section['operators']} operators over {n} profiled step{'' if n == 1 else 's'} "
            f"{f'({steps}) ' if steps else ''}(sorted by {section['sort_by']})",
        ),
        Table(
            ["step", "operators"],
            [[r["step"], r["ops"]] for r in section["ops_per_step"]],
            "Operators per profiled step",
        ),
        *between_blocks(section.get("between")),
    ]
    if cost.get("ratio"):
        text = (
            f"The profiler's own cost: a profiled step took {cost['active_step_ms']:.1f} ms (median) against "
            f"{cost['unprofiled_step_ms']:.1f} ms unprofiled{before_window(cost)} ({cost['ratio']:.2f}×); "
            "between steps it took "
            f"{cost['between_steps_seconds']:.2f} s in all, writing its trace {cost['export_seconds']:.2f} s of "
            "that. Steps outside the schedule run with the profiler off."
        )
        blocks.append(Method(text))
    blocks.append(Para(f"Profiler trace: {section['trace']}."))
    return blocks + windows_blocks(windows, first)
