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


_CONTROL = {c: f"\\x{c:02x}" for c in [*range(0x00, 0x09), *range(0x0B, 0x20), 0x7F, *range(0x80, 0xA0)]}
# a kernel path's bytes that are not UTF-8, decoded with surrogateescape: shown as the byte \xNN
_CONTROL.update({c: f"\\x{c - 0xDC00:02x}" for c in range(0xDC80, 0xDD00)})
_CONTROL_OR_NEWLINE = {**_CONTROL, 0x0A: "\\n"}


def safe(text: object) -> str:
    """Untrusted text (a traced file name, a pickle's key, a tensor name) made safe to print through rich:
    markup escaped, so `[/x]` cannot crash the printer, and control characters shown as \\xNN, so an
    ESC sequence in a file cannot rewrite the user's terminal. The one place this is done."""
    from rich.markup import escape

    return escape(str(text).translate(_CONTROL))


def one_line(text: object) -> str:
    """Untrusted text for a plain one-line message (errors on stderr): like safe(), newlines
    escaped too, no rich markup involved."""
    return str(text).translate(_CONTROL_OR_NEWLINE)
