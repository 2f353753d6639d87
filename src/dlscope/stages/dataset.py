"""Step: load MNIST (embedded or --data-dir), verified by the MD5 of every file's content."""

from __future__ import annotations

from typing import Any

from dlscope.data.mnist import MNIST_FILES
from dlscope.stages.base import Context, Step


def run(ctx: Context) -> dict[str, Any]:
    assert ctx.data is not None  # provided by the runner: this step needs "dataset"
    info = ctx.data.describe()
    info["md5"] = {key: spec.md5 for key, spec in MNIST_FILES.items()}
    info["uncompressed_bytes"] = {key: spec.size for key, spec in MNIST_FILES.items()}
    return info


STEP = Step("dataset", run, needs=("dataset",))
