"""mkdocs hooks: the pages' generated parts, computed from src/dlscope at build time so they are never stale.

A page asks for one with a marker line:
  <!-- generated: modules -->       a table, one line per module: its name and its docstring's first line
  <!-- generated: import-graph -->  the import graph between dlscope's packages (graphviz `dot` → SVG)
  <!-- generated: api -->           mkdocstrings blocks for every name `import dlscope` exports
"""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
from collections import defaultdict
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "dlscope"


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, ast.Module]:
    return {module_name(p): ast.parse(p.read_text(), str(p)) for p in sorted(PACKAGE.rglob("*.py"))}


def imports_of(name: str, tree: ast.Module, is_package: bool, known: set[str]) -> set[str]:
    """The dlscope modules a module imports (at any depth of its code, lazy imports included);
    `from package import submodule` counts as importing the submodule."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("dlscope")}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".") if is_package else name.split(".")[:-1]
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            if base.startswith("dlscope"):
                found |= {f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names}
    return found


def layer(module: str) -> str:
    """A module's layer in the picture: dlscope.<first part> (a package, or a module at the top)."""
    parts = module.split(".")[1:]
    if not parts:
        return "dlscope"
    return parts[0]


def module_edges() -> set[tuple[str, str]]:
    trees = modules()
    edges: set[tuple[str, str]] = set()
    for name, tree in trees.items():
        is_package = (SRC / name.replace(".", "/") / "__init__.py").exists()
        targets = imports_of(name, tree, is_package, set(trees))
        edges |= {(name, target) for target in targets if target != name}
    return edges


def layer_edges(edges: set[tuple[str, str]]) -> dict[tuple[str, str], int]:
    counts: dict[tuple[str, str], int] = defaultdict(int)
    for a, b in edges:
        if layer(a) != layer(b) and "dlscope" not in (layer(a), layer(b)):
            counts[(layer(a), layer(b))] += 1
    return dict(counts)


def cyclic(edges: set[tuple[str, str]]) -> set[tuple[str, str]]:
    """The edges that lie on a cycle (both ends in one strongly connected component)."""
    graph: dict[str, set[str]] = defaultdict(set)
    for a, b in edges:
        graph[a].add(b)

    def reach(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for nxt in graph[todo.pop()]:
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen

    reachable = {node: reach(node) for node in list(graph)}
    return {(a, b) for a, b in edges if a in reachable.get(b, set())}


def dot_source() -> tuple[str, dict[tuple[str, str], int], set[tuple[str, str]]]:
    """The graphviz source of the layer graph, its edges (with import counts) and the red ones."""
    between_modules = module_edges()
    edges = layer_edges(between_modules)
    # an arrow is red when a module-level import cycle runs along it (not merely two layers importing each other)
    cycles = {(layer(a), layer(b)) for a, b in cyclic(between_modules) if layer(a) != layer(b)}
    lines = [
        "digraph imports {",
        '  rankdir=LR; node [shape=box, style="rounded", fontname="Helvetica", fontsize=11];',
        '  edge [color="#777777", arrowsize=0.6];',
    ]
    for (a, b), count in sorted(edges.items()):
        style = ' color="#c62828" penwidth=2' if (a, b) in cycles else ""
        lines.append(f'  "{a}" -> "{b}" [tooltip="{count} import(s)"{style}];')
    lines.append("}")
    return "\n".join(lines), edges, cycles


def import_graph() -> str:
    source, edges, cycles = dot_source()
    dot = shutil.which("dot")
    legend = (
        f"{len(edges)} edges between {len({n for e in edges for n in e})} layers, drawn from an `ast` walk of "
        f"src/dlscope at build time (every `import`, lazy ones included). "
        + (
            f"The {len(cycles)} arrows a module-level import cycle runs along are red (marked `(cycle)` if listed)."
            if cycles
            else "No import cycle."
        )
    )
    if dot is None:
        listing = "\n".join(f"    {a} -> {b}" + ("   (cycle)" if (a, b) in cycles else "") for a, b in sorted(edges))
        return (
            f"{legend}\n\ngraphviz `dot` is not installed here (`scripts/install-tracers` installs it), "
            f"so the graph is listed instead of drawn:\n\n{listing}\n"
        )
    svg = subprocess.run([dot, "-Tsvg"], input=source, capture_output=True, text=True, check=True).stdout
    svg = svg[svg.index("<svg") :]  # drop the XML prologue and doctype: the SVG sits inline in the page
    svg = re.sub(r'<svg width="[^"]*" height="[^"]*"', '<svg style="max-width: 100%; height: auto"', svg, count=1)
    return f'{legend}\n\n<div class="import-graph" markdown="0">\n{svg}\n</div>\n'


def module_table() -> str:
    rows = ["| module | what it is (its docstring's first line) |", "|---|---|"]
    for name, tree in modules().items():
        doc = ast.get_docstring(tree)
        first = doc.strip().splitlines()[0].replace("|", "\\|") if doc else "*(no docstring)*"
        rows.append(f"| `{name}` | {first} |")
    return "\n".join(rows) + "\n"


def api_blocks() -> str:
    """`::: module.name` for each name in dlscope's lazy export table, read from the code, not imported."""
    tree = ast.parse((PACKAGE / "__init__.py").read_text())
    table = next(
        node.value
        for node in tree.body
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "_API" for t in node.targets)
    )
    exports = ast.literal_eval(table)
    blocks = ["::: dlscope.phases.phase"]
    blocks += [f"::: {module}.{name}" for name, module in exports.items()]
    return "\n\n".join(blocks) + "\n"


GENERATORS = {"modules": module_table, "import-graph": import_graph, "api": api_blocks}


def on_page_markdown(markdown: str, page, config, files) -> str:
    for key, make in GENERATORS.items():
        marker = f"<!-- generated: {key} -->"
        if marker in markdown:
            markdown = markdown.replace(marker, make())
    return markdown
