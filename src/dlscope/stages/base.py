"""A step measures one thing and returns its results.json section. It prints nothing: the runner
renders the section (report/sections) on the terminal and into the report.

A step declares what it needs; the runner provides it (or refuses the plan before anything runs):
    "dataset"  MNIST in ctx.data
    "trainer"  a Trainer in ctx.trainer (a fresh one unless the train step ran)
    "trained"  the train step ran earlier in this command
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from dlscope.options import RunOptions, StepOptions

if TYPE_CHECKING:
    from dlscope.config import TrainConfig
    from dlscope.data.mnist import MNIST
    from dlscope.rundir import RunDir
    from dlscope.train import Trainer


class Task(Protocol):
    """Feedback from a long step (a progress bar on the terminal; nothing with --no-progress)."""

    def update(self, description: str | None = None, total: int | None = None, advance: int = 0) -> None: ...


@dataclass
class Context:
    config: TrainConfig
    run: RunDir
    options: RunOptions = field(default_factory=RunOptions)
    steps: StepOptions = field(default_factory=StepOptions)
    data: MNIST | None = None
    trainer: Trainer | None = None
    task: Callable[..., AbstractContextManager[Task]] = lambda description, total=None: nullcontext(QUIET)
    say: Callable[[str], None] = lambda text: None  # a one-line note to the user (stderr)

    def section(self, name: str) -> dict[str, Any]:
        """A section an earlier step of this command recorded ({} when it did not run)."""
        return self.run.results["sections"].get(name) or {}


@dataclass(frozen=True)
class Step:
    name: str  # the results.json section it writes
    run: Callable[[Context], dict[str, Any]]
    needs: tuple[str, ...] = ()
    also: tuple[str, ...] = ()  # further sections it records itself (ctx.run.record), shown after its own


class _QuietTask:
    def update(self, description: str | None = None, total: int | None = None, advance: int = 0) -> None:
        pass


QUIET = _QuietTask()
