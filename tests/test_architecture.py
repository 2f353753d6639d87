"""The layering rules, read from the source: no import cycle between modules nor between rooms (no
arrow back up the floors), a thin cli/, the process boundary (what runs inside the user's job, what
runs afterwards, what they exchange), names said once, one module for each layout.

Imports are read with `ast`, at module level and inside functions alike (a function-level import
hides a cycle from Python's import machinery, not from the design), and `if TYPE_CHECKING:` ones
too: a module that names another's types for its annotations depends on it.
"""

from __future__ import annotations

import ast
import re
import sys
from collections import defaultdict
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
    return " → ".join(cycle)


def room(module: str) -> str:
    """A module's room: its top-level package (dlscope.injob.hooks → injob), or itself at the top."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def room_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    rooms: dict[str, set[str]] = defaultdict(set)
    for name, targets in graph.items():
        rooms[room(name)] |= {room(t) for t in targets if room(t) != room(name)}
    return rooms


# The process boundary (docs/architecture.md): the rooms whose code runs in one process only.
IN_THE_JOB = "injob"  # inside the user's process: stdlib and torch, fork-safe, every line costs the job
JOB_MAY_IMPORT = {"injob", "contract", "measure", "phases"}
CONTRACT = "contract"  # what both sides exchange: stdlib only
CONTRACT_MAY_IMPORT = {"contract", "phases"}  # phases: the marker format, itself stdlib only
AFTERWARDS = "analysis"  # dlscope's process, after the job: numpy, never torch
NEVER_THE_JOB = {"analysis", "supervise", "contract"}  # dlscope's side talks to the job through the contract
# the top floors, highest first: each imported only from above it
TOP_FLOORS = ("cli", "runner", "stages")
# a command's flags, its stage and its section mirror each other by name; observe/ holds only the
# re-exports that keep earlier import paths working
MIRRORS = ("cli", "stages", "report.sections", "observe")


def module_imports(path: Path) -> list[str]:
    """Every module name an import statement in `path` names (absolute imports; dlscope's are
    relative-free by style)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.append(node.module)
    return found


def strings_outside_docstrings(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), str(path))
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
        and ast.get_docstring(node, clean=False) is not None
    }
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
    ]


def test_no_import_cycle():
    found = cycles(import_graph())
    assert not found, "import cycles:\n" + "\n".join(describe(c) for c in found)


def test_no_arrow_back_up_the_floors():
    """Between rooms, imports go one way: a room that imports another is never imported by it,
    directly or round a loop (the data pipeline importing the trainer that imports the data, a rank's
    worker importing the stage that launches it, a measure importing an observer)."""
    found = cycles(room_graph(import_graph()))
    assert not found, "rooms importing each other (an arrow back up):\n" + "\n".join(describe(c) for c in found)


def test_the_top_floors_are_imported_only_from_above():
    rooms = room_graph(import_graph())
    for level, floor in enumerate(TOP_FLOORS):
        above = {*TOP_FLOORS[:level], floor}
        importers = sorted(r for r, targets in rooms.items() if floor in targets and r not in above)
        assert not importers, f"{floor} is imported from below it by {importers}"


def test_the_job_imports_only_the_contract_measure_and_phases():
    wrong = {
        name: sorted(t for t in targets if room(t) not in JOB_MAY_IMPORT)
        for name, targets in import_graph().items()
        if room(name) == IN_THE_JOB
    }
    wrong = {name: targets for name, targets in wrong.items() if targets}
    assert not wrong, "code that runs inside the user's process imports dlscope beyond the contract:\n" + "\n".join(
        f"{name}: {', '.join(targets)}" for name, targets in sorted(wrong.items())
    )
    third_party = sorted(
        f"{path.relative_to(SRC)}: {name}"
        for path in (PACKAGE / IN_THE_JOB).rglob("*.py")
        for name in module_imports(path)
        if name.split(".")[0] not in sys.stdlib_module_names and name.split(".")[0] not in ("torch", "dlscope")
    )
    assert not third_party, f"the job's code imports beyond the stdlib and torch: {third_party}"


def test_dlscopes_side_never_imports_the_job_and_the_contract_is_stdlib_only():
    graph = import_graph()
    crossing = sorted(
        f"{name} → {t}"
        for name, targets in graph.items()
        if room(name) in NEVER_THE_JOB
        for t in targets
        if room(t) == IN_THE_JOB
    )
    assert not crossing, f"dlscope's side imports the job's code (use dlscope.contract): {crossing}"
    contract = sorted(
        f"{name} → {t}"
        for name, targets in graph.items()
        if room(name) == CONTRACT
        for t in targets
        if room(t) not in CONTRACT_MAY_IMPORT
    )
    outside = sorted(
        f"{path.relative_to(SRC)}: {name}"
        for path in (PACKAGE / CONTRACT).rglob("*.py")
        for name in module_imports(path)
        if name.split(".")[0] not in sys.stdlib_module_names and name.split(".")[0] != "dlscope"
    )
    assert not contract and not outside, f"the contract imports beyond the stdlib: {contract + outside}"


def test_analysis_never_imports_torch():
    found = sorted(
        f"{path.relative_to(SRC)}: {name}"
        for path in (PACKAGE / AFTERWARDS).rglob("*.py")
        for name in module_imports(path)
        if name.split(".")[0] == "torch"
    )
    assert not found, f"analysis imports torch (it runs in dlscope's process, afterwards): {found}"


def test_environment_names_and_run_directory_names_are_spelled_once():
    """Every DLSCOPE_* name in dlscope.contract.env (rundir.py's own lock hand-over there); the run
    directory's names in rundir.py; the
    files under processes/ in dlscope.contract.records (docstrings and comments may name them).
    The bootstrap spells the one name it needs before dlscope can be imported."""
    patterns = {
        "an environment variable": (r"DLSCOPE_[A-Z_]+", ("contract/env.py", "rundir.py")),
        "results.json": (r"^results\.json$", ("rundir.py",)),
        "a record file's name": (
            r"^\.(steps|jsonl|batches)$|^\*\.(steps|jsonl|batches)$|^(stacks|live|profile|profile-request)-",
            ("contract/",),
        ),
    }
    allowed = {("injob/bootstrap/sitecustomize.py", "DLSCOPE_SRC")}
    wrong = []
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE).as_posix()
        for line, text in strings_outside_docstrings(path):
            for what, (pattern, homes) in patterns.items():
                for match in re.finditer(pattern, text):
                    if not rel.startswith(homes) and (rel, match.group(0)) not in allowed:
                        wrong.append(f"{rel}:{line}: {what} ({text[:50]!r})")
    assert not wrong, "spelled outside its one home:\n" + "\n".join(sorted(wrong))
    # the folder of the processes' records, joined as a path anywhere but rundir.py
    joined = [
        f"{path.relative_to(PACKAGE)}:{node.lineno}"
        for path in PACKAGE.rglob("*.py")
        if path != LAYOUT_MODULE
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.BinOp)
        and isinstance(node.op, ast.Div)
        and isinstance(node.right, ast.Constant)
        and node.right.value in ("processes", "ranks", "results.json")
    ]
    assert not joined, f"the run directory's folders joined outside rundir.py: {joined}"


def test_names_are_said_once():
    """No two modules share a name (a command's cli/, stages/ and report/sections/ modules mirror
    each other by design), and the runner's stages do not borrow "step", a training step's word."""
    by_name: dict[str, list[str]] = defaultdict(list)
    for name in modules():
        if not name.removeprefix("dlscope.").startswith(MIRRORS):
            by_name[name.rpartition(".")[2]].append(name)
    shared = {leaf: names for leaf, names in by_name.items() if len(names) > 1 and leaf != "__main__"}
    assert not shared, f"modules that share a name: {shared}"
    stages = [name for name in modules() if name.startswith("dlscope.stages.") and "step" in name.rpartition(".")[2]]
    assert not stages, f"stage modules named after training steps: {stages}"


def test_no_two_modules_a_letter_apart_across_the_process_boundary():
    def apart_by_one(a: str, b: str) -> bool:
        if abs(len(a) - len(b)) > 1 or a == b:
            return False
        if len(a) == len(b):
            return sum(x != y for x, y in zip(a, b, strict=True)) == 1
        short, long = sorted((a, b), key=len)
        return any(long[:k] + long[k + 1 :] == short for k in range(len(long)))

    leaves = lambda rooms: {n.rpartition(".")[2] for n in modules() if room(n) in rooms}  # noqa: E731
    pairs = sorted(
        (a, b) for a in leaves({IN_THE_JOB}) for b in leaves({"supervise", "analysis", "stages"}) if apart_by_one(a, b)
    )
    assert not pairs, f"modules a letter apart on the two sides of the job's boundary: {pairs}"


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


def test_the_boundary_rules_catch_a_crossing():
    # each rule above reads the same graph; here, that a crossing of each kind is found in one
    graph = {"dlscope.injob.hooks": {"dlscope.analysis.steptable"}, "dlscope.analysis.steptable": set()}
    crossing = [n for n, ts in graph.items() if room(n) == IN_THE_JOB for t in ts if room(t) not in JOB_MAY_IMPORT]
    assert crossing == ["dlscope.injob.hooks"]
    rooms = room_graph(
        {"dlscope.data.a": {"dlscope.train"}, "dlscope.train": {"dlscope.data.b"}, "dlscope.data.b": set()}
    )
    assert cycles(rooms) == [["data", "train", "data"]]
    assert room("dlscope.injob.bootstrap.sitecustomize") == "injob" and room("dlscope.runner") == "runner"


def test_the_cycle_finder_finds_a_cycle(tmp_path):
    # the walker itself: a cycle through three modules, and a function-level relative import, are found
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    source = tmp_path / "x.py"
    source.write_text("def f():\n    from .train import Trainer\n")
    known = {"dlscope.x": source, "dlscope.train": source}
    assert imports("dlscope.x", source, known) == {"dlscope.train"}


def test_no_room_holds_more_than_a_fifth_of_the_house():
    lines = {name: len(path.read_text().splitlines()) for name, path in modules().items()}
    per_room: dict[str, int] = defaultdict(int)
    for name, count in lines.items():
        per_room[room(name)] += count
    total = sum(lines.values())
    biggest = max(per_room, key=per_room.__getitem__)
    assert per_room[biggest] <= 0.2 * total, f"{biggest}/ holds {per_room[biggest]} of {total} lines: split it"
