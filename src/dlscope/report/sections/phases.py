"""Section phases (`dlscope run`): startup, first batch, train steps, eval, checkpoints of the script."""

from __future__ import annotations

import os
from typing import Any

from dlscope.findings import Finding
from dlscope.report.blocks import Block, Findings, Method, Table

TITLE = "Phases"


def files_cell(files: list[str]) -> str:
    """Every file, never cut: names under their common directory when they share one (the table
    wraps the cell at narrow widths)."""
    if len(files) < 2:
        return ", ".join(files)
    common = os.path.commonpath(files)
    if common in ("", "/") or common in files:
        return ", ".join(files)
    return f"{common}/: " + ", ".join(os.path.relpath(f, common) for f in files)


def render(section: dict[str, Any]) -> list[Block]:
    rows = [[t["phase"], t["count"], round(t["seconds"], 3), files_cell(t["files"])] for t in section["totals"]]
    return [
        Table(
            ["phase", "times", "s", "files"],
            rows,
            "Phases, all processes",
            legend="startup: until the first pass's iter() or batch; first_batch: until the first step ends; then "
            "train_steps; eval and checkpoint_save/checkpoint_load inside them.",
        ),
        *recurring_findings(section),
        *evaluation_findings(section),
        Method(
            "The phases are found without changing the script, and emitted as dlscope phase markers (so "
            "--trace-io sees them)."
        ),
    ]


def summary_findings(section: dict[str, Any], sections: dict[str, Any]) -> list[Finding]:
    n = section.get("evals_in_train_mode", 0)
    return [Finding("phases.evals_in_train_mode", "warn", {"evals": n})] if n else []


HEADLINES = {  # the summary's words for the warnings it shows
    "phases.evals_in_train_mode": lambda v: (
        f"{v['evals']} evaluation{'s' * (v['evals'] != 1)} ran in train mode with grad: call model.eval() and wrap "
        "it in torch.no_grad()."
    ),
}


# an eval phase this often a step (or more) is the training loop's own work, not an evaluation
EVAL_EVERY_STEP = 0.5


def recurring_findings(section: dict[str, Any]) -> list[Block]:
    """An eval phase about once a step (an RL agent acting in eval mode between its updates, a
    prediction after each optimizer step), and the phases counted past the records a process keeps
    of each name."""
    items = []
    steps = section.get("steps", 0)
    evals = next((t for t in section["totals"] if t["phase"] == "eval"), None)
    if evals and steps >= 20 and evals["count"] >= EVAL_EVERY_STEP * steps:
        items.append(
            (
                "info",
                f"eval ran {evals['count']:,} times over {steps:,} steps, about once a step or more: the loop's "
                "own work with the model between its updates (in eval mode or with no grad), as a "
                "reinforcement-learning agent acts between them (stable-baselines3 collects its experience so) or "
                "a loop predicts after each optimizer step, not a pass over held-out data after an epoch. These "
                f"{evals['seconds']:.3g} s are in no step's time.",
            )
        )
    for name, count in section.get("folded", {}).items():
        items.append(
            (
                "info",
                f"{count:,} more {name} phases were counted, not written, past the first "
                f"{section['records_per_phase']:,} of a process (its records stay bounded at any length): they are "
                "in the table, not on the timeline.",
            )
        )
    return [Findings(items)] if items else []


def evaluation_findings(section: dict[str, Any]) -> list[Block]:
    """What the evaluations' own mode says to change: run in train mode (neither model.eval() nor
    torch.no_grad()), or in eval mode with grad on (no torch.no_grad())."""
    items = []
    n = section.get("evals_in_train_mode", 0)
    if n:
        items.append(
            (
                "warn",
                f"{n} evaluation{'s' * (n != 1)} ran in train mode with grad (neither model.eval() nor "
                "torch.no_grad(): found as batches of a loader of their own, each fed to a training forward, with "
                "no backward()): the model's dropout and batch norm layers, if it has any, ran as in training "
                "(dropout on; batch norm statistics updated from the evaluation's batches), and autograd recorded "
                "graphs nobody used. Call model.eval() and wrap the evaluation in torch.no_grad() (and "
                "model.train() before training again).",
            )
        )
    forwards = section.get("eval_grad_forwards", 0)
    if forwards:
        items.append(
            (
                "info",
                f"{forwards} forward{'s' * (forwards != 1)} in evaluations ran with grad on (model.eval() without "
                "torch.no_grad()): autograd recorded a graph for each, memory and time an evaluation does not "
                "use. Wrap the evaluation in torch.no_grad() (or torch.inference_mode()).",
            )
        )
    return [Findings(items)] if items else []
