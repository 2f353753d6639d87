"""The lab's steps, in the order `dlscope lab` runs them. Adding a capability: a step module in
steps/, a section module in report/sections, one line in each registry."""

from dlscope.steps import (
    checkpoint,
    ckpt_anatomy,
    dataset,
    distributed,
    distributed_ranks,
    doctor,
    environment,
    graph,
    iotrace,
    model,
    ops,
    pipeline,
    profile,
    scaling,
    script,
    sweep,
    train,
)
from dlscope.steps.base import Step

STEPS: list[Step] = [
    environment.STEP,
    dataset.STEP,
    model.STEP,
    train.STEP,
    profile.STEP,
    sweep.STEP,
    checkpoint.STEP,
    ckpt_anatomy.STEP,
    ops.STEP,
    graph.STEP,
    pipeline.STEP,
]
# iotrace runs around a command (dlscope trace, dlscope lab --trace-io), never inside the lab; run
# observes a user's command (dlscope run); ranks, distributed and the lab's scaling follow train when
# it ran in several ranks (--nproc-per-node)
STEPS_BY_NAME = {
    step.name: step
    for step in [*STEPS, distributed_ranks.STEP, distributed.STEP, scaling.STEP, iotrace.STEP, script.STEP, doctor.STEP]
}
