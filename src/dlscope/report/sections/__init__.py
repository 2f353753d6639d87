"""One module per results.json section: TITLE and render(section) -> list[Block]. Torch-free:
a report renders from results.json alone, on a machine without the measuring stack."""

from __future__ import annotations

import importlib
from types import ModuleType

SECTION_NAMES = (
    "anatomy",
    "batches",
    "checkpoint",
    "ckpt_anatomy",
    "dataset",
    "distributed",
    "doctor",
    "environment",
    "graph",
    "hang",
    "iotrace",
    "model",
    "ops",
    "phases",
    "pipeline",
    "profile",
    "ranks",
    "run",
    "rundiff",
    "scaling",
    "steps",
    "sweep",
    "top10",
    "train",
)
SECTIONS: dict[str, ModuleType] = {name: importlib.import_module(f"{__name__}.{name}") for name in SECTION_NAMES}
