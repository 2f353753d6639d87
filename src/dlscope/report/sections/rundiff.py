"""Section rundiff (`dlscope diff RUN_A RUN_B`, the doctor's trials): where step time went between
two runs, worded from the facts dlscope.stages.rundiff measured."""

from __future__ import annotations

from typing import Any

from dlscope.report.blocks import Block, Para, Table
from dlscope.report.sections.anatomy import PART_NAMES
from dlscope.report.wording import worded

TITLE = "Run diff"
ROW_NAMES = {**PART_NAMES, "step": "whole step"}


def _band(v: dict[str, Any]) -> str:
    return f"{v['speedup_low']:.2f}–{v['speedup_high']:.2f}× at {v['confidence']:.0%}"


def _unchanged(v: dict[str, Any]) -> str:
    parts = ", ".join(v["unchanged"]) or "none"
    return f"unchanged (within noise, or under {v['min_change_pct']:.0f}% of the step): {parts}"


def _went(v: dict[str, Any]) -> str:
    return "; ".join(f"{c['part']} went from {c['a_ms']:.3g} ms to {c['b_ms']:.3g} ms" for c in v["changed"])


def _faster_or_slower(v: dict[str, Any]) -> str:
    ratio = f"{v['speedup']:.2f}× faster" if v["speedup"] > 1 else f"{1 / v['speedup']:.2f}× slower"
    why = _went(v) or "no single part changed beyond its noise, the small changes add up"
    return f"B's step is {ratio} ({_band(v)}): {why}. {_unchanged(v).capitalize()}."


def _same_step(v: dict[str, Any]) -> str:
    text = (
        f"No significant difference in step time: {v['a_ms']:.3g} ms in A, {v['b_ms']:.3g} ms in B "
        f"({_band(v)}, changes under {v['min_change_pct']:.0f}% of the step are not called)."
    )
    if v["changed"]:
        return text + f" Yet part of it moved: {_went(v)}."
    floor = v["min_change_pct"]
    return text + f" No part changed significantly (beyond its noise and by {floor:.0f}% of the step or more)."


def _few_steps(v: dict[str, Any]) -> str:
    runs = " and ".join(f"{side.upper()} ({v['steps'][side]} steps)" for side in v["runs"])
    return f"Few steady steps in {runs}: fewer than {v['fewest']} make a wide band; a longer run narrows it."


WORDS = {
    "rundiff.faster": _faster_or_slower,
    "rundiff.slower": _faster_or_slower,
    "rundiff.same_step": _same_step,
    "rundiff.few_steps": _few_steps,
}


def render(section: dict[str, Any], limit: int = 10) -> list[Block]:
    a, b, step = section["a"], section["b"], section["step"]
    blocks: list[Block] = [
        Para(f"A: {a['path']} ({a['steps']} steady steps). B: {b['path']} ({b['steps']} steady steps)."),
        worded(section["findings"], WORDS),
    ]
    rows = [
        [ROW_NAMES[r["part"]], r["a_ms"], r["b_ms"], r["delta_ms"], band_text(r), changed(r)]
        for r in [*section["parts"], {**step, "part": "step"}]
    ]
    blocks.append(
        Table(
            ["part", "A ms", "B ms", "Δ ms", "95% band ms", "changed"],
            rows,
            "Mean step, part by part: B − A over the steady steps (not the first, not the profiler's), "
            "dlscope's own cost taken out",
            legend=f"95% band: where B − A lies, from {section['resamples']:,} block-bootstrap resamples of each "
            f"run's steps; changed: the band excludes 0 and the change is at least {section['min_change_pct']:.0f}% "
            "of the step (small: beyond noise, under that). The band holds each run's own scatter, not a "
            "machine busier during one run than the other: repeat both runs, interleaved, to rule that out.",
        )
    )
    ops = section.get("operators")
    if ops:
        blocks.append(
            Table(
                ["operator", "A µs", "B µs", "Δ µs"],
                [[r["name"], r["a_us"], r["b_us"], r["delta_us"]] for r in ops["rows"][:limit]],
                f"Operators that changed most: self CPU time per profiled step ({ops['a_steps']} profiled steps "
                f"in A, {ops['b_steps']} in B)",
                legend="From each run's profiler top-10; — : not in that run's top 10.",
            )
        )
    else:
        blocks.append(Para("Operators: not compared (both runs need a profiler top-10; `--profile-steps 0` has none)."))
    blocks += io_blocks(section.get("io"), limit)
    return blocks


def changed(row: dict[str, Any]) -> str:
    return "yes" if row["significant"] else "small" if row["beyond_noise"] else ""


def band_text(row: dict[str, Any]) -> str:
    return f"{row['low_ms']:+.3g} … {row['high_ms']:+.3g}"


def io_blocks(io: dict[str, Any] | None, limit: int) -> list[Block]:
    if io is None:
        return [Para("System calls and files: not compared (both runs need `dlscope run --trace-io`).")]
    columns = [("calls", 1), ("bytes", 2**20), ("seconds", 1e-3)]  # shown as calls, MiB, ms

    def cells(r: dict[str, Any], keys: list[tuple[str, float]]) -> list[Any]:
        return [
            r[f"{side}_{k}"] if unit == 1 else round(r[f"{side}_{k}"] / unit, 3) for k, unit in keys for side in "ab"
        ]

    blocks: list[Block] = [
        Table(
            ["syscall", "A calls", "B calls", "A MiB", "B MiB", "A ms", "B ms"],
            [[r["syscall"], *cells(r, [("count", 1), *columns[1:]])] for r in io["syscalls"][:limit]],
            f"System calls that changed most (the whole command: {io['a_seconds']:.1f} s traced in A, "
            f"{io['b_seconds']:.1f} s in B)",
            optional=("A ms", "B ms"),
        )
    ]
    if io["files"] is None:
        return [*blocks, Para("Files: not compared (a run's iotrace/files.csv is missing).")]
    if not io["files"]:
        return [*blocks, Para(f"Files: the same bytes and calls on every file ({io['a_files_total']:,} in A).")]
    blocks.append(
        Table(
            ["file", "A calls", "B calls", "A MiB", "B MiB", "A ms", "B ms"],
            [[r["path"], *cells(r, columns)] for r in io["files"][:limit]],
            f"Files whose bytes or calls changed most ({io['files_changed']:,} changed; "
            f"{io['a_files_total']:,} files touched in A, {io['b_files_total']:,} in B)",
            optional=("A ms", "B ms", "A MiB", "B MiB"),
        )
    )
    return blocks
