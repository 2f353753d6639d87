"""Findings (dlscope.findings) into words: each section module keeps a WORDS table, one function
per finding key from its values to a sentence; this is the one place a key meets its table."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from dlscope.findings import Finding
from dlscope.report.blocks import Findings

Words = Mapping[str, Callable[[Mapping[str, Any]], str]]


def sentence(item: Finding | Mapping[str, Any], words: Words) -> tuple[str, str]:
    """A finding (a Finding, or its JSON from results.json) as (level, its sentence)."""
    finding = item if isinstance(item, Finding) else Finding.from_json(dict(item))
    if finding.key not in words:
        raise KeyError(f"no wording for finding {finding.key!r}")
    return finding.level, words[finding.key](finding.values)


def worded(found: Iterable[Finding | Mapping[str, Any]], words: Words) -> Findings:
    """A Findings block: each finding worded by its key."""
    return Findings([sentence(item, words) for item in found])


def located(item: Finding | Mapping[str, Any], words: Words) -> tuple[str, str]:
    """(level, sentence) with the place the finding cites (its `where`: a file, a member, an offset) after it."""
    level, text = sentence(item, words)
    where = (item.values if isinstance(item, Finding) else item.get("values", {})).get("where")
    return level, f"{text} ({where})" if where else text
