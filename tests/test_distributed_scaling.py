"""scaling_table: samples/s of several runs against ideal scaling, and ranks against threads on the
same cores."""

import pytest

from dlscope.analysis.ranks import scaling_table
from dlscope.errors import DlscopeError
from dlscope.report.sections.scaling import WORDS
from dlscope.report.wording import worded


def test_speedup_and_efficiency_against_the_fewest_cores():
    table = scaling_table(
        [
            {"ranks": 2, "threads": 1, "samples_per_s": 1500.0, "exposed_comm_pct": 18.0, "step_ms": 42.5},
            {"ranks": 1, "threads": 1, "samples_per_s": 1000.0},
            {"ranks": 1, "threads": 2, "samples_per_s": 1800.0, "gemm_efficiency_pct": 95.0},
            {"ranks": 4, "threads": 1, "samples_per_s": 4000.0},
        ]
    )
    assert table["baseline"] == {"ranks": 1, "threads": 1}
    rows = {(r["ranks"], r["threads"]): r for r in table["rows"]}
    assert [(r["ranks"], r["threads"]) for r in table["rows"]] == [(1, 1), (1, 2), (2, 1), (4, 1)]
    assert (rows[(2, 1)]["speedup"], rows[(2, 1)]["ideal"], rows[(2, 1)]["efficiency_pct"]) == (1.5, 2.0, 75.0)
    assert rows[(4, 1)]["efficiency_pct"] == 100.0  # linear scaling
    # on 2 cores, one rank with two threads beat two ranks: the finding says so and cites the all-reduce share
    [finding] = table["findings"]
    values = finding["values"]
    assert (finding["key"], values["cores"]) == ("scaling.same_cores", 2)
    assert (values["fast.ranks"], values["fast.threads"], values["slow.ranks"], values["slow.threads"]) == (1, 2, 2, 1)
    assert (values["multi.exposed_comm_pct"], values["multi.step_ms"]) == (18.0, 42.5)
    assert (values["single.efficiency_pct"], values["single.gemm_efficiency_pct"]) == (90.0, 95.0)
    assert "1.20×" in worded([finding], WORDS).items[0][1]  # the speed-up, from the cited samples/s


def test_no_runs_is_an_error():
    with pytest.raises(DlscopeError):
        scaling_table([])
