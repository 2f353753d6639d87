"""The one rich console dlscope prints through (stderr for progress, stdout for results)."""

from __future__ import annotations

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.theme import Theme

THEME = Theme(
    {
        "good": "bold green",
        "bad": "bold red",
        "warn": "yellow",
        "dim": "dim",
        "metric": "cyan",
        "path": "magenta",
        "phase": "bold blue",
    }
)

console = Console(theme=THEME, highlight=False)
err_console = Console(theme=THEME, stderr=True, highlight=False)


def step_progress(enabled: bool = True) -> Progress:
    """The progress bar a lab step shows while it works (on stderr; gone when done)."""
    return Progress(
        TextColumn("[phase]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err_console,
        transient=True,
        disable=not enabled,
    )
