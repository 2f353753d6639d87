"""The terminal answers of `ckpt verify|inspect|scan|diff`, `env`, `models`, `data fetch|verify` and `stacks`
(dlscope.steps.answers)."""

from __future__ import annotations

from typing import Any

from dlscope.report.blocks import Block, Findings, Verdict
from dlscope.report.sections import environment as environment_section
from dlscope.report.sections import hang
from dlscope.report.sections.ckpt_anatomy import WORDS, render_anatomy, render_diff
from dlscope.report.sections.ckpt_scan import VERDICT_LEVEL, render_scan, summary
from dlscope.report.wording import sentence


def ckpt_verify(section: dict[str, Any], options: Any) -> list[Block]:
    path = section["path"]
    if section["format"] == "tf":
        mismatches = section["mismatches"]
        bad = [Verdict("MISMATCH", "bad", f"{m['values']['where']}: {sentence(m, WORDS)[1]}") for m in mismatches]
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
        blocks.append(Findings([(VERDICT_LEVEL[section["verdict"]], summary(section["evidence"]))]))
    return blocks


def ckpt_diff(section: dict[str, Any], options: Any) -> list[Block]:
    return render_diff(section, limit=options.limit)


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
