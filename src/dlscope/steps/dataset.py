"""Step: load MNIST (embedded or --data-dir), verified by the MD5 of every file's content."""

from __future__ import annotations

from typing import Any

from dlscope.console import console
from dlscope.data.mnist import MNIST_FILES, load_mnist
from dlscope.report.blocks import Block, Para, Table
from dlscope.steps.base import LabContext, LabStep


def run(ctx: LabContext) -> dict[str, Any]:
    ctx.data = load_mnist(ctx.options.data_dir)
    info = ctx.data.describe()
    info["md5"] = {key: spec.md5 for key, spec in MNIST_FILES.items()}
    info["uncompressed_bytes"] = {key: spec.size for key, spec in MNIST_FILES.items()}
    console.print(
        f"MNIST from [path]{info['source']}[/]: {info['train_samples']:,} train, "
        f"{info['test_samples']:,} test, checksums [good]verified[/] in {info['load_seconds']:.2f}s"
    )
    return info


def render(section: dict[str, Any]) -> list[Block]:
    rows = [
        [key, section["files"].get(key, "—"), section["uncompressed_bytes"][key], section["md5"][key], "verified"]
        for key in section["md5"]
    ]
    return [
        Para(
            f"MNIST from {section['source']}: {section['train_samples']:,} training and "
            f"{section['test_samples']:,} test images, loaded and verified in "
            f"{section['load_seconds']:.2f} s. Every file is checked by the MD5 of its "
            "uncompressed content, so a single flipped byte is caught. The whole set is held "
            "in memory as uint8 and normalised once; batches are slices by index."
        ),
        Table(["split", "file", "bytes (uncompressed)", "md5", "check"], rows),
    ]


STEP = LabStep("dataset", "Dataset", run, render)
