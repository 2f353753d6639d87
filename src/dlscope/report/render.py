"""results.json → report.html (self-contained: inline CSS, figures as data URIs) and report.md."""

from __future__ import annotations

import base64
import html
import json
import re
from pathlib import Path
from typing import Any

from jinja2 import Environment, PackageLoader, select_autoescape

from dlscope.console import printable
from dlscope.fsutil import atomic_write_bytes
from dlscope.report.blocks import Block, Code, Figure, Findings, Method, Para, Section, Svg, Table, fmt, is_number
from dlscope.rundir import SCHEMA_VERSION, load_results

FINDING_MARK = {"good": "✔", "info": "•", "warn": "⚠", "bad": "✘"}
MD_FINDING_MARK = {"good": "✔ ", "warn": "⚠ ", "bad": "✘ "}


INLINE_CODE = re.compile(r"`([^`\n]+)`")


def inline_html(text: str) -> str:
    """Escaped text with the Markdown inline code the sections write (`dlscope graph`) as <code>."""
    parts = INLINE_CODE.split(printable(text))  # odd indices are the code spans
    return "".join(f"<code>{html.escape(p)}</code>" if i % 2 else html.escape(p) for i, p in enumerate(parts))


def png_width(png: bytes) -> int:
    """Pixel width from the PNG's IHDR chunk (bytes 16–20)."""
    return int.from_bytes(png[16:20], "big")


# A figure is never shown below this share of its drawn size, so its text stays ≥ 11 px (matplotlib's
# 9 pt at 110 dpi, graphviz's 10 pt); on a narrow screen it scrolls inside its own box instead.
MIN_FIGURE_SCALE = 0.8


def block_html(block: Block) -> str:
    if isinstance(block, Para | Method):
        return f"<p>{inline_html(block.text)}</p>"
    if isinstance(block, Table):
        head = "".join(f"<th>{inline_html(c)}</th>" for c in block.columns)
        body = "".join(
            "<tr>"
            + "".join(
                f'<td class="num">{html.escape(fmt(v))}</td>' if is_number(v) else f"<td>{inline_html(fmt(v))}</td>"
                for v in row
            )
            + "</tr>"
            for row in block.rows
        )
        caption = f"<caption>{inline_html(block.caption)}</caption>" if block.caption else ""
        legend = f'<p class="legend">{inline_html(block.legend)}</p>' if block.legend else ""
        table = f"<table>{caption}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
        return f'<div class="scroll">{table}</div>{legend}'
    if isinstance(block, Figure):
        data = base64.b64encode(block.png).decode()
        caption = f"<figcaption>{inline_html(block.caption)}</figcaption>" if block.caption else ""
        alt = html.escape(printable(block.caption or block.name))
        min_width = round(png_width(block.png) * MIN_FIGURE_SCALE)
        img = f'<img alt="{alt}" style="min-width:{min_width}px" src="data:image/png;base64,{data}">'
        return f'<figure><div class="scroll">{img}</div>{caption}</figure>'
    if isinstance(block, Svg):
        caption = f"<figcaption>{inline_html(block.caption)}</figcaption>" if block.caption else ""
        return f'<figure class="svg"><div class="scroll">{inline_svg(printable(block.svg))}</div>{caption}</figure>'
    if isinstance(block, Code):
        return f"<pre><code>{html.escape(printable(block.text))}</code></pre>"
    if isinstance(block, Findings):
        items = "".join(
            f'<li class="{level}">{FINDING_MARK.get(level, "•")} {inline_html(text)}</li>'
            for level, text in block.items
        )
        return f'<ul class="findings">{items}</ul>'
    raise TypeError(f"unknown block {block!r}")


SVG_WIDTH_PT = re.compile(r'<svg\b[^>]*?\swidth="([\d.]+)pt"')


def inline_svg(svg: str) -> str:
    """An SVG document as an inline element: drop the XML declaration and DOCTYPE, keep <svg…>,
    kept at MIN_FIGURE_SCALE of its drawn width or more (graphviz gives the width in points)."""
    start = svg.find("<svg")
    if start < 0:
        raise ValueError("not an SVG document")
    svg = svg[start:]
    width = SVG_WIDTH_PT.match(svg)
    if width:
        min_width = round(float(width.group(1)) * 4 / 3 * MIN_FIGURE_SCALE)
        svg = f'<svg style="min-width:{min_width}px"' + svg[len("<svg") :]
    return svg


def md_cell(value: Any) -> str:
    """A table cell or header: a `|` would end the cell, a newline the row."""
    return printable(fmt(value).replace("\n", " ")).replace("|", "\\|")


def block_md(block: Block, figures_dir: Path, run_dir: Path) -> str:
    if isinstance(block, Para | Method):
        return printable(block.text)
    if isinstance(block, Table):
        lines = [f"*{printable(block.caption)}*", ""] if block.caption else []
        lines.append("| " + " | ".join(md_cell(c) for c in block.columns) + " |")
        lines.append(
            "|"
            + "|".join(
                "---:" if block.rows and is_number(v) else "---"
                for v in (block.rows[0] if block.rows else block.columns)
            )
            + "|"
        )
        lines += ["| " + " | ".join(md_cell(v) for v in row) + " |" for row in block.rows]
        if block.legend:
            lines += ["", printable(block.legend)]
        return "\n".join(lines)
    figures_dir.mkdir(parents=True, exist_ok=True)
    if isinstance(block, Figure | Svg):
        # an SVG made printable: no surrogate-escaped bytes left
        suffix, data = ("png", block.png) if isinstance(block, Figure) else ("svg", printable(block.svg).encode())
        path = atomic_write_bytes(figures_dir / f"{block.name}.{suffix}", data)
        return f"![{printable(block.caption or block.name)}]({path.relative_to(run_dir)})"
    if isinstance(block, Code):
        return f"```{block.language}\n{printable(block.text)}\n```"
    if isinstance(block, Findings):
        # the list item is the bullet: only marks that say something (✔ ⚠ ✘) are added
        return "\n".join(f"- {MD_FINDING_MARK.get(level, '')}{printable(text)}" for level, text in block.items)
    raise TypeError(f"unknown block {block!r}")


def unknown_section(section: dict[str, Any]) -> list[Block]:
    """A section this version has no renderer for (a newer dlscope wrote it): show its data."""
    return [
        Para("No renderer for this section in this dlscope version; its data:"),
        Code(json.dumps(section, indent=2, ensure_ascii=False)[:20000], "json"),
    ]


def build_sections(results: dict[str, Any]) -> list[Section]:
    """Every recorded section as Blocks. A renderer that fails on data of this schema version is a
    bug and raises; only a section written by an older dlscope (or one this version has no renderer
    for) becomes a note with its data, so an old run directory still gets a report."""
    from dlscope.report.sections import SECTIONS

    older = results["schema_version"] < SCHEMA_VERSION
    sections = []
    for key in results.get("steps") or list(results["sections"]):
        data = results["sections"].get(key)
        if data is None:
            continue
        renderer = SECTIONS.get(key)
        if renderer is None:
            sections.append(Section(key, key, unknown_section(data)))
            continue
        try:
            blocks = renderer.render(data)
        except (KeyError, TypeError, ValueError, IndexError) as e:
            if not older:
                raise
            note = (
                f"Written by an older dlscope (results schema v{results['schema_version']}, this one reads "
                f"v{SCHEMA_VERSION}): this section could not be rendered ({type(e).__name__}: {e})."
            )
            blocks = [Findings([("warn", note)]), *unknown_section(data)[1:]]
        sections.append(Section(key, renderer.TITLE, blocks))
    return sections


METHOD = ("method", "How this was measured")


def report_sections(results: dict[str, Any]) -> list[Section]:
    """The report as it reads: the summary first (a `dlscope run`'s), then every section with its
    tables and reasoning, and last "How this was measured": each section's sentences on dlscope's
    own cost and method (its Method blocks), taken out of it."""
    from dlscope.report.runsummary import SUMMARY, summary_blocks

    sections, method = [], []
    for section in build_sections(results):
        said = [b.text for b in section.blocks if isinstance(b, Method)]
        if said:
            method.append(Para(f"{section.title}: {' '.join(said)}"))
        sections.append(Section(section.key, section.title, [b for b in section.blocks if not isinstance(b, Method)]))
    summary = summary_blocks(results)
    head = [Section(*SUMMARY, summary)] if summary else []
    return head + sections + ([Section(*METHOD, method)] if method else [])


def render_report(run: str | Path) -> tuple[Path, Path]:
    """Write report.html and report.md into the run directory from its results.json."""
    run = Path(run)
    results = load_results(run)  # first: its errors name the path as given
    run_dir = run if run.is_dir() else run.parent
    sections = report_sections(results)
    env = Environment(loader=PackageLoader("dlscope.report"), autoescape=select_autoescape())
    page = env.get_template("report.html.j2").render(
        run={"wall_seconds": None, **results["run"], "error": printable(results["run"].get("error") or "")},
        version=results.get("dlscope_version"),
        schema=results["schema"],
        schema_version=results["schema_version"],
        sections=[{"key": s.key, "title": s.title, "blocks": [block_html(b) for b in s.blocks]} for s in sections],
    )
    html_path = atomic_write_bytes(run_dir / "report.html", page.encode("utf-8", "surrogateescape"))
    figures = run_dir / "figures"
    info = results["run"]
    md = [
        f"# dlscope report — {info['name']}",
        "",
        f"`dlscope {' '.join(info.get('argv') or [info['command']])}`"
        + f" · started {info['started']} · status **{info['status']}**",
        "",
    ]
    if info.get("error"):
        md += [f"**The run {info['status']}:** {printable(info['error'])}", ""]
    md += [f"- [{s.title}](#{s.key})" for s in sections]
    for s in sections:
        md += ["", f'<a id="{s.key}"></a>', f"## {s.title}", ""]
        md += [block_md(b, figures, run_dir) + "\n" for b in s.blocks]
    md_path = atomic_write_bytes(run_dir / "report.md", "\n".join(md).encode("utf-8", "surrogateescape"))
    return html_path, md_path
