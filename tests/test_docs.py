"""The docs site builds offline with warnings as errors, covers every command and flag, shows only generated output."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from dlscope.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
EXAMPLES = DOCS / "examples"
SNIPPET = re.compile(r'^--8<-- "([^"]+)"$', re.M)
HEADER = "# made by scripts/make-docs-examples"

sys.path.insert(0, str(ROOT / "scripts"))
import docs_examples  # noqa: E402 — the generator, so the tests know which examples it makes


def commands() -> dict[tuple[str, ...], argparse.ArgumentParser]:
    """Every command and subcommand of the CLI, by its words: ("ckpt", "scan") -> its parser."""
    found: dict[tuple[str, ...], argparse.ArgumentParser] = {}

    def walk(parser: argparse.ArgumentParser, words: tuple[str, ...]) -> None:
        found[words] = parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, (*words, name))

    walk(build_parser(), ())
    return found


def page_text(path: Path) -> str:
    """A page's markdown with its included example files expanded, as the reader sees it."""
    text = path.read_text()
    return SNIPPET.sub(lambda m: (EXAMPLES / m.group(1)).read_text(), text)


def test_docs_build_strict_and_offline(tmp_path):
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "WARNING" not in proc.stderr, proc.stderr[-3000:]
    site = tmp_path / "site"
    api = (site / "python-api.html").read_text()
    assert "doc-heading" in api and "Trainer" in api and "verify_checkpoint" in api  # mkdocstrings rendered
    architecture = (site / "architecture.html").read_text()
    assert "dlscope.runner" in architecture  # the generated module table
    assert "<svg" in architecture or "graphviz `dot` is not installed" in architecture
    # nothing is fetched by the pages: no web fonts, no CDN scripts
    for page in site.rglob("*.html"):
        assert "fonts.googleapis" not in page.read_text(), page


def test_every_command_has_a_page_in_the_nav():
    nav = (ROOT / "mkdocs.yml").read_text()
    for words in commands():
        if len(words) == 1:
            page = DOCS / "commands" / f"{words[0]}.md"
            assert page.is_file(), f"no page for `dlscope {words[0]}`"
            assert f"commands/{words[0]}.md" in nav, f"{page} is not in mkdocs.yml's nav"


def test_every_flag_is_on_its_commands_page():
    for words, parser in commands().items():
        if not words:
            continue
        text = page_text(DOCS / "commands" / f"{words[0]}.md")
        flags = [s for a in parser._actions for s in a.option_strings if s.startswith("--") and s != "--help"]
        missing = [f for f in flags if not re.search(re.escape(f) + r"(?![\w-])", text)]
        assert not missing, f"`dlscope {' '.join(words)}`: {missing} not on its page (scripts/make-docs-examples help-)"


def test_every_included_example_exists_and_came_from_the_generator():
    made = {e.name for e in [*docs_examples.help_examples(), *docs_examples.EXAMPLES_TO_MAKE]}
    made |= {f"{e.name}-{view}" for e in docs_examples.EXAMPLES_TO_MAKE for view in e.views}
    included = {m for page in DOCS.rglob("*.md") for m in SNIPPET.findall(page.read_text())}
    assert included
    for name in sorted(included):
        path = EXAMPLES / name
        assert path.is_file(), f"{name} is included but missing: run scripts/make-docs-examples"
        first, second = path.read_text().splitlines()[:2]
        assert first.startswith(HEADER), f"{name} was not written by scripts/make-docs-examples"
        assert second.startswith("$ "), f"{name} does not start with the command that made it"
        assert path.stem in made, f"{name}: the generator has no example of that name"


def test_generated_examples_are_80_columns():
    # a command line is as long as the command; an error is one line whatever its length (grep-able)
    unwrapped = re.compile(r"^(\$ |dlscope[\w ]*: error: )")
    for path in EXAMPLES.glob("*.txt"):
        for number, line in enumerate(path.read_text().splitlines()[1:], 2):
            if not unwrapped.match(line):
                assert len(line) <= 80, f"{path.name}:{number} is {len(line)} columns"


@pytest.mark.slow
def test_python_api_example_runs(tmp_path):
    text = (DOCS / "python-api.md").read_text()
    match = re.search(r"```python\n(.*?)```", text, re.S)
    assert match, "the Python API page has no python block"
    # every call of the example as written, on a sixth of its samples: the calls, not the accuracy, are tested
    code, subsets = re.subn(r"train_subset=[\d_]+", "train_subset=2_000", match.group(1))
    assert subsets == 1, "the example's train_subset= moved: shrink it here again"
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "test accuracy" in proc.stdout and "aten::" in proc.stdout and "verified: True" in proc.stdout
    assert list((tmp_path / "runs" / "notebook" / "tensorboard" / "train").glob("events.out.tfevents.*"))
    assert (tmp_path / "runs" / "notebook" / "cnn.pt").is_file()


def test_the_architecture_and_run_directory_pages_match_the_code():
    """docs/architecture.md describes every room of src/dlscope (a package, or a module at the
    top); docs/run-directory.md gives the schema version the code writes."""
    from dlscope.rundir import SCHEMA_VERSION

    package = ROOT / "src" / "dlscope"
    rooms = {p.name + "/" for p in package.iterdir() if (p / "__init__.py").exists()}
    rooms |= {p.name for p in package.glob("*.py") if p.name != "__init__.py"}
    architecture = (DOCS / "architecture.md").read_text()
    missing = sorted(room for room in rooms if f"`{room}`" not in architecture)
    assert not missing, f"rooms docs/architecture.md does not describe: {missing}"
    versions = re.findall(r"schema_version (\d+)", (DOCS / "run-directory.md").read_text())
    assert versions and all(int(v) == SCHEMA_VERSION for v in versions), (versions, SCHEMA_VERSION)
