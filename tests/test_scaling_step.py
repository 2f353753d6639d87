"""The lab's scaling step: N ranks × T threads against 1 rank × N·T threads and 1 rank × T threads,
each a short real training launched by torchrun, rounds interleaved; its section and its rendering."""

from __future__ import annotations

import statistics

import pytest

from dlscope.cli import main
from dlscope.cli.lab import lab_steps, step_list
from dlscope.options import DistOptions
from dlscope.rundir import load_results

TINY = ["--epochs", "1", "--train-subset", "256", "--test-subset", "200", "--batch-size", "64", "--no-tensorboard"]


@pytest.mark.slow
def test_lab_in_two_ranks_measures_ranks_against_threads(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "80")
    out = tmp_path / "run"
    flags = ["--steps", "train,scaling", "--nproc-per-node", "2", "--scaling-steps", "8", "--scaling-rounds", "2"]
    assert main(["lab", "--out", str(out), "--no-progress", *TINY, *flags]) == 0
    sections = load_results(out)["sections"]
    assert list(sections) == ["train", "ranks", "distributed", "scaling"]
    section = sections["scaling"]
    threads = section["threads_per_rank"]
    rows = {(r["ranks"], r["threads"]): r for r in section["rows"]}
    assert set(rows) == {(1, threads), (1, 2 * threads), (2, threads)}
    assert section["baseline"] == {"ranks": 1, "threads": threads}

    # each configuration ran once a round, the rounds in alternating order, and its row is their median
    runs = section["runs"]
    assert [(r["ranks"], r["threads"]) for r in runs[:3]] == [(1, threads), (1, 2 * threads), (2, threads)]
    assert [(r["ranks"], r["threads"]) for r in runs[3:]] == [(2, threads), (1, 2 * threads), (1, threads)]
    base = rows[(1, threads)]["samples_per_s"]
    for (ranks, per_rank), row in rows.items():
        measured = [r["samples_per_s"] for r in runs if (r["ranks"], r["threads"]) == (ranks, per_rank)]
        assert min(measured) > 0
        assert row["samples_per_s"] == pytest.approx(statistics.median(measured), abs=0.06)
        assert row["speedup"] == pytest.approx(row["samples_per_s"] / base, abs=2e-3)
        assert row["ideal"] == ranks * per_rank / threads
    assert 0 <= rows[(2, threads)]["exposed_comm_pct"] <= 100  # from the 2-rank runs' own traces
    assert rows[(1, 2 * threads)]["exposed_comm_pct"] is None

    # the finding names the faster split of the same cores and cites the numbers behind it
    ranks_row, threads_row = rows[(2, threads)], rows[(1, 2 * threads)]
    fast = max(ranks_row, threads_row, key=lambda r: r["samples_per_s"])
    [finding] = section["findings"]
    values = finding["values"]
    assert (values["cores"], values["fast.ranks"], values["fast.threads"]) == (
        2 * threads,
        fast["ranks"],
        fast["threads"],
    )
    assert values["multi.exposed_comm_pct"] is not None and values["single.gemm_efficiency_pct"] is not None
    assert section["cost"]["launches"] == 6 and section["cost"]["train_seconds"] < section["cost"]["wall_seconds"]
    assert not (out / "scaling").exists()  # the short runs' directories are gone once read

    printed = capsys.readouterr().out
    ours = printed[printed.index("Scaling: ranks against threads") : printed.index("where everything is")]
    assert f"{fast['ranks']} rank(s) × {fast['threads']} thread(s) run" in " ".join(ours.split())
    assert [line for line in ours.splitlines() if len(line) > 80] == []
    assert "Scaling: ranks against threads" in (out / "report.md").read_text()


def test_scaling_follows_the_rank_steps_only_in_ranks():
    two = DistOptions(nproc_per_node=2)
    assert lab_steps(step_list("scaling"), two) == ["train", "ranks", "distributed", "scaling"]
    assert lab_steps(step_list("train,profile"), two) == ["train", "ranks", "distributed", "profile"]
    every = lab_steps(None, two)
    assert every[every.index("train") :][:4] == ["train", "ranks", "distributed", "scaling"]
    assert "scaling" not in lab_steps(None, DistOptions())


@pytest.mark.parametrize(
    "flags, says",
    [
        (["--steps", "train,scaling"], "needs --nproc-per-node"),
        (["--steps", "scaling", "--nnodes", "2", "--rdzv-endpoint", "127.0.0.1:29500"], "needs --nproc-per-node"),
        (["--nproc-per-node", "2", "--scaling-rounds", "1"], "--scaling-rounds must be ≥ 2"),
        (["--nproc-per-node", "2", "--scaling-steps", "0"], "--scaling-steps must be ≥ 1"),
    ],
)
def test_bad_scaling_options_are_one_line_and_create_nothing(tmp_path, capsys, flags, says):
    out = tmp_path / "never"
    assert main(["lab", "--out", str(out), *TINY, *flags]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err
    assert not out.exists()
