"""Every command's --help: a description line, its defaults, a usage that names every option, at
most 80 columns, and two or three examples that the real parser accepts."""

from __future__ import annotations

import argparse
import re
import shlex

import pytest

from dlscope.cli import build_parser

SHELL = {"|", ">", ">>", "&&", ";"}


def commands(parser: argparse.ArgumentParser, words: tuple[str, ...] = ()):
    yield words, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from commands(sub, (*words, name))


ALL = list(commands(build_parser()))


def option_entries(help_text: str) -> list[str]:
    """The help of each option: from a line starting with `  -` up to the next such line."""
    entries: list[str] = []
    for line in help_text.splitlines():
        if re.match(r"^  -", line):
            entries.append(line)
        elif entries and line.startswith("   "):
            entries[-1] += " " + line.strip()
        elif not line.strip() and entries:
            entries.append("")
    return [e for e in entries if e]


@pytest.fixture(autouse=True)
def _eighty_columns(monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")


@pytest.mark.parametrize(("words", "parser"), ALL, ids=[" ".join(w) or "dlscope" for w, _ in ALL])
def test_help_describes_shows_defaults_and_ends_with_real_examples(words, parser):
    text = parser.format_help()
    assert parser.description, "a description line"
    assert all(len(line) <= 80 for line in text.splitlines()), [line for line in text.splitlines() if len(line) > 80]
    usage = parser.format_usage()
    for action in parser._actions:
        if action.option_strings and action.help is not argparse.SUPPRESS:
            assert any(o in usage for o in action.option_strings), f"usage omits {action.option_strings}"
        default = action.default
        if action.option_strings and default not in (None, False, True, argparse.SUPPRESS, "", []):
            entry = next(e for e in option_entries(text) if e.strip().startswith(tuple(action.option_strings)))
            assert "default" in entry, f"{action.option_strings}: the default is not shown in {entry!r}"
    assert text.rstrip().split("\n\n")[-1].startswith("examples:")
    examples = [line.strip() for line in text.split("examples:")[-1].splitlines() if line.strip().startswith("dlscope")]
    assert 2 <= len(examples) <= 3, examples
    for example in examples:
        argv = shlex.split(example, comments=True)
        argv = argv[: next((i for i, token in enumerate(argv) if token in SHELL), len(argv))]
        assert tuple(argv[1 : 1 + len(words)]) == words, f"{example!r} is not an example of {words}"
        if words:  # the parser accepts it as typed (a group's own examples name its subcommands)
            build_parser().parse_args(argv[1:])
