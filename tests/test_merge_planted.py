"""`dlscope merge` on a planted job: ranks' records written by dlscope's own writers as the ranks of
a job on 3 machines write them (benchmarks/many_ranks.py's writer, smaller), each host's clock off
by a known amount and one rank launching every collective a known time late. What merge recovers
is checked against what was planted: from the ranks' collectives files, and from their profiler
traces where they have none (reduced one trace at a time)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from dlscope.cli import main

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import many_ranks  # the benchmark's writer of a planted job (after its directory is on the path)

RANKS, PER_HOST, STEPS, LATE_S = 6, 2, 60, 0.015


@pytest.fixture(scope="module", params=[False, True], ids=["collectives-files", "profiler-traces"])
def planted(request, tmp_path_factory) -> tuple[dict, list[float], int]:
    root = tmp_path_factory.mktemp("planted")
    hosts, offsets, straggler = many_ranks.write_job(root, RANKS, PER_HOST, STEPS, LATE_S, seed=3, traced=request.param)
    assert main(["merge", *map(str, hosts), "--out", str(root / "merged")]) == 0
    return json.loads((root / "merged" / "results.json").read_text())["sections"]["merge"], offsets, straggler


def test_each_hosts_planted_clock_offset_is_recovered_within_a_millisecond(planted):
    section, offsets, _ = planted
    assert len(offsets) == 3 and max(abs(o) for o in offsets) > 0.005  # offsets there are to find
    recovered = {host: o["ms"] for host, o in section["offsets"].items()}
    assert sorted(recovered) == ["host0", "host1", "host2"] and section["reference_host"] == "host0"
    for host, offset in enumerate(offsets):
        assert abs(recovered[f"host{host}"] - 1e3 * offset) < 1.0, (recovered, offsets)


def test_the_planted_straggler_is_found_with_its_cost(planted):
    section, _, straggler = planted
    found = section["collectives"]["straggler"]
    assert found["rank"] == straggler and found["host"] == f"host{straggler // PER_HOST}"
    assert abs(found["cost_ms"] - 1e3 * LATE_S) < 1.0 and found["last"] == found["of"] == 2 * STEPS
    assert found["others"] == RANKS - 1


def test_every_ranks_steps_are_in_the_dataset(planted):
    section, _, _ = planted
    assert [r["rank"] for r in section["ranks"]] == list(range(RANKS))
    assert all(r["steps"] == STEPS for r in section["ranks"]) and section["missing_ranks"] == []
