"""What a report section is made of; the HTML and Markdown renderers know nothing else."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any


@dataclass
class Para:
    text: str


@dataclass
class Table:
    """Short headers with units (`ms`, `%`), explained by `legend`; numbers right-aligned everywhere.
    `optional` columns are the first a narrow terminal leaves out (the report always shows them all).
    `paths` columns hold paths: a terminal too narrow for them keeps each one's end ("…" and its
    last characters, the file name that tells paths apart) rather than fold it over lines."""

    columns: list[str]
    rows: list[list[Any]]
    caption: str = ""
    legend: str = ""
    optional: tuple[str, ...] = ()
    paths: tuple[str, ...] = ()


@dataclass
class Figure:
    """A matplotlib chart; drawn only when a report needs its PNG (the terminal never does)."""

    name: str  # file stem under figures/
    draw: Callable[[], bytes]
    caption: str = ""

    @cached_property
    def png(self) -> bytes:
        return self.draw()


@dataclass
class Svg:
    """A vector drawing (graphviz output, a data-flow diagram); inlined in HTML, a file for Markdown."""

    name: str  # file stem under figures/
    svg: str
    caption: str = ""


@dataclass
class Method:
    """A sentence on how dlscope measured (its own cost, its method), not on the job: the report
    gathers these from every section into "How this was measured", out of the findings."""

    text: str


@dataclass
class Code:
    text: str
    language: str = ""


@dataclass
class Findings:
    """Plain-language conclusions; level is good, info, warn or bad."""

    items: list[tuple[str, str]] = field(default_factory=list)


@dataclass
class Verdict:
    """A command's answer, `word` styled by its level (good or bad): "ok path: …"; no word: the text
    alone. One line however long (scripts grep it), or folded at the terminal's width if `wrap`."""

    word: str
    level: str
    text: str
    wrap: bool = False


Block = Para | Method | Table | Figure | Svg | Code | Findings | Verdict


@dataclass
class Section:
    key: str
    title: str
    blocks: list[Block]


def is_number(value: Any) -> bool:
    """A cell that is a number (right-aligned everywhere); a bool is not one."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def fmt(value: Any, digits: int = 3) -> str:
    """A cell as text: thousands separators, sensible float precision, '—' for missing."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if value == 0:
            return "0"
        if abs(value) >= 1000:
            return f"{value:,.0f}"
        if abs(value) >= 100:
            return f"{value:.1f}"
        return f"{value:.{digits}g}" if abs(value) < 1 else f"{value:.2f}"
    return str(value)
