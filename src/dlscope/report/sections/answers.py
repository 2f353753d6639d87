"""The terminal answers of `ckpt verify|inspect|scan|diff` and `env` (dlscope.steps.answers)."""

from __future__ import annotations

from typing import Any

from dlscope.report.blocks import Block, Findings, Verdict
from dlscope.report.sections import environment as environment_section
from dlscope.report.sections import hang, rundiff
from dlscope.report.sections.ckpt_anatomy import render_anatomy, render_diff
from dlscope.report.sections.ckpt_scan import VERDICT_LEVEL, render_scan


def ckpt_verify(section: dict[str, Any], options: Any) -> list[Block]:
    path = section["path"]
    if section["format"] == "tf":
        bad = [Verdict("MISMATCH", "bad", f"{m['where']}: {m['what']}") for m in section["mismatches"]]
        return bad or [Verdict("ok", "good", f"{path}: the CRC32C of all {section['tensors']:,} tensors match")]
    if section["ok"]:
        text = (
            f"{path}: identical predictions on {section['samples']:,} test images ({section['accuracy_loaded']:.2f}%)"
        )
        return [Verdict("ok", "good", text)]
    return [
        Verdict(
            "MISMATCH",
            "bad",
            f"{path}: predictions differ from the saved fingerprint "
            f"(saved {section['accuracy_saved']:.2f}%, now {section['accuracy_loaded']:.2f}%)",
        )
    ]


def ckpt_scan(section: dict[str, Any], options: Any) -> list[Block]:
    return render_scan(section["files"], limit=options.limit)


def ckpt_inspect(section: dict[str, Any], options: Any) -> list[Block]:
    if "safe_to_load" not in section:  # no anatomy, but what loading it would run: the attack
        return render_scan([section], limit=options.limit)
    blocks = render_anatomy(section, stats_columns=options.stats, limit=options.limit)
    if "verdict" in section:
        blocks.append(Findings([(VERDICT_LEVEL[section["verdict"]], section["summary"])]))
    return blocks


def ckpt_diff(section: dict[str, Any], options: Any) -> list[Block]:
    return render_diff(section, limit=options.limit)


def run_diff(section: dict[str, Any], options: Any) -> list[Block]:
    return rundiff.render(section, limit=options.limit)


def environment(section: dict[str, Any], options: Any) -> list[Block]:
    return environment_section.render(section)


def stacks(section: dict[str, Any], options: Any) -> list[Block]:
    return hang.render({"captures": [{"verdict": section["verdict"]}]})
