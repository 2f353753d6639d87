"""The README stays a front page: short, the two set-up commands, real examples, links that resolve."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


def test_readme_is_short():
    assert len(README.read_text().splitlines()) <= 300, "the README is a front page: details go to docs/"


def test_readme_gives_the_two_commands():
    text = README.read_text()
    block = text.split("## On a fresh machine", 1)[1].split("```", 2)[1]
    commands = [line.split("#")[0].strip() for line in block.splitlines()[1:] if line.strip()]
    assert commands == ["make lab", "make test"]
    ci = (ROOT / ".ci" / "run").read_text()
    assert "make test" in ci


def test_readme_examples_are_the_generated_files():
    text = README.read_text()
    blocks = re.findall(r"<!-- example: (\S+) -->\n```text\n(.*?)```\n<!-- end example -->", text, re.S)
    assert blocks, "the README shows no generated example"
    assert len(blocks) == text.count("<!-- example: "), "an empty README example: run scripts/make-docs-examples"
    for name, body in blocks:
        assert body == (ROOT / "docs" / "examples" / f"{name}.txt").read_text(), (
            f"README's {name} differs from docs/examples/{name}.txt: run scripts/make-docs-examples --views"
        )


def test_readme_links_resolve():
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README.read_text()):
        if not target.startswith("http"):
            assert (ROOT / target).exists(), f"README links to {target}, which does not exist"
