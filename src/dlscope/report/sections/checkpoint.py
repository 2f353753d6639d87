"""Section checkpoint: save the trained state crash-safely, load it back (weights_only), verify predictions."""

from __future__ import annotations

from typing import Any

from dlscope.report.blocks import Block, Findings, Para, Table

TITLE = "Checkpoint: save, load, verify"


def render(section: dict[str, Any]) -> list[Block]:
    v = section["verify"]
    level = "good" if v["ok"] else "bad"
    diff = v["logits_max_abs_diff"]
    same = (
        f"Reloaded model predicts {'exactly' if v['predictions_identical'] else 'NOT'} the same classes on all "
        f"{v['samples']:,} test images (accuracy {v['accuracy_saved']:.2f}% saved, {v['accuracy_loaded']:.2f}% "
        "reloaded)" + (f"; largest logit difference {diff:g}." if diff is not None else ".")
    )
    return [
        Para(
            "The trained state is written crash-safely: a temp file in the same directory, flush, "
            "fsync, os.replace, then fsync of the directory — a partial file never appears under "
            "the final name. It is loaded back with torch.load(weights_only=True), into a fresh model."
        ),
        Findings([(level, same)]),
        Table(
            ["item", "value"],
            [
                ["file", section["path"]],
                ["size", f"{section['bytes']:,} bytes"],
                ["save (atomic, fsync)", f"{section['save_seconds'] * 1000:.1f} ms"],
                ["load (weights_only)", f"{section['load_seconds'] * 1000:.1f} ms"],
                ["contents", ", ".join(section["contents"])],
                ["epoch boundary", section["epoch"]],
            ],
        ),
    ]
