"""A job started as distributed whose ranks never communicate (analysis/ranks.py, ranks_apart):
torchrun's ranks that each trained a model of their own are said to, first, as a warning, with what
the script's framework needs to make them data-parallel. Real torchrun jobs, checked against the
truth each rank prints; a DDP job says nothing of it (test_distributed_run.py, check_ranks in
test_run_ecosystem.py)."""

from __future__ import annotations

import sys

import pytest

from test_run_ecosystem import SCRIPTS, TORCHRUN, observe_ranks

SCRIPT = str(SCRIPTS / "ranks_apart.py")


def report_text(tmp_path) -> str:
    return " ".join((tmp_path / "run" / "report.md").read_text().split())


def first_finding(sections: dict) -> dict:
    return sections["run"]["findings"][0]


def test_ranks_that_never_join_a_process_group_are_called_out_first(tmp_path, capfd):
    sections, truths = observe_ranks(tmp_path, capfd, [*TORCHRUN, SCRIPT])
    assert sorted(t["rank"] for t in truths) == ["0", "1"] and {t["distributed"] for t in truths} == {"False"}
    found = first_finding(sections)
    assert (found["key"], found["level"]) == ("distributed.ranks_apart", "warn")
    steps = {t["rank"]: int(t["steps"]) for t in truths}
    assert found["values"]["steps"] == steps and found["values"]["world_size"] == 2
    assert (found["values"]["joined"], found["values"]["framework"]) == (0, "torch")
    report = report_text(tmp_path)
    run_part = report.split("## Training steps")[0]  # the observed command comes first
    assert "its 2 ranks never communicated: none of them joined a process group" in run_part
    assert "wrap the model in torch.nn.parallel.DistributedDataParallel" in run_part
    assert "DistributedSampler" in run_part
    # the summary says it before what bounds the step: this is not the training the launch meant
    summary = report.split("## Summary")[1].split("## The observed command")[0]
    assert summary.index("The 2 ranks never communicated") < summary.index("bounds the step")
    # the ranks' traces: no "0 B per step, 0.00× the gradients"
    keys = [f["key"] for f in sections["distributed"]["findings"]]
    assert "distributed.no_collectives" in keys and "distributed.comm_bytes" not in keys


def test_ranks_that_join_but_never_all_reduce_are_called_out(tmp_path, capfd):
    sections, truths = observe_ranks(tmp_path, capfd, [*TORCHRUN, SCRIPT, "--join"])
    assert {t["distributed"] for t in truths} == {"True"}
    found = first_finding(sections)
    assert found["key"] == "distributed.ranks_apart" and found["values"]["joined"] == 2
    assert "they joined a process group but none entered a collective in the whole run" in report_text(tmp_path)


@pytest.mark.slow
def test_lightning_on_one_device_under_torchrun_is_told_how_lightning_makes_ranks(tmp_path, capfd):
    """Trainer(devices=1) under torchrun's 2 processes: each trains alone as Lightning's rank 0."""
    script = [str(SCRIPTS / "lightning_fit.py"), str(tmp_path / "ckpt"), "--epochs", "1", "--devices", "1"]
    sections, truths = observe_ranks(tmp_path, capfd, [*TORCHRUN, *script])
    assert [t["rank"] for t in truths] == ["0", "0"]  # Lightning's own: neither knows of the other
    found = first_finding(sections)
    assert found["key"] == "distributed.ranks_apart" and found["values"]["framework"] == "lightning"
    assert "under torchrun, devices must equal --nproc-per-node" in report_text(tmp_path)


def test_one_process_is_no_distributed_job(tmp_path, capfd):
    sections, _ = observe_ranks(tmp_path, capfd, [sys.executable, SCRIPT])
    assert not any(f["key"] == "distributed.ranks_apart" for f in sections["run"].get("findings", []))
