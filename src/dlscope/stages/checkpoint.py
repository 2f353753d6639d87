"""Step: save the trained state crash-safely, load it back (weights_only), verify predictions."""

from __future__ import annotations

import time
from typing import Any

from dlscope.checkpoint import save_checkpoint, verify_checkpoint, verify_dict
from dlscope.phases import phase
from dlscope.restore import load_checkpoint
from dlscope.stages.base import Context, Step


def run(ctx: Context) -> dict[str, Any]:
    trainer = ctx.trainer
    assert trainer is not None and trainer.last_predictions is not None  # needs "trained"
    path = ctx.run.sub("checkpoints") / "final.pt"
    with phase("checkpoint_save"):
        saved = save_checkpoint(path, trainer.state_dict())
    start = time.perf_counter()
    with phase("checkpoint_load"):
        loaded = load_checkpoint(path)
    load_seconds = time.perf_counter() - start
    with phase("verify"):
        verified = verify_checkpoint(path, trainer.test_images, trainer.test_labels, reference=trainer.model)
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


STEP = Step("checkpoint", run, needs=("trained",))
