"""The layering rules, read from the source: no import cycle, a thin cli/, one module for each layout.

Imports are read with `ast`, at module level and inside functions alike (a function-level import
hides a cycle from Python's import machinery, not from the design), and `if TYPE_CHECKING:` ones
too: a module that names another's types for its annotations depends on it.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"
PACKAGE = SRC / "dlscope"

# cli/ parses flags into typed options and hands them to the runner. What it may import:
CLI_MAY_IMPORT = {
    "dlscope": "__version__",
    "dlscope.runner": "the one path every command takes",
    "dlscope.options": "the typed options the flags are parsed into (torch-free)",
    "dlscope.plan": "the plan a command hands the runner",
    "dlscope.config": "TrainConfig, the training steps' typed options, and the choices its flags offer",
    "dlscope.errors": "one-line errors for bad flags (exit code 2)",
    "dlscope.console": "printing the error line and --help",
}

RESTORE_MODULE = PACKAGE / "restore.py"  # the only place that tells a DCP state from a torch file's
LAYOUT_MODULE = PACKAGE / "rundir.py"  # the only place that spells a run directory's rank folders


def modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The dlscope modules `name` imports anywhere in its file (a name imported from a package
    counts as its submodule when it is one, else as the package)."""

    def module_of(dotted: str) -> str:
        while dotted and dotted not in known:
            dotted = dotted.rpartition(".")[0]
        return dotted

    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {module_of(alias.name) for alias in node.names if alias.name.startswith("dlscope")}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, *([node.module] if node.module else [])])
            if base == "dlscope" or base.startswith("dlscope."):
                found |= {module_of(f"{base}.{alias.name}") for alias in node.names}
    return found - {name, ""}


def import_graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(name, path, known) for name, path in known.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each as one cycle's path."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(one_cycle(graph, set(component)))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def one_cycle(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """A path through the component back to its start: what a reader follows to find the cycle."""
    start = min(component)
    path, seen = [start], {start}
    while True:
        nexts = sorted(graph[path[-1]] & component)
        if start in nexts and len(path) > 1:
            return [*path, start]
        step = next((n for n in nexts if n not in seen), start)
        if step in seen:
            return [*path[path.index(step) :], step]
        path.append(step)
        seen.add(step)


def describe(cycle: list[str]) -> str:
    where = " (inside observe/script: the run-steps engineer's)" if all(".observe.script" in m for m in cycle) else ""
    return " → ".join(cycle) + where


def test_no_import_cycle():
    found = cycles(import_graph())
    assert not found, "import cycles:\n" + "\n".join(describe(c) for c in found)


def test_cli_only_parses_flags_and_calls_the_runner():
    graph = import_graph()
    wrong = {
        name: sorted(m for m in targets if not m.startswith("dlscope.cli") and m not in CLI_MAY_IMPORT)
        for name, targets in graph.items()
        if name.startswith("dlscope.cli")
    }
    wrong = {name: targets for name, targets in wrong.items() if targets}
    assert not wrong, "cli/ imports beyond the runner, options, errors and console:\n" + "\n".join(
        f"{name}: {', '.join(targets)}" for name, targets in sorted(wrong.items())
    )


def sources_saying(pattern: str) -> list[str]:
    return sorted(
        f"{path.relative_to(SRC)}:{n}"
        for path in PACKAGE.rglob("*.py")
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(pattern, line)
    )


def test_one_module_tells_a_dcp_state_from_a_torch_file():
    assert sources_saying(r"""["']dcp["'] in state""") == [
        f"{RESTORE_MODULE.relative_to(SRC)}:{n}"
        for n, line in enumerate(RESTORE_MODULE.read_text().splitlines(), 1)
        if re.search(r"""["']dcp["'] in state""", line)
    ]


def test_one_module_spells_the_rank_folders():
    outside = [where for where in sources_saying(r"ranks/rank|[\"']rank\{") if not where.startswith("dlscope/rundir")]
    assert not outside, f"the rank folders are spelled outside {LAYOUT_MODULE.name}: {outside}"


def test_the_cycle_finder_finds_a_cycle(tmp_path):
    # the walker itself: a cycle through three modules, and a function-level relative import, are found
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    source = tmp_path / "x.py"
    source.write_text("def f():\n    from .train import Trainer\n")
    known = {"dlscope.x": source, "dlscope.train": source}
    assert imports("dlscope.x", source, known) == {"dlscope.train"}
