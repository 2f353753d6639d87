"""Step: the model summary — layers, output shapes, parameters, FLOPs forward and per step."""

from __future__ import annotations

from typing import Any

import torch

from dlscope.data.loaders import normalise
from dlscope.instruments.summary import summarize_model
from dlscope.models import MODELS, build_model
from dlscope.phases import phase
from dlscope.stages.base import Context, Step


def run(ctx: Context) -> dict[str, Any]:
    assert ctx.data is not None
    config = ctx.config
    torch.manual_seed(config.seed)
    with phase("model_build"):
        model = build_model(config.model)
    n = min(config.batch_size, len(ctx.data.train_labels))
    summary = summarize_model(model, normalise(ctx.data.train_images[:n]), ctx.data.train_labels[:n])
    summary["name"] = config.model
    summary["description"] = MODELS[config.model].description
    return summary


STEP = Step("model", run, needs=("dataset",))
