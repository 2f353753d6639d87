"""report.md read back by a Markdown parser: tables keep their columns, findings one bullet each."""

from __future__ import annotations

from pathlib import Path

from markdown_it import MarkdownIt

from dlscope.report.blocks import Findings, Table
from dlscope.report.render import block_md


def parse_tables(markdown: str) -> list[list[list[str]]]:
    """Every table as rows of cell texts (the header row first), as a GFM renderer sees them."""
    tables, row = [], None
    for token in MarkdownIt("commonmark").enable("table").parse(markdown):
        if token.type == "table_open":
            tables.append([])
        elif token.type == "tr_open":
            row = []
            tables[-1].append(row)
        elif token.type == "inline" and row is not None:
            row.append(token.content)
        elif token.type == "tr_close":
            row = None
    return tables


def assert_tables_whole(markdown: str) -> list[list[list[str]]]:
    tables = parse_tables(markdown)
    for table in tables:
        header = table[0]
        assert all(len(r) == len(header) for r in table), table
    return tables


def test_pipes_in_headers_and_cells_stay_inside_their_cell(tmp_path: Path):
    table = Table(["kernel", "max |err|", "ms"], [["a|b", 1e-6, 2.5], ["conv\nwide", None, 3.0]], "errors | times")
    markdown = block_md(table, tmp_path / "figures", tmp_path)
    (parsed,) = assert_tables_whole(markdown)
    assert parsed[0] == ["kernel", "max |err|", "ms"]
    assert parsed[1][0] == "a|b" and parsed[2][0] == "conv wide"


def test_findings_are_one_bullet_each(tmp_path: Path):
    findings = Findings([("info", "plain"), ("good", "reached"), ("bad", "overhead-bound")])
    markdown = block_md(findings, tmp_path / "figures", tmp_path)
    items = [t.content for t in MarkdownIt("commonmark").parse(markdown) if t.type == "inline"]
    assert items == ["plain", "✔ reached", "✘ overhead-bound"]
