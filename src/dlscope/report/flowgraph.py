"""The data-flow diagram, files → phases → files with edges weighted by bytes, as SVG:
graphviz `dot` when installed, else a small pure-Python three-column drawing."""

from __future__ import annotations

import html
import math
from typing import Any

from dlscope.report.graphs import run_dot

PHASE_COLOUR, FILE_COLOUR = "#dbe8f7", "#f4f1e8"


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def shorten(path: str, width: int = 48) -> str:
    """The path's end, `width` characters at most: its file name is what tells paths apart."""
    return path if len(path) <= width else "…" + path[-(width - 1) :]


def _weight(edge: dict[str, Any]) -> str:
    if edge.get("maps"):  # its reads are page faults: no byte count to show
        return f"mapped {edge['maps']:,}× (reads unseen)" + (
            f" + {human_bytes(edge['bytes'])}" if edge["bytes"] else ""
        )
    weight = human_bytes(edge["bytes"]) if edge["bytes"] else f"{edge['opens']} opens"
    return weight + (f" ({edge['files']:,} files)" if edge.get("files", 1) > 1 else "")


def to_dot(edges: list[dict[str, Any]], phases: list[str]) -> str:
    phase_set = set(phases)
    biggest = max((e["bytes"] for e in edges), default=0) or 1
    lines = [
        "digraph dataflow {",
        '  rankdir=LR; node [fontname="Helvetica", fontsize=10, shape=box, style="rounded,filled"];',
        '  edge [fontname="Helvetica", fontsize=9, color="#555555"];',
    ]
    nodes = {n for e in edges for n in (e["from"], e["to"])}
    for node in sorted(nodes):
        colour, shape = (PHASE_COLOUR, "ellipse") if node in phase_set else (FILE_COLOUR, "box")
        lines.append(f'  "{_escape(node)}" [label="{_escape(shorten(node))}", shape={shape}, fillcolor="{colour}"];')
    for e in edges:
        width = 1 + 4 * math.sqrt(e["bytes"] / biggest) if e["bytes"] else 1
        lines.append(f'  "{_escape(e["from"])}" -> "{_escape(e["to"])}" [label="{_weight(e)}", penwidth={width:.2f}];')
    lines.append("}")
    return "\n".join(lines)


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')


def fallback_svg(edges: list[dict[str, Any]], phases: list[str]) -> str:
    """Three columns — files read, phases, files written — and lines weighted by bytes."""
    phase_set = set(phases)
    sources = sorted({e["from"] for e in edges if e["to"] in phase_set})
    used_phases = [p for p in phases if any(p in (e["from"], e["to"]) for e in edges)]
    sinks = sorted({e["to"] for e in edges if e["from"] in phase_set})
    row, width, col = 26, 1100, (10, 420, 720)
    height = 40 + row * max(len(sources), len(used_phases), len(sinks), 1)
    y = {}
    for column, names in enumerate((sources, used_phases, sinks)):
        for i, name in enumerate(names):
            y[(column, name)] = 30 + i * row
    biggest = max((e["bytes"] for e in edges), default=0) or 1
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="Helvetica" '
        'font-size="11">'
    ]
    for e in edges:
        if e["to"] in phase_set:
            (x1, y1), (x2, y2) = (col[0] + 360, y[(0, e["from"])]), (col[1], y[(1, e["to"])])
        else:
            (x1, y1), (x2, y2) = (col[1] + 160, y[(1, e["from"])]), (col[2], y[(2, e["to"])])
        stroke = 1 + 5 * math.sqrt(e["bytes"] / biggest) if e["bytes"] else 1
        parts.append(
            f'<line x1="{x1}" y1="{y1}" x2="{x2}" y2="{y2}" stroke="#777" stroke-width="{stroke:.1f}">'
            f"<title>{html.escape(_weight(e))}</title></line>"
        )
    for column, names in enumerate((sources, used_phases, sinks)):
        box = 160 if column == 1 else 360
        colour = PHASE_COLOUR if column == 1 else FILE_COLOUR
        for name in names:
            top = y[(column, name)] - 10
            parts.append(
                f'<rect x="{col[column]}" y="{top}" width="{box}" height="20" rx="6" fill="{colour}" stroke="#999"/>'
                f'<text x="{col[column] + 6}" y="{top + 14}">{html.escape(shorten(name, 58 if column != 1 else 24))}'
                "</text>"
            )
    parts.append("</svg>")
    return "".join(parts)


def render_svg(edges: list[dict[str, Any]], phases: list[str]) -> tuple[str, str]:
    """(svg, engine): graphviz when `dot` runs, otherwise the built-in drawing."""
    svg = run_dot(to_dot(edges, phases))
    return (svg, "graphviz") if svg is not None else (fallback_svg(edges, phases), "built-in")


def hook_chart_dot(rows: list[dict[str, Any]]) -> str:
    """The seed's hook-point flow chart, from what the kernel offers: the traced process's
    syscalls → their tracepoints and kprobes (dashed red where this kernel lacks them) → an eBPF
    program → the perf buffer → the tracer in user space."""
    ok, missing = 'color="#2e7d32"', 'color="#c62828", style="dashed,rounded", fontcolor="#c62828"'
    lines = [
        "digraph hooks {",
        '  rankdir=LR; node [fontname="Helvetica", fontsize=10, shape=box, style=rounded];',
        '  edge [color="#777777"];',
        '  process [label="traced process\\n(user space)", shape=ellipse];',
        '  program [label="eBPF program\\n(dlscope/bpftrace)"]; buffer [label="perf buffer"];',
        '  tool [label="dlscope trace\\n(user space)", shape=ellipse];',
        "  program -> buffer -> tool;",
    ]
    for row in rows:
        call = row["syscall"]
        tp, kp = f"tp_{call}", f"kp_{call}"
        lines.append(f'  "{call}" [label="{call}()", shape=plaintext]; process -> "{call}";')
        lines.append(
            f'  {tp} [label="tracepoint\\nsys_enter/exit_{call}", {ok if row["tracepoint_available"] else missing}];'
        )
        lines.append(
            f'  {kp} [label="kprobe/kretprobe\\n__x64_sys_{call}", {ok if row["kprobe_available"] else missing}];'
        )
        lines.append(f'  "{call}" -> {tp} -> program; "{call}" -> {kp} -> program;')
    lines.append("}")
    return "\n".join(lines)
