"""Section dataset: load MNIST (embedded or --data-dir), verified by the MD5 of every file's content."""

from __future__ import annotations

from typing import Any

from dlscope.report.blocks import Block, Para, Table

TITLE = "Dataset"


def render(section: dict[str, Any]) -> list[Block]:
    rows = [
        [
            key,
            section["files"].get(key, "—").rsplit("/", 1)[-1],
            section["uncompressed_bytes"][key],
            section["md5"][key],
        ]
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
        Table(
            ["split", "file", "bytes", "md5"],
            rows,
            "Every file verified",
            legend="bytes and md5 of the uncompressed content",
            optional=("file",),
        ),
    ]
