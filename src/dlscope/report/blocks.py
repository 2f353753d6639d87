"""What a report section is made of; the HTML and Markdown renderers know nothing else."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Para:
    text: str


@dataclass
class Table:
    columns: list[str]
    rows: list[list[Any]]
    caption: str = ""


@dataclass
class Figure:
    name: str  # file stem under figures/
    png: bytes
    caption: str = ""


@dataclass
class Svg:
    """A vector drawing (graphviz output, a data-flow diagram); inlined in HTML, a file for Markdown."""

    name: str  # file stem under figures/
    svg: str
    caption: str = ""


@dataclass
class Code:
    text: str
    language: str = ""


@dataclass
class Findings:
    """Plain-language conclusions; level is good, info, warn or bad."""

    items: list[tuple[str, str]] = field(default_factory=list)


Block = Para | Table | Figure | Svg | Code | Findings


@dataclass
class Section:
    key: str
    title: str
    blocks: list[Block]


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
