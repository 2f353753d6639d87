"""The steps by name, each module imported only when a plan runs its step: `dlscope run` observes
a script in a child process, and its own process never pays for the lab's torch-heavy steps.
Adding a capability: a step module in stages/, a section module in report/sections, one line in
each registry."""

from __future__ import annotations

import importlib

from dlscope.stages.base import Step

# Every step's name -> the module in dlscope.stages whose STEP it is (the lab's, in the order `dlscope
# lab` runs them: dlscope.cli.lab.LAB_STEPS). iotrace runs around a command (dlscope trace, dlscope
# lab --trace-io), never inside the lab; run observes a user's command (dlscope run); ranks,
# distributed and the lab's scaling follow train when it ran in several ranks (--nproc-per-node)
STEP_MODULES = {
    "environment": "environment",
    "dataset": "dataset",
    "model": "model",
    "train": "train",
    "profile": "profile",
    "sweep": "sweep",
    "checkpoint": "checkpoint",
    "ckpt_anatomy": "ckpt_anatomy",
    "ops": "ops",
    "graph": "graph",
    "pipeline": "pipeline",
    "ranks": "distributed_ranks",
    "distributed": "distributed",
    "scaling": "scaling",
    "iotrace": "iotrace",
    "run": "script",
    "doctor": "doctor",
    "merge": "merge",
}


def step_named(name: str) -> Step:
    """The step `name` (a name of STEP_MODULES), its module imported now."""
    step: Step = importlib.import_module(f"dlscope.stages.{STEP_MODULES[name]}").STEP
    return step
