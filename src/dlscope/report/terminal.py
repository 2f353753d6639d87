"""Blocks on the terminal: the same sections as report.html, sized for the terminal's width.

Tables are laid out for 80 columns first: numbers keep their full width and stay right-aligned,
`optional` columns are left out when they do not fit, paths keep their ends, long text wraps
inside its column, and when even that cannot fit, each row is printed as a short list. No cell
is ever cut to a stub."""

from __future__ import annotations

from collections.abc import Iterable

from rich.cells import cell_len
from rich.console import Console
from rich.table import Table as RichTable
from rich.text import Text

from dlscope.console import console as default_console
from dlscope.console import safe
from dlscope.report.blocks import (
    Block,
    Code,
    Figure,
    Findings,
    Method,
    Para,
    Section,
    Svg,
    Table,
    Verdict,
    fmt,
    is_number,
)
from dlscope.report.flowgraph import shorten

FINDING_STYLE = {"good": ("✔", "good"), "info": ("•", "metric"), "warn": ("⚠", "warn"), "bad": ("✘", "bad")}
GAP = 2  # spaces between columns
HANG = 4  # columns a folded code line's continuation is indented by
MIN_TEXT = 12  # a text column narrower than this would read as stubs: print rows as lists instead
MIN_PATH = 24  # a path kept to its end in fewer characters loses its directory: wrapped instead


def print_blocks(blocks: Iterable[Block], console: Console | None = None) -> None:
    console = console or default_console
    for block in blocks:
        if isinstance(block, Para | Method):
            console.print(safe(block.text))
        elif isinstance(block, Findings):
            for level, text in block.items:
                mark, style = FINDING_STYLE.get(level, FINDING_STYLE["info"])
                table = RichTable.grid(padding=(0, 1))
                table.add_column(no_wrap=True)
                table.add_column()
                table.add_row(f"[{style}]{mark}[/]", safe(text))
                console.print(table)
        elif isinstance(block, Table):
            print_table(block, console)
        elif isinstance(block, Code):
            console.print(safe(hang_lines(block.text, console.width)), style="dim", soft_wrap=True)
        elif isinstance(block, Figure | Svg):
            continue  # drawings live in report.html and report.md
        elif isinstance(block, Verdict):
            word = f"[{block.level}]{block.word}[/] " if block.word else ""
            console.print(f"{word}{safe(block.text)}", soft_wrap=not block.wrap)
            continue
        else:
            raise TypeError(f"unknown block {block!r}")
        console.print()


def print_sections(sections: Iterable[Section], console: Console | None = None) -> None:
    """Whole sections, each under a rule with its title (a report read on the terminal)."""
    console = console or default_console
    for section in sections:
        console.rule(f"[phase]{safe(section.title)}", align="left", style="dim")
        print_blocks(section.blocks, console)


def hang_lines(code: str, width: int) -> str:
    """Code lines longer than `width` folded at a space, in the line's second half where one falls
    there, each continuation indented past the line's own indent, so a folded line never reads as
    the next line of the code (a diff's `-`/`+` lines above all). Never inside a word: a word longer
    than the width (a path) stays whole for the terminal to wrap, so a command copied from it runs."""
    out = []
    for line in code.splitlines():
        indent = " " * (len(line) - len(line.lstrip(" ")) + HANG)
        first = True
        while cell_len(line) > width:
            room = width if first else width - len(indent)
            lead = len(line) - len(line.lstrip(" "))
            cut = line.rfind(" ", max(room // 2, lead + 1), room + 1)
            if cut < 0:
                cut = line.rfind(" ", lead + 1, room + 1)
            if cut < 0:
                cut = line.find(" ", room + 1)
            if cut < 0:
                break
            out.append(line[:cut] if first else indent + line[:cut])
            line, first = line[cut:].lstrip(" "), False
        out.append(line if first else indent + line)
    return "\n".join(out)


def blocks_text(blocks: Iterable[Block], like: Console) -> Text:
    """The blocks as `like` would print them, as one Text (a rich Live view redrawn in place)."""
    import io

    from dlscope.console import THEME

    buffer = Console(
        file=io.StringIO(),
        width=like.width,
        theme=THEME,
        highlight=False,
        force_terminal=like.is_terminal,
        color_system=like.color_system,
    )
    print_blocks(blocks, buffer)
    return Text.from_ansi(buffer.file.getvalue().rstrip("\n"))


def column_kinds(table: Table, cells: list[list[str]]) -> tuple[list[bool], list[int]]:
    """Each column: whether it holds numbers only, and its natural width (its widest cell or header)."""
    n = len(table.columns)
    numeric = [all(is_number(row[i]) or row[i] is None for row in table.rows) for i in range(n)]
    return numeric, [max([cell_len(table.columns[i]), *(cell_len(row[i]) for row in cells)]) for i in range(n)]


def fit_columns(table: Table, cells: list[list[str]], width: int) -> tuple[list[int], bool] | None:
    """The columns to show at this width and whether text must wrap to fit; None when nothing fits."""
    n = len(table.columns)
    numeric, natural = column_kinds(table, cells)

    def need(shown: list[int], wrap: bool) -> int:
        # wrapped text columns go down to MIN_TEXT; numbers and headers never wrap
        widths = [
            max(min(natural[i], MIN_TEXT), cell_len(table.columns[i])) if wrap and not numeric[i] else natural[i]
            for i in shown
        ]
        return sum(widths) + GAP * (len(shown) - 1)

    shown = list(range(n))
    for name in table.optional:  # the first listed goes first
        if need(shown, wrap=False) <= width:
            return shown, False
        if name in table.columns:
            shown.remove(table.columns.index(name))
    if need(shown, wrap=False) <= width:
        return shown, False
    return (shown, True) if need(shown, wrap=True) <= width else None


def path_ends(table: Table, cells: list[list[str]], width: int) -> list[list[str]]:
    """The cells with the `paths` columns' cells kept to their ends ("…" and the last characters)
    where the table would otherwise wrap: to the room the other columns leave, once the optional
    ones are left out, and never under MIN_PATH."""
    fit = fit_columns(table, cells, width)
    if not table.paths or (fit is not None and not fit[1]):
        return cells
    _, natural = column_kinds(table, cells)
    elided = [i for i, name in enumerate(table.columns) if name in table.paths]
    kept = [i for i, name in enumerate(table.columns) if name not in table.optional and i not in elided]
    room = (width - sum(natural[i] for i in kept) - GAP * (len(kept) + len(elided) - 1)) // len(elided)
    if room < max(MIN_PATH, *(cell_len(table.columns[i]) for i in elided)):
        return cells
    return [[shorten(cell, room) if i in elided else cell for i, cell in enumerate(row)] for row in cells]


def print_table(table: Table, console: Console) -> None:
    cells = path_ends(table, [[fmt(v) for v in row] for row in table.rows], console.width)
    if table.caption:
        console.print(f"[bold]{safe(table.caption)}[/]")
    fit = fit_columns(table, cells, console.width)
    if fit is None:
        print_records(table, cells, console)
    else:
        shown, wrap = fit
        rich = RichTable(box=None, padding=(0, GAP // 2), pad_edge=False, header_style="bold", show_edge=False)
        numeric, natural = column_kinds(table, cells)
        for i in shown:
            rich.add_column(
                safe(table.columns[i]),
                justify="right" if numeric[i] else "left",
                no_wrap=numeric[i] or not wrap,
                overflow="fold",
                # numbers keep their full width; text may wrap, never below MIN_TEXT (or its own width)
                min_width=natural[i] if numeric[i] or not wrap else min(natural[i], MIN_TEXT),
            )
        for row in cells:
            rich.add_row(*(safe(row[i]) for i in shown))
        console.print(rich)
        left_out = [table.columns[i] for i in range(len(table.columns)) if i not in shown]
        if left_out:
            console.print(f"[dim]not shown at {console.width} columns: {safe(', '.join(left_out))} (see the report)[/]")
    if table.legend:
        console.print(f"[dim]{safe(table.legend)}[/]")


def print_records(table: Table, cells: list[list[str]], console: Console) -> None:
    """Rows as short lists, for a table too wide for this terminal even with text wrapped."""
    label_width = max(cell_len(c) for c in table.columns)
    for row in cells:
        grid = RichTable.grid(padding=(0, GAP // 2))
        grid.add_column(no_wrap=True, min_width=label_width, style="dim")
        grid.add_column(overflow="fold")
        for column, cell in zip(table.columns, row, strict=True):
            grid.add_row(safe(column), safe(cell))
        console.print(grid)
        console.print()
