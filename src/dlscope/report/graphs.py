"""Graphs (nodes, edges) as SVG at report time: graphviz `dot` when installed, else a small
layered drawing in pure Python (longest-path layers, straight edges) so a report always has one.

A graph is the JSON-able dict dlscope.instruments.graph produces:
{"nodes": [{"id", "label", "kind"}], "edges": [[src, dst, style?]]}.
"""

from __future__ import annotations

import html
import shutil
import subprocess

# fill colours by node kind; the legend in the report repeats these words
KIND_COLOURS = {
    "input": "#dbe8ff",
    "param": "#e8e8e8",
    "op": "#ffffff",
    "module": "#fff4cc",
    "backward": "#ffe1d6",
    "accumulate": "#d9f2d9",
    "saved": "#fbd8a0",
    "output": "#e6d9ff",
}


def have_dot() -> bool:
    return shutil.which("dot") is not None


def to_dot(graph: dict, rankdir: str = "TB") -> str:
    """Graphviz source for `graph`."""
    lines = [
        "digraph G {",
        f'  rankdir={rankdir}; nodesep=0.25; ranksep=0.3; bgcolor="transparent";',
        '  node [shape=box, style="rounded,filled", fontname="Helvetica", fontsize=10, margin="0.08,0.03"];',
        '  edge [color="#555555", arrowsize=0.6];',
    ]
    for node in graph["nodes"]:
        label = node["label"].replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
        colour = KIND_COLOURS.get(node["kind"], "#ffffff")
        lines.append(f'  "{node["id"]}" [label="{label}", fillcolor="{colour}"];')
    for edge in graph["edges"]:
        style = ' [style=dashed, color="#c07000"]' if len(edge) > 2 and edge[2] == "saved" else ""
        lines.append(f'  "{edge[0]}" -> "{edge[1]}"{style};')
    lines.append("}")
    return "\n".join(lines)


def run_dot(source: str) -> str | None:
    """SVG from graphviz `dot`, or None when it is not installed, fails or hangs: every caller has
    a fallback drawing, so a report never depends on graphviz. The one place dot is run."""
    if not have_dot():
        return None
    try:
        # surrogateescape: a traced path's undecodable bytes go through as the bytes they were
        done = subprocess.run(
            ["dot", "-Tsvg"], input=source, capture_output=True, text=True, errors="surrogateescape", timeout=30
        )
        done.check_returncode()
        return done.stdout
    except (OSError, subprocess.SubprocessError):
        return None


def layers_of(graph: dict) -> dict[str, int]:
    """Each node's layer: the longest path to it from a node without inputs (the graph is a DAG)."""
    inputs: dict[str, list[str]] = {n["id"]: [] for n in graph["nodes"]}
    for edge in graph["edges"]:
        inputs[edge[1]].append(edge[0])
    layer: dict[str, int] = {}

    def depth(node: str) -> int:
        if node not in layer:
            layer[node] = 0  # guards against a cycle in malformed input
            layer[node] = 1 + max((depth(i) for i in inputs[node]), default=-1)
        return layer[node]

    for node in inputs:
        depth(node)
    # a source (a saved tensor, a parameter) sits just above its first consumer, not all in row 0
    consumers: dict[str, list[str]] = {}
    for edge in graph["edges"]:
        consumers.setdefault(edge[0], []).append(edge[1])
    for node, feeds in consumers.items():
        if not inputs[node]:
            layer[node] = min(layer[d] for d in feeds) - 1
    return layer


def python_svg(graph: dict) -> str:
    """A layered drawing without graphviz: one row per layer, boxes sized to their labels."""
    char_w, line_h, pad, gap_x, gap_y = 6.2, 13, 6, 14, 34
    layer = layers_of(graph)
    rows: dict[int, list[dict]] = {}
    for node in graph["nodes"]:
        rows.setdefault(layer[node["id"]], []).append(node)
    boxes: dict[str, tuple[float, float, float, float]] = {}
    y, width = 10.0, 0.0
    for depth in sorted(rows):
        x = 10.0
        row_h = 0.0
        for node in rows[depth]:
            text = node["label"].split("\n")
            w = max(len(t) for t in text) * char_w + 2 * pad
            h = len(text) * line_h + 2 * pad
            boxes[node["id"]] = (x, y, w, h)
            x += w + gap_x
            row_h = max(row_h, h)
        width = max(width, x)
        y += row_h + gap_y
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{y:.0f}" '
        f'font-family="Helvetica, Arial, sans-serif" font-size="10">',
        '<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="6" markerHeight="6" '
        'orient="auto-start-reverse"><path d="M 0 0 L 10 5 L 0 10 z" fill="#555"/></marker></defs>',
    ]
    for edge in graph["edges"]:
        x0, y0, w0, h0 = boxes[edge[0]]
        x1, y1, w1, _ = boxes[edge[1]]
        dash = ' stroke-dasharray="4 3" stroke="#c07000"' if len(edge) > 2 and edge[2] == "saved" else ' stroke="#555"'
        parts.append(
            f'<line x1="{x0 + w0 / 2:.1f}" y1="{y0 + h0:.1f}" x2="{x1 + w1 / 2:.1f}" y2="{y1:.1f}"{dash} '
            'marker-end="url(#arrow)"/>'
        )
    for node in graph["nodes"]:
        x, y0, w, h = boxes[node["id"]]
        colour = KIND_COLOURS.get(node["kind"], "#ffffff")
        parts.append(
            f'<rect x="{x:.1f}" y="{y0:.1f}" width="{w:.1f}" height="{h:.1f}" rx="4" fill="{colour}" stroke="#333"/>'
        )
        for i, line in enumerate(node["label"].split("\n")):
            baseline = y0 + pad + (i + 1) * line_h - 3
            parts.append(f'<text x="{x + pad:.1f}" y="{baseline:.1f}">{html.escape(line)}</text>')
    parts.append("</svg>")
    return "\n".join(parts)


def graph_svg(graph: dict, rankdir: str = "TB") -> tuple[str, str]:
    """(SVG document, which renderer drew it)."""
    svg = run_dot(to_dot(graph, rankdir))
    if svg is not None:
        return svg, "graphviz dot"
    return python_svg(graph), "dlscope's layered fallback (graphviz not installed or failing)"
