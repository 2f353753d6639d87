"""Findings (dlscope.findings) into words: each section module keeps a WORDS table, one function
per finding key from its values to a sentence; this is the one place a key meets its table."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from dlscope.findings import Finding
from dlscope.report.blocks import Findings

Words = Mapping[str, Callable[[Mapping[str, Any]], str]]


def worded(found: Iterable[Finding | Mapping[str, Any]], words: Words) -> Findings:
    """A Findings block: each finding (a Finding, or its JSON from results.json) worded by its key."""
    items = []
    for item in found:
        finding = item if isinstance(item, Finding) else Finding.from_json(dict(item))
        if finding.key not in words:
            raise KeyError(f"no wording for finding {finding.key!r}")
        items.append((finding.level, words[finding.key](finding.values)))
    return Findings(items)
