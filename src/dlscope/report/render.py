"""results.json → report.html (self-contained: inline CSS, figures as data URIs) and report.md."""

from __future__ import annotations

import base64
import html
import json
from pathlib import Path
from typing import Any

from jinja2 import Environment, PackageLoader, select_autoescape

from dlscope.fsutil import atomic_write_bytes
from dlscope.report.blocks import Block, Code, Figure, Findings, Para, Section, Svg, Table, fmt
from dlscope.rundir import SCHEMA_VERSION, load_results

FINDING_MARK = {"good": "✔", "info": "•", "warn": "⚠", "bad": "✘"}


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def block_html(block: Block) -> str:
    if isinstance(block, Para):
        return f"<p>{html.escape(block.text)}</p>"
    if isinstance(block, Table):
        head = "".join(f"<th>{html.escape(c)}</th>" for c in block.columns)
        body = "".join(
            "<tr>"
            + "".join(
                f'<td class="num">{html.escape(fmt(v))}</td>' if _is_number(v) else f"<td>{html.escape(fmt(v))}</td>"
                for v in row
            )
            + "</tr>"
            for row in block.rows
        )
        caption = f"<caption>{html.escape(block.caption)}</caption>" if block.caption else ""
        return f"<table>{caption}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
    if isinstance(block, Figure):
        data = base64.b64encode(block.png).decode()
        caption = f"<figcaption>{html.escape(block.caption)}</figcaption>" if block.caption else ""
        alt = html.escape(block.caption or block.name)
        return f'<figure><img alt="{alt}" src="data:image/png;base64,{data}">{caption}</figure>'
    if isinstance(block, Svg):
        caption = f"<figcaption>{html.escape(block.caption)}</figcaption>" if block.caption else ""
        return f'<figure class="svg">{inline_svg(block.svg)}{caption}</figure>'
    if isinstance(block, Code):
        return f"<pre><code>{html.escape(block.text)}</code></pre>"
    if isinstance(block, Findings):
        items = "".join(
            f'<li class="{level}">{FINDING_MARK.get(level, "•")} {html.escape(text)}</li>'
            for level, text in block.items
        )
        return f'<ul class="findings">{items}</ul>'
    raise TypeError(f"unknown block {block!r}")


def inline_svg(svg: str) -> str:
    """An SVG document as an inline element: drop the XML declaration and DOCTYPE, keep <svg…>."""
    start = svg.find("<svg")
    if start < 0:
        raise ValueError("not an SVG document")
    return svg[start:]


def _md_cell(value: Any) -> str:
    return fmt(value).replace("|", "\\|").replace("\n", " ")


def block_md(block: Block, figures_dir: Path, run_dir: Path) -> str:
    if isinstance(block, Para):
        return block.text
    if isinstance(block, Table):
        lines = [f"*{block.caption}*", ""] if block.caption else []
        lines.append("| " + " | ".join(block.columns) + " |")
        lines.append(
            "|"
            + "|".join(
                "---:" if block.rows and _is_number(v) else "---"
                for v in (block.rows[0] if block.rows else block.columns)
            )
            + "|"
        )
        lines += ["| " + " | ".join(_md_cell(v) for v in row) + " |" for row in block.rows]
        return "\n".join(lines)
    figures_dir.mkdir(parents=True, exist_ok=True)
    if isinstance(block, Figure):
        path = figures_dir / f"{block.name}.png"
        atomic_write_bytes(path, block.png)
        return f"![{block.caption or block.name}]({path.relative_to(run_dir)})"
    if isinstance(block, Svg):
        path = figures_dir / f"{block.name}.svg"
        atomic_write_bytes(path, block.svg.encode("utf-8", "surrogateescape"))
        return f"![{block.caption or block.name}]({path.relative_to(run_dir)})"
    if isinstance(block, Code):
        return f"```{block.language}\n{block.text}\n```"
    if isinstance(block, Findings):
        return "\n".join(f"- {FINDING_MARK.get(level, '•')} {text}" for level, text in block.items)
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


def render_report(run: str | Path) -> tuple[Path, Path]:
    """Write report.html and report.md into the run directory from its results.json."""
    run = Path(run)
    run_dir = run if run.is_dir() else run.parent
    results = load_results(run_dir)
    sections = build_sections(results)
    env = Environment(loader=PackageLoader("dlscope.report"), autoescape=select_autoescape())
    page = env.get_template("report.html.j2").render(
        run={"wall_seconds": None, **results["run"]},
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
    md += [f"- [{s.title}](#{s.key})" for s in sections]
    for s in sections:
        md += ["", f'<a id="{s.key}"></a>', f"## {s.title}", ""]
        md += [block_md(b, figures, run_dir) + "\n" for b in s.blocks]
    md_path = atomic_write_bytes(run_dir / "report.md", "\n".join(md).encode("utf-8", "surrogateescape"))
    return html_path, md_path
