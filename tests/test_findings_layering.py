"""Measuring code returns facts, report/ words them: no English sentence is built under stages/,
injob/, contract/, supervise/, analysis/, instruments/, experiments/, measure/, data/ or ckpt/
(issue 21). Read with `ast`, not run.

A sentence: a str constant or f-string with ≥ 4 plain words, making up at least half its tokens (so
code — a bpftrace program, a `python -c` line — is not one). Not counted: docstrings, exception
messages (raise, *Error(...)), warnings filters, and console messages while measuring (say, task, update, print):
they are shown once and never kept in results.json. Anything else can reach a result."""

from __future__ import annotations

import ast
import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "dlscope"
LAYERS = (
    "stages",
    "injob",
    "contract",
    "supervise",
    "analysis",
    "instruments",
    "experiments",
    "measure",
    "data",
    "ckpt",
)
# Sentences that are not findings, each with why.
EXEMPT = {
    # fragments of torch's own stderr lines, matched to drop them, never shown
    ("measure/native_stderr.py", "NATIVE_NOISE"),
    # torch's own warnings, matched to drop one (the profiler's) and to count the other (a sync)
    ("measure/native_stderr.py", "PROFILER_CYCLE_WARNING"),
    ("injob/gpuclock.py", "SYNC_MESSAGE"),
    # why a tracing backend cannot run here: an error message, raised as BackendUnavailable
    ("supervise/iotrace/ebpf.py", "available"),
    ("supervise/iotrace/strace.py", "available"),
    ("supervise/iotrace/proc.py", "available"),
    ("supervise/iotrace/tracer.py", "_last_error"),
    # what is wrong with a file or an option, raised as DatasetError / ConfigError by the caller
    ("data/idx.py", "size_mismatch"),
    ("experiments/pipeline/readers.py", "ReaderConfig"),
    # a line in the observed process's stacks file, for the person who opens it: a log line
    ("injob/hangagent.py", "_attach_failed"),
    # faulthandler's dump format ("Current thread 0x… (most recent call first):"), which
    # supervise/capture.py parses back into facts: a record's layout, not a sentence
    ("injob/hangagent.py", "_dump_stacks"),
    # the name of a place in a file (where a pickle lies, as "archive/data.pkl" is), not a finding
    ("ckpt/scan.py", "BEFORE_FIRST_MEMBER"),
}
UI_CALLS = {"say", "task", "update", "on_point", "on_row", "print", "warn"}
MATCHERS = {"filterwarnings"}  # their text is matched against a library's own messages
WORD = re.compile(r"^[(\"'“]?[A-Za-z][a-z]*[)\"'”,.:;!?]*$")


def is_sentence(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        text = node.value
    elif isinstance(node, ast.JoinedStr):
        text = " ".join(v.value for v in node.values if isinstance(v, ast.Constant) and isinstance(v.value, str))
    else:
        return False
    tokens = text.split()
    words = sum(bool(WORD.match(t)) for t in tokens)
    return words >= 4 and words >= len(tokens) / 2  # code (a bpftrace program, python -c) is mostly symbols


def _callee(call: ast.Call) -> str:
    f = call.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""


def _strings(node: ast.AST | None) -> list[ast.AST]:
    """Sentence nodes under `node`, not looking into exception messages or console messages."""
    found: list[ast.AST] = []
    stack = [node] if node is not None else []
    while stack:
        n = stack.pop()
        if isinstance(n, ast.Call) and (
            _callee(n).endswith(("Error", "Exception", "Unavailable")) or _callee(n) in UI_CALLS | MATCHERS
        ):
            continue
        if is_sentence(n):
            found.append(n)
            continue
        stack.extend(ast.iter_child_nodes(n))
    return found


def _owner(tree: ast.Module, node: ast.AST) -> str:
    """The top-level function, class or constant a node sits in."""
    for top in tree.body:
        if top.lineno <= node.lineno <= (top.end_lineno or top.lineno):
            if isinstance(top, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                return top.name
            if isinstance(top, (ast.Assign, ast.AnnAssign)):
                target = top.targets[0] if isinstance(top, ast.Assign) else top.target
                return target.id if isinstance(target, ast.Name) else ""
    return ""


def sentences(source: str) -> list[tuple[int, str]]:
    """(line, top-level owner) of every sentence outside docstrings, errors and console messages."""
    tree = ast.parse(source)
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
        and ast.get_docstring(node, clean=False) is not None
    }
    return sorted({(n.lineno, _owner(tree, n)) for n in _strings(tree) if id(n) not in docstrings})


def test_no_sentence_is_built_in_measuring_code():
    offenders, exempted = [], set()
    for layer in LAYERS:
        assert (SRC / layer).is_dir(), f"{layer}/ is gone: name the room its code moved to in LAYERS"
        for path in sorted((SRC / layer).rglob("*.py")):
            rel = path.relative_to(SRC).as_posix()
            for line, owner in sentences(path.read_text()):
                if (rel, owner) in EXEMPT:
                    exempted.add((rel, owner))
                else:
                    offenders.append(f"{rel}:{line} ({owner})")
    assert not offenders, "word these in report/sections, return the facts:\n" + "\n".join(offenders)
    assert exempted == EXEMPT, f"exemptions that match nothing any more: {EXEMPT - exempted}"


def test_the_rule_catches_a_finding_and_spares_errors_and_docstrings():
    caught = sentences(
        "def f(x):\n"
        '    """A docstring is not a finding at all."""\n'
        "    if x < 0:\n"
        '        raise ValueError(f"x is {x} but must not be negative here")\n'
        '    say(f"measuring the thing now, {x} of them")\n'
        '    return {"text": f"The step spends {x}% of its time waiting for data."}\n'
    )
    assert [line for line, _ in caught] == [6]
    assert sentences('def g(out):\n    out.append(["warn", "the model did not converge in time"])\n') == [(2, "g")]
    assert sentences('PROGRAM = "tracepoint:x { @a[tid] = 1; printf(\\"%d\\", tid); }"\n') == []
