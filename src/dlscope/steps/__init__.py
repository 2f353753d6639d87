"""The lab's steps, in the order `dlscope lab` runs them. Adding a step: one module, one line."""

from dlscope.steps import checkpoint, dataset, environment, graph, model, ops, pipeline, profile, sweep, train
from dlscope.steps.base import LabContext, LabOptions, LabStep, run_steps

STEPS: list[LabStep] = [
    environment.STEP,
    dataset.STEP,
    model.STEP,
    train.STEP,
    profile.STEP,
    sweep.STEP,
    checkpoint.STEP,
    ops.STEP,
    graph.STEP,
    pipeline.STEP,
]
STEPS_BY_NAME = {step.name: step for step in STEPS}

__all__ = ["STEPS", "STEPS_BY_NAME", "LabContext", "LabOptions", "LabStep", "run_steps"]
