"""`dlscope merge` and `dlscope run` of a job on several machines, tested on one machine: two launchers
(`torchrun --nnodes 2`, a c10d rendezvous on 127.0.0.1, 2 ranks each) of tests/scripts/ddp_nodes.py,
each under its own `dlscope run`. The truth is what the script plants: one rank of the second
launcher sleeps a known time before each backward (a straggler), or stops at a known line (a hang);
both launchers run on one clock (each node's offset is 0). Bad inputs are one line, exit 2, no
output directory. A planted job (records written with dlscope's own writers, as a rank writes them)
checks the clock offsets and the straggler against known values."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from dlscope.analysis.stepfile import CollectiveFile, StepFile
from dlscope.cli import main
from dlscope.rundir import node_parts, processes_dir

SCRIPT = Path(__file__).parent / "scripts" / "ddp_nodes.py"
STEPS = 40
SLEEP_MS = 60.0
HANG_STEP = 10
pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_launchers(outs: list[Path], second: list[str], run_flags: list[str] = ()) -> list[subprocess.Popen]:
    """`dlscope run --out OUT -- torchrun --nnodes 2 ...` twice at once (the second launcher's ranks
    get `second` too)."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "COLUMNS": "80"}
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "2"]
    torchrun += ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "merge-test"]
    launchers = []
    for node, out in enumerate(outs):
        script = [str(SCRIPT), "--steps", str(STEPS), *(second if node == 1 else [])]
        argv = [sys.executable, "-m", "dlscope.cli", "run", "--out", str(out), *run_flags, "--", *torchrun, *script]
        launchers.append(subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    return launchers


def two_launchers(outs: list[Path], second: list[str], timeout: float = 400) -> list[str]:
    """Both launchers to their end; each one's terminal output."""
    return [p.communicate(timeout=timeout)[0] for p in start_launchers(outs, second)]


def merge(args: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "COLUMNS": "80"}
    return subprocess.run(
        [sys.executable, "-m", "dlscope.cli", "merge", *args], env=env, capture_output=True, text=True, timeout=300
    )


def ranks_of(job_dir: Path) -> dict[int, dict]:
    """rank → its process record, in the one node part of a launcher's job directory."""
    (part,) = node_parts(job_dir)
    found = {}
    for path in processes_dir(part).glob("*.jsonl"):
        records = [json.loads(line) for line in path.read_text().splitlines()]
        head = next(r for r in records if r["k"] == "process")
        joined = next((r for r in records if r["k"] == "rank"), None)
        if joined is not None:
            found[joined["rank"]] = {**head, "part": part}
    return found


@pytest.fixture(scope="module")
def slow_job(tmp_path_factory) -> tuple[Path, list[str]]:
    """Each launcher under its own --out; the second launcher's local rank 1 sleeps SLEEP_MS a step."""
    root = tmp_path_factory.mktemp("slow")
    outputs = two_launchers([root / "node0", root / "node1"], ["--slow-local-rank", "1", "--slow-ms", str(SLEEP_MS)])
    for out in outputs:
        assert "ok in" in out, out[-3000:]
    return root, outputs


@pytest.fixture(scope="module")
def slow_merged(slow_job) -> tuple[Path, dict, str]:
    root, _ = slow_job
    done = merge([str(root / "node0"), str(root / "node1"), "--out", str(root / "merged")])
    assert done.returncode == 0, done.stderr
    return root, json.loads((root / "merged" / "results.json").read_text())["sections"]["merge"], done.stdout


def slowed_rank(root: Path) -> tuple[int, str]:
    """The rank the script slowed (local rank 1 of the second launcher), and its node number."""
    ranks = ranks_of(root / "node1")
    (rank,) = [r for r, head in ranks.items() if head["launcher"]["local_rank"] == 1]
    return rank, ranks[rank]["launcher"]["node"]


def test_each_launcher_writes_its_part_and_says_the_job_is_not_whole(slow_job):
    root, outputs = slow_job
    for node, out in enumerate(outputs):
        assert len(node_parts(root / f"node{node}")) == 1
        assert "2 of 4 ranks" in out and "dlscope merge" in out  # no report of the whole job from half of it
        assert not (root / f"node{node}" / "results.json").exists()


def test_each_rank_records_every_collective_it_launched_in_its_step(slow_job):
    root, _ = slow_job
    for node in ("node0", "node1"):
        for rank, head in ranks_of(root / node).items():
            directory = processes_dir(head["part"])
            rows = CollectiveFile(directory / f"{head['pid']}.collectives").read()
            steps = StepFile(directory / f"{head['pid']}.steps")
            # the tiny model is one DDP bucket: one all-reduce a step, launched in that step
            assert len(rows) == STEPS and list(rows["step"]) == list(range(STEPS)), rank
            assert np.all(rows["done"] >= rows["launch"]) and steps.count >= STEPS
            assert head["host"] == socket.gethostname() and head["launcher"]["run_id"] == "merge-test"


def test_merge_names_the_slowed_rank_and_its_node_with_its_extra_time(slow_merged):
    root, section, _ = slow_merged
    rank, node = slowed_rank(root)
    straggler = section["collectives"]["straggler"]
    assert straggler["rank"] == rank and straggler["host"] == f"{socket.gethostname()}-node{node}"
    assert abs(straggler["cost_ms"] - SLEEP_MS) <= 0.2 * SLEEP_MS, straggler
    assert straggler["others"] == 3 and straggler["last"] >= 0.9 * straggler["of"]
    assert section["missing_ranks"] == [] and section["job"]["world_size"] == 4


def test_both_launchers_share_one_clock_and_merge_says_so(slow_merged):
    """Both nodes run on this machine's clock: each recovered offset is 0 within the hops' noise."""
    _, section, _ = slow_merged
    assert len(section["offsets"]) == 2 and all(abs(o["ms"]) < 5.0 for o in section["offsets"].values())


def test_the_parquet_dataset_holds_every_ranks_steps_and_pandas_reads_it(slow_merged):
    import pandas as pd

    root, section, _ = slow_merged
    steps = pd.read_parquet(root / "merged" / section["parquet"] / "steps")
    assert sorted(steps["rank"].astype(int).unique()) == [0, 1, 2, 3]
    assert steps.groupby("rank", observed=True).size().min() >= STEPS
    rank, _ = slowed_rank(root)
    others = steps[(steps["rank"].astype(int) != rank) & steps["steady"]]
    slowed = steps[(steps["rank"].astype(int) == rank) & steps["steady"]]
    # the sleep is no phase dlscope times: the slowed rank's `other`; the others wait inside backward
    assert abs(1e3 * slowed["other"].median() - SLEEP_MS) <= 0.2 * SLEEP_MS
    assert 1e3 * others["backward"].median() >= 0.8 * SLEEP_MS


def test_the_merged_report_leads_with_the_straggler_at_80_columns(slow_merged):
    _, _, out = slow_merged
    lines = out.splitlines()
    assert all(len(line) <= 80 for line in lines)
    first = next(line for line in lines if line.startswith(("✘", "✔", "•")))
    assert first.startswith("✘ Straggler: rank")


@pytest.fixture(scope="module")
def shared_job(tmp_path_factory) -> tuple[Path, list[str]]:
    root = tmp_path_factory.mktemp("shared")
    outputs = two_launchers([root / "job", root / "job"], ["--slow-local-rank", "1", "--slow-ms", str(SLEEP_MS)])
    for out in outputs:
        assert "ok in" in out, out[-3000:]
    return root / "job", outputs


def test_launchers_sharing_one_out_give_one_report_of_the_whole_job(shared_job):
    job, outputs = shared_job
    assert len(node_parts(job)) == 2
    assert sum("dlscope merge →" in out for out in outputs) == 1  # the last one in merges, once
    section = json.loads((job / "results.json").read_text())["sections"]["merge"]
    assert sorted(r["rank"] for r in section["ranks"]) == [0, 1, 2, 3] and section["missing_ranks"] == []
    assert section["collectives"]["straggler"] is not None and (job / "report.md").is_file()


@pytest.fixture(scope="module")
def hung_job(tmp_path_factory) -> Path:
    """The second launcher's local rank 1 stops at step HANG_STEP; each launcher's watchdog captures
    its node (the job left hung: --on-hang wait), then both are interrupted as a user would."""
    root = tmp_path_factory.mktemp("hung")
    outs = [root / "node0", root / "node1"]
    second = ["--hang-local-rank", "1", "--hang-step", str(HANG_STEP)]
    launchers = start_launchers(outs, second, ["--hang-after", "5", "--on-hang", "wait"])
    deadline = time.monotonic() + 300
    while not all(list(out.glob("hosts/*/hang-1.json")) for out in outs):
        assert time.monotonic() < deadline and all(p.poll() is None for p in launchers)
        time.sleep(0.5)
    for p in launchers:
        p.send_signal(signal.SIGINT)
    outputs = [p.communicate(timeout=120)[0] for p in launchers]
    for out in outputs:
        assert "every process captured" in out, out[-3000:]
    return root


def test_the_merged_view_names_the_rank_that_never_arrived(hung_job):
    done = merge([str(hung_job / "node0"), str(hung_job / "node1"), "--out", str(hung_job / "merged")])
    assert done.returncode == 0, done.stderr
    hang = json.loads((hung_job / "merged" / "results.json").read_text())["sections"]["merge"]["hang"]
    ranks = ranks_of(hung_job / "node1")
    (stopped,) = [r for r, head in ranks.items() if head["launcher"]["local_rank"] == 1]
    (never,) = hang["never_arrived"]
    assert never["rank"] == stopped and never["where"]["function"] == "stop_here_forever"
    assert never["host"] == f"{socket.gethostname()}-node{ranks[stopped]['launcher']['node']}"
    assert hang["reached"] == sorted({0, 1, 2, 3} - {stopped}) and hang["seq"] == HANG_STEP + 1
    said = " ".join(done.stdout.split())  # the sentence as read, wherever 80 columns wrapped it
    assert f"rank {stopped} on {never['host']} never arrived" in said and "ddp_nodes.py" in said


# --- bad input: one line, exit 2, nothing written ---------------------------------------------


def refused(args: list[str], out: Path, capsys) -> str:
    assert main(["merge", *args, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and not out.exists(), err
    return err


def test_directories_of_two_jobs_are_refused(slow_job, hung_job, tmp_path, capsys):
    slow, _ = slow_job
    err = refused([str(slow / "node0"), str(hung_job / "node1")], tmp_path / "out", capsys)
    assert "ranks of another job" in err and "merge-test" in err


def test_a_directory_that_is_no_run_is_refused(slow_job, tmp_path, capsys):
    slow, _ = slow_job
    (tmp_path / "empty").mkdir()
    err = refused([str(slow / "node0"), str(tmp_path / "empty")], tmp_path / "out", capsys)
    assert str(tmp_path / "empty") in err and "not a dlscope run directory" in err


def test_a_truncated_parquet_file_is_refused(slow_merged, tmp_path, capsys):
    root, section, _ = slow_merged
    copy = tmp_path / "merged"
    subprocess.run(["cp", "-r", str(root / "merged"), str(copy)], check=True)
    victim = sorted((copy / section["parquet"] / "collectives").rglob("*.parquet"))[1]
    victim.write_bytes(victim.read_bytes()[:-100])
    err = refused([str(copy)], tmp_path / "out", capsys)
    assert str(victim) in err and "cut short" in err


def test_a_schema_version_from_the_future_is_refused(slow_merged, tmp_path, capsys):
    import pyarrow.parquet as pq

    root, section, _ = slow_merged
    copy = tmp_path / "merged"
    subprocess.run(["cp", "-r", str(root / "merged"), str(copy)], check=True)
    victim = sorted((copy / section["parquet"] / "steps").rglob("*.parquet"))[0]
    table = pq.read_table(victim)
    metadata = {**table.schema.metadata, b"dlscope.schema_version": b"99"}
    victim.unlink()
    pq.write_table(table.replace_schema_metadata(metadata), victim)
    err = refused([str(copy)], tmp_path / "out", capsys)
    assert str(victim) in err and "version 99 is newer" in err


def test_an_earlier_merge_merges_again_into_the_same_job(slow_merged, tmp_path):
    root, section, _ = slow_merged
    done = merge([str(root / "merged"), "--out", str(tmp_path / "again")])
    assert done.returncode == 0, done.stderr
    again = json.loads((tmp_path / "again" / "results.json").read_text())["sections"]["merge"]
    assert again["collectives"]["straggler"]["rank"] == section["collectives"]["straggler"]["rank"]
    assert [r["steps"] for r in again["ranks"]] == [r["steps"] for r in section["ranks"]]


def test_a_missing_host_leaves_the_analysis_of_the_rest_with_its_ranks_listed(slow_job, tmp_path):
    root, _ = slow_job
    done = merge([str(root / "node1"), "--out", str(tmp_path / "half")])
    assert done.returncode == 0, done.stderr
    section = json.loads((tmp_path / "half" / "results.json").read_text())["sections"]["merge"]
    present = sorted(ranks_of(root / "node1"))
    assert sorted(r["rank"] for r in section["ranks"]) == present
    assert section["missing_ranks"] == sorted({0, 1, 2, 3} - set(present))
    assert "Missing: ranks" in " ".join(done.stdout.split())
