"""The line sweep under the overlap analysis, against a brute force on an integer grid."""

from hypothesis import given, settings
from hypothesis import strategies as st

from dlscope.analysis.intervals import intersect, length, merge, subtract

spans = st.lists(st.tuples(st.integers(0, 60), st.integers(0, 60)), max_size=12)


def cells(intervals) -> set[int]:
    """Unit cells [t, t+1) covered: a set-based model of an interval set on integer endpoints."""
    return {t for start, end in intervals for t in range(start, end)}


@given(spans)
@settings(deadline=None)  # no wall-clock limit on an example: a loaded machine is no failure
def test_merge_is_disjoint_sorted_and_covers_the_same_cells(a):
    merged = merge(a)
    assert all(s < e for s, e in merged)
    assert all(merged[i][1] < merged[i + 1][0] for i in range(len(merged) - 1))
    assert cells(merged) == cells(a)


@given(spans, spans)
@settings(deadline=None)
def test_intersect_and_subtract_match_set_operations(a, b):
    ma, mb = merge(a), merge(b)
    assert cells(intersect(ma, mb)) == cells(a) & cells(b)
    assert cells(subtract(ma, mb)) == cells(a) - cells(b)
    assert length(intersect(ma, mb)) + length(subtract(ma, mb)) == length(ma)
