"""Sets of time intervals as sorted, disjoint (start, end) lists: HTA's line sweep, in plain Python.

busy = merge([(0, 3), (2, 5)])       # [(0, 5)]
length(intersect(busy, [(4, 9)]))    # 1
"""

from __future__ import annotations

from collections.abc import Iterable

Intervals = list[tuple[float, float]]


def merge(spans: Iterable[tuple[float, float]]) -> Intervals:
    """The union of possibly overlapping spans, as disjoint sorted intervals (empty spans dropped)."""
    merged: Intervals = []
    for start, end in sorted(s for s in spans if s[1] > s[0]):
        if merged and start <= merged[-1][1]:
            if end > merged[-1][1]:
                merged[-1] = (merged[-1][0], end)
        else:
            merged.append((start, end))
    return merged


def intersect(a: Intervals, b: Intervals) -> Intervals:
    """Both merged inputs; one sweep over the two sorted lists."""
    out: Intervals = []
    i = j = 0
    while i < len(a) and j < len(b):
        start, end = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if start < end:
            out.append((start, end))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def subtract(a: Intervals, b: Intervals) -> Intervals:
    """The parts of merged `a` outside merged `b`."""
    out: Intervals = []
    j = 0
    for start, end in a:
        while j < len(b) and b[j][1] <= start:
            j += 1
        k, cursor = j, start
        while k < len(b) and b[k][0] < end:
            if b[k][0] > cursor:
                out.append((cursor, b[k][0]))
            cursor = max(cursor, b[k][1])
            k += 1
        if cursor < end:
            out.append((cursor, end))
    return out


def clip(a: Intervals, start: float, end: float) -> Intervals:
    return intersect(a, [(start, end)])


def length(a: Intervals) -> float:
    return sum(end - start for start, end in a)
