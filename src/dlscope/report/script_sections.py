"""Report sections of `dlscope run` (run, steps, anatomy, top10, phases): section dict → Blocks.
Tables fit 80 columns: short headers, units in them, a legend line where names are cut."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dlscope.report.blocks import Block, Findings, Para, Table

PARTS = ("data", "forward", "backward", "optimizer", "other")


def _mb(value: int | None) -> float | None:
    return None if value is None else round(value / 2**20, 1)


def render_run(section: dict[str, Any]) -> list[Block]:
    command = " ".join(section.get("command", []))
    code = section.get("exit_code")
    items: list[tuple[str, str]] = []
    if section.get("interrupted"):
        items.append(("warn", "Interrupted (Ctrl-C): the sections show what was recorded until then."))
    if code not in (0, None):
        items.append(("bad", f"The command exited with status {code}; the report covers its run."))
    for error in section.get("hook_errors", []):
        items.append(("bad", f"An observer could not attach: {error}."))
    killed = [p["pid"] for p in section["processes"] if not p["clean_exit"] and not p["forked"]]
    if killed:
        items.append(
            (
                "warn",
                f"Process {', '.join(map(str, killed))} ended without running its exit handlers "
                "(killed, or os._exit): its last phase is closed at its last record.",
            )
        )
    rows = [
        [p["pid"], p["ppid"], "worker" if p["forked"] else "python", p["rank"], " ".join(p["argv"])[-40:]]
        for p in section["processes"]
    ]
    return [
        Para(
            f"Ran `{command}` in {section.get('wall_seconds', 0):.2f} s, exit status {code}; "
            f"{len(rows)} Python process(es) observed. One timeline of all of them: {section.get('timeline')} "
            "(open it at ui.perfetto.dev or chrome://tracing)."
        ),
        Findings(items),
        Table(["pid", "ppid", "kind", "rank", "argv (end)"], rows, "Processes the bootstrap reached"),
    ]


def render_steps(section: dict[str, Any]) -> list[Block]:
    source = {"optimizer": "optimizer steps (torch.optim step hooks)", "backward": "backward() calls (no optimizer)"}
    per_process = ", ".join(f"pid {p['pid']}: {p['count']}" for p in section["processes"] if p["count"])
    rows = [
        [r["step"], r["ms"], *(r[f"{p}_ms"] for p in PARTS), _mb(r["peak_rss_bytes"]), r["profiled"] or ""]
        for r in section["rows"]
    ]
    shown = rows if len(rows) <= 20 else [*rows[:10], *rows[-10:]]
    caption = "Per step (ms; data = DataLoader wait or the gap before forward; MB = peak RSS in the step)"
    if len(rows) > 20:
        caption += f"; first and last 10 of {len(rows)}"
    if not rows:
        return [Para("No training step was seen: no process ran a backward() or an optimizer step.")]
    return [
        Para(
            f"{section['count']} steps in the training process (pid {section['main_pid']}), counted from "
            f"{source[section['source']]}. All processes with steps: {per_process}."
        ),
        Table(["step", "ms", "data", "fwd", "bwd", "opt", "other", "MB", "profiler"], shown, caption),
    ]


def render_anatomy(section: dict[str, Any]) -> list[Block]:
    if not section.get("steps_used"):
        return [Para(section.get("note", "No steps."))]
    level = {"highly": "bad", "moderately": "warn", "not": "good"}[section["input_bound"]]
    rows = [[p, section["mean_ms"][p], section["percent"][p]] for p in PARTS]
    memory = f"Peak RSS in a step: {_mb(section['peak_rss_bytes'])} MB."
    if section.get("peak_cuda_bytes") is not None:
        memory += f" Peak CUDA memory: {_mb(section['peak_cuda_bytes'])} MB."
    return [
        Findings([(level, section["verdict"])]),
        Table(["part", "mean ms", "% of step"], rows, f"Mean step anatomy over {section['used']}"),
        Para(memory),
    ]


def render_top10(section: dict[str, Any]) -> list[Block]:
    if not section.get("rows"):
        return [Para(f"No operator profile: {section.get('note', 'nothing recorded')}.")]
    rows = [
        [r["name"], r["calls"], round(r["self_cpu_us"] / 1000, 3), r["self_cpu_pct"], round(r["us_per_call"], 1)]
        for r in section["rows"]
    ]
    cost = section["profiled_cost"]
    blocks: list[Block] = [
        Table(
            ["operator", "calls", "self ms", "self %", "µs/call"],
            rows,
            f"Top 10 of {section['operators']} operators over {section['active_steps']} profiled steps "
            f"(sorted by {section['sort_by']})",
        ),
        Table(
            ["profiler step", "operators"],
            [[r["step"], r["ops"]] for r in section["ops_per_step"]],
            "Operators per profiled step",
        ),
    ]
    if cost.get("ratio"):
        blocks.append(
            Para(
                f"The profiler's own cost: a profiled step took {cost['active_step_ms']:.1f} ms (median) against "
                f"{cost['unprofiled_step_ms']:.1f} ms unprofiled ({cost['ratio']:.2f}×); writing its trace took "
                f"{cost['export_seconds']:.2f} s. Steps outside the schedule run with the profiler off."
            )
        )
    blocks.append(Para(f"Profiler trace: {section['trace']}."))
    return blocks


def render_phases(section: dict[str, Any]) -> list[Block]:
    rows = [[t["phase"], t["count"], round(t["seconds"], 3), ", ".join(t["files"])[-30:]] for t in section["totals"]]
    return [
        Para(
            "Phases found without changing the script, emitted as dlscope phase markers (so --trace-io sees them): "
            "startup until the first batch, first_batch until the first step ends, then train_steps; eval and "
            "checkpoint_save/checkpoint_load inside them."
        ),
        Table(["phase", "times", "s", "files (end)"], rows, "Phases, all processes"),
    ]


@dataclass(frozen=True)
class SectionView:
    title: str
    render: Callable[[dict[str, Any]], list[Block]]


SECTIONS = {
    "run": SectionView("The observed command", render_run),
    "steps": SectionView("Training steps", render_steps),
    "anatomy": SectionView("Step anatomy", render_anatomy),
    "top10": SectionView("Top-10 operators", render_top10),
    "phases": SectionView("Phases", render_phases),
}
