"""Step: save the trained state crash-safely, load it back (weights_only), verify predictions."""

from __future__ import annotations

import time
from typing import Any

from dlscope.checkpoint import (
    load_checkpoint,
    save_checkpoint,
    verify_checkpoint,
    verify_dict,
)
from dlscope.console import console
from dlscope.report.blocks import Block, Findings, Para, Table
from dlscope.steps.base import LabContext, LabStep


def run(ctx: LabContext) -> dict[str, Any]:
    trainer = ctx.trainer
    assert trainer is not None and trainer.last_predictions is not None, "the train step runs first"
    path = ctx.run.sub("checkpoints") / "final.pt"
    saved = save_checkpoint(path, trainer.state_dict())
    start = time.perf_counter()
    loaded = load_checkpoint(path)
    load_seconds = time.perf_counter() - start
    verified = verify_checkpoint(path, trainer.test_images, trainer.test_labels, reference=trainer.model)
    style = "good" if verified.ok else "bad"
    console.print(
        f"saved [path]{ctx.run.rel(path)}[/] ({saved.bytes / 1024:.0f} KiB, {saved.seconds * 1000:.0f} ms, "
        f"atomic); loaded with weights_only in {load_seconds * 1000:.0f} ms; verify: "
        f"[{style}]{'identical' if verified.ok else 'MISMATCH'}[/] predictions on {verified.samples:,} test images"
    )
    return {
        "path": ctx.run.rel(path),
        "bytes": saved.bytes,
        "save_seconds": saved.seconds,
        "load_seconds": load_seconds,
        "stale_temps_removed": saved.stale_temps_removed,
        "contents": sorted(loaded),
        "epoch": loaded["epoch"],
        "verify": verify_dict(verified),
    }


def render(section: dict[str, Any]) -> list[Block]:
    v = section["verify"]
    level = "good" if v["ok"] else "bad"
    diff = v["logits_max_abs_diff"]
    return [
        Para(
            "The trained state is written crash-safely: a temp file in the same directory, flush, "
            "fsync, os.replace, then fsync of the directory — a partial file never appears under "
            "the final name. It is loaded back with torch.load(weights_only=True), into a fresh model."
        ),
        Findings(
            [
                (
                    level,
                    (
                        f"Reloaded model predicts {'exactly' if v['predictions_identical'] else 'NOT'} the same "
                        "classes "
                        f"on all {v['samples']:,} test images (accuracy {v['accuracy_saved']:.2f}% saved, "
                        f"{v['accuracy_loaded']:.2f}% reloaded)"
                        + (f"; largest logit difference {diff:g}." if diff is not None else ".")
                    ),
                )
            ]
        ),
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


STEP = LabStep("checkpoint", "Checkpoint: save, load, verify", run, render)
