"""A lab step: one function that measures and returns its results.json section, one that
renders that section into report blocks. Steps hand in-memory objects on through the context."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dlscope.console import console
from dlscope.data.mnist import MNIST
from dlscope.errors import DlscopeError, from_os_error, interrupt_signal, os_error_in
from dlscope.phases import phase
from dlscope.report.blocks import Block
from dlscope.rundir import RunDir
from dlscope.train import TrainConfig, Trainer


@dataclass
class LabOptions:
    """Choices beyond the training config: what to observe and where data comes from."""

    data_dir: str | None = None
    tensorboard: bool = True
    progress: bool = True
    profile_wait: int = 1
    profile_warmup: int = 2
    profile_active: int = 5
    profile_sort: str = "self_cpu"
    resume: str | None = None
    resume_epochs: int | None = None  # --epochs given with --resume: the total to reach
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class LabContext:
    config: TrainConfig
    run: RunDir
    options: LabOptions = field(default_factory=LabOptions)
    data: MNIST | None = None
    trainer: Trainer | None = None
    shared: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class LabStep:
    name: str
    title: str
    run: Callable[[LabContext], dict[str, Any]]
    render: Callable[[dict[str, Any]], list[Block]]


def run_steps(ctx: LabContext, steps: Sequence[LabStep]) -> None:
    """Run steps in order, recording each section as soon as it exists (a crash keeps them)."""
    status = "failed"
    try:
        for step in steps:
            console.rule(f"[phase]{step.title}", align="left", style="dim")
            start = time.perf_counter()
            with phase(step.name), os_faults_named(ctx.run.path, step.name):
                section = step.run(ctx)  # the phase is visible to `dlscope lab --trace-io`, ~µs otherwise
            section["seconds"] = round(time.perf_counter() - start, 3)
            ctx.run.record(step.name, section)
        status = "ok"
    except KeyboardInterrupt as e:
        status = "interrupted"
        ctx.run.results["run"]["signal"] = interrupt_signal(e).name
        raise
    finally:
        ctx.run.finish(status)


@contextlib.contextmanager
def os_faults_named(run_dir: Path, step: str) -> Iterator[None]:
    """An OS fault no closer layer named (a full disk under TensorBoard's writer, torch wrapping
    ENOSPC in a RuntimeError) becomes one line naming the run directory and the step."""
    try:
        yield
    except DlscopeError:
        raise
    except Exception as e:
        cause = os_error_in(e)
        if cause is None:
            raise
        raise from_os_error(cause, f"run the {step} step", run_dir) from None


def artifact(ctx: LabContext, path: str | Path) -> str:
    return ctx.run.rel(path)
