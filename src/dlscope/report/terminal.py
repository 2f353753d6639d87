"""Blocks on the terminal: the same blocks the report renders, printed through rich."""

from __future__ import annotations

from rich import box
from rich.table import Table as RichTable

from dlscope.console import console, safe
from dlscope.report.blocks import Block, Code, Findings, Para, Table, fmt

MARK = {"good": "[good]✔[/]", "info": "•", "warn": "[warn]⚠[/]", "bad": "[bad]✘[/]"}


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def print_blocks(blocks: list[Block]) -> None:
    for block in blocks:
        if isinstance(block, Para):
            console.print(safe(block.text))
        elif isinstance(block, Findings):
            for level, text in block.items:
                console.print(f"{MARK.get(level, '•')} {safe(text)}")
        elif isinstance(block, Table):
            table = RichTable(title=safe(block.caption), title_justify="left", box=box.SIMPLE_HEAD)
            numeric = [bool(block.rows) and _is_number(block.rows[0][i]) for i in range(len(block.columns))]
            for column, right in zip(block.columns, numeric, strict=True):
                table.add_column(safe(column), justify="right" if right else "left", overflow="fold")
            for row in block.rows:
                table.add_row(*(safe(fmt(v)) for v in row))
            console.print(table)
        elif isinstance(block, Code):
            console.print(safe(block.text))
        else:  # figures and drawings: in the report only
            console.print(f"[dim]({safe(block.caption or block.name)}: see the report)[/]")
