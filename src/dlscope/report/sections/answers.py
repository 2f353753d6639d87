"""The terminal answers of `ckpt verify|inspect|scan|diff`, `env`, `models`, `data fetch|verify`, `stacks`
and `attach` (dlscope.stages.answers)."""

from __future__ import annotations

from typing import Any

from dlscope.report.blocks import Block, Findings, Para, Verdict
from dlscope.report.sections import environment as environment_section
from dlscope.report.sections import hang, rundiff
from dlscope.report.sections.ckpt_anatomy import WORDS, render_anatomy, render_diff
from dlscope.report.sections.ckpt_scan import VERDICT_LEVEL, render_scan, summary
from dlscope.report.sections.top10 import operators_table, step_range
from dlscope.report.wording import sentence


def ckpt_verify(section: dict[str, Any], options: Any) -> list[Block]:
    path = section["path"]
    if section["format"] == "tf":
        mismatches = section["mismatches"]
        bad = [Verdict("MISMATCH", "bad", f"{m['values']['where']}: {sentence(m, WORDS)[1]}") for m in mismatches]
        return bad or [Verdict("ok", "good", f"{path}: the CRC32C of all {section['tensors']:,} tensors match")]
    if section["ok"]:
        text = f"identical predictions on {section['samples']:,} test images ({section['accuracy_loaded']:.2f}%)"
        return [Verdict("ok", "good", f"{path}: {text}")]
    accuracies = f"saved {section['accuracy_saved']:.2f}%, now {section['accuracy_loaded']:.2f}%"
    return [Verdict("MISMATCH", "bad", f"{path}: predictions differ from the saved fingerprint ({accuracies})")]


def ckpt_scan(section: dict[str, Any], options: Any) -> list[Block]:
    return render_scan(section["files"], limit=options.limit)


def ckpt_inspect(section: dict[str, Any], options: Any) -> list[Block]:
    if "safe_to_load" not in section:  # no anatomy, but what loading it would run: the attack
        return render_scan([section], limit=options.limit)
    blocks = render_anatomy(section, stats_columns=options.stats, limit=options.limit)
    if "verdict" in section:
        blocks.append(Findings([(VERDICT_LEVEL[section["verdict"]], summary(section["evidence"]))]))
    return blocks


def ckpt_diff(section: dict[str, Any], options: Any) -> list[Block]:
    return render_diff(section, limit=options.limit)


def run_diff(section: dict[str, Any], options: Any) -> list[Block]:
    return rundiff.render(section, limit=options.limit)


def environment(section: dict[str, Any], options: Any) -> list[Block]:
    return environment_section.render(section)


def stacks(section: dict[str, Any], options: Any) -> list[Block]:
    return hang.render({"captures": [{"verdict": section["verdict"]}]})


def models(section: dict[str, Any], options: Any) -> list[Block]:
    return [
        Verdict(f"{m['name']:6}", "metric", f"{m['params']:>9,} params  {m['description']}", wrap=True)
        for m in section["zoo"]
    ]


def data_fetch(section: dict[str, Any], options: Any) -> list[Block]:
    text = f"the four MNIST files into {section['raw']}; use them with --data-dir {section['data_dir']}"
    return [Verdict("verified", "good", text, wrap=True)]


def data_verify(section: dict[str, Any], options: Any) -> list[Block]:
    files = [Verdict("ok", "good", f"{key:13} {path}", wrap=True) for key, path in section["files"].items()]
    total = f"{section['train']:,} train + {section['test']:,} test images, checksums verified in {section['s']:.2f}s"
    return [*files, Verdict("", "", total, wrap=True)]


def attach(section: dict[str, Any], options: Any) -> list[Block]:
    asked = options.profile_steps
    blocks: list[Block] = []
    for p in section["processes"]:
        who = f"process {p['pid']}" + ("" if p["rank"] is None else f" (rank {p['rank']})")
        taken = p["taken_at_step"]
        window = p["window"]
        if window is None:
            why = {"timeout": f"not written within {options.timeout:g} s", "ended": "the process ended first"}
            blocks.append(Verdict("NO PROFILE", "bad", f"{who}: {why.get(section['status'], 'not written')}"))
            said = "It never took the request" if taken is None else f"It took the request at step {taken}"
            blocks.append(Para(f"{said}; a window needs one warm-up step and {asked} recorded steps after it."))
            continue
        cut = "" if window["active_steps"] >= asked else f", cut to {window['active_steps']} by the 5 s budget"
        blocks.append(Verdict("profiled", "good", f"{who}: steps {step_range(window)}{cut}"))
        blocks.append(
            operators_table(
                window["rows"],
                f"Top {len(window['rows'])} of {window['operators']} operators, steps {step_range(window)} "
                f"(asked at step {taken}; step {taken + 1} warmed the profiler up)",
            )
        )
        cost = window.get("cost") or {}
        if cost.get("active_step_ms") is not None and cost.get("unprofiled_step_ms") is not None:
            text = (
                f"These steps took {cost['active_step_ms']:,.1f} ms (median) against "
                f"{cost['unprofiled_step_ms']:,.1f} ms for the {cost['unprofiled_steps']} unprofiled steps "
                "around them (the profiler's own cost included)."
            )
            blocks.append(Para(text))
        blocks.append(Para(f"The run's report will list this window. Trace (ui.perfetto.dev): {window['trace']}"))
    return blocks
