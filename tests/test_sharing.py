"""Processes that train at once (analysis/sharing.py): which steps ran beside another
process's training and which alone, and each process's threads, its own or its parent's."""

from __future__ import annotations

import numpy as np

from dlscope.analysis.sharing import MIN_STEPS, sharing

STEP = np.dtype([("start", "<f8"), ("seconds", "<f4")])


def steps(start: float, n: int, seconds: float) -> np.ndarray:
    table = np.zeros(n, STEP)
    table["start"] = start + np.arange(n) * seconds
    table["seconds"] = seconds
    return table


def test_steps_beside_another_process_and_alone_are_told_apart_and_compared():
    # the main process: 20 steps of 10 ms alone, then 20 of 40 ms while process 2 trains
    main = np.concatenate([steps(0.0, 20, 0.01), steps(0.2, 20, 0.04)])
    other = steps(0.2, 30, 0.03)
    threads = {1: {"threads": 2, "cores": 2}}  # process 2 (forked, set none) has its parent's
    found = sharing({1: main, 2: other, 3: steps(0.0, MIN_STEPS - 1, 0.5)}, 1, threads, {1: None, 2: 1, 3: 1})
    assert found["pids"] == [1, 2]  # process 3's few steps are no training beside it
    assert (found["alone_steps"], found["shared_steps"]) == (20, 20)
    assert (found["alone_ms"], found["shared_ms"]) == (10.0, 40.0)
    assert (found["threads"], found["threads_total"], found["cores"]) == ({"1": 2, "2": 2}, 4, 2)


def test_no_process_beside_it_and_unknown_threads():
    main = steps(0.0, 20, 0.01)
    assert sharing({1: main, 2: steps(5.0, 20, 0.01)}, 1, {}, {}) is None  # one after the other
    found = sharing({1: main, 2: steps(0.0, 20, 0.01)}, 1, {}, {})
    assert found["threads_total"] is None and found["cores"] is None
    assert found["alone_ms"] is None and found["shared_steps"] == 20  # no step alone: nothing compared
