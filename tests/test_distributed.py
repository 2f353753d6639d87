"""The built-in job in several ranks: real torchrun launches on a few hundred MNIST samples.

Two ranks with the global batch split in halves train the same weights as one process (DDP
averages the gradients), so a job can move between world sizes through its DCP checkpoint and
end where an uninterrupted one-process run ends."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import pytest
import torch

from dlscope.cli import main
from dlscope.contract.env import KILL_RANK_ENV
from dlscope.data.loaders import ResidentBatches, TorchLoaderBatches
from dlscope.dcp import save_dcp
from dlscope.distributed.iorank import rank_pids
from dlscope.distributed.launch import WORKER_MODULE
from dlscope.events import TrainingObserver
from dlscope.restore import in_memory, load_checkpoint
from dlscope.train import TrainConfig, Trainer

STEPS_PER_EPOCH = 8  # 512 samples, global batch 64
JOB = ["--model", "small", "--epochs", "2", "--batch-size", "64", "--train-subset", "512", "--test-subset", "200"]
QUIET = ["--target-acc", "100", "--log-every", "4", "--no-progress", "--no-tensorboard"]
CONFIG = TrainConfig(
    model="small", epochs=2, batch_size=64, train_subset=512, test_subset=200, target_acc=100, log_every=4, threads=1
)


class EpochOneWeights(TrainingObserver):
    """The reference run's state at the end of epoch 1 (and a DCP checkpoint of it, when asked)."""

    def __init__(self, dcp_dir: Path | None = None) -> None:
        self.dcp_dir = dcp_dir
        self.model: dict[str, torch.Tensor] = {}

    def on_epoch_end(self, trainer, epoch) -> None:
        if epoch.epoch == 1:
            self.model = copy.deepcopy(trainer.model.state_dict())
            if self.dcp_dir is not None:
                save_dcp(self.dcp_dir, trainer)


@pytest.fixture(scope="module")
def one_process(mnist, tmp_path_factory):
    """The uninterrupted one-process run every distributed run here is compared with."""
    torch.set_num_threads(1)
    epoch_one = EpochOneWeights(tmp_path_factory.mktemp("dcp1"))
    trainer = Trainer(CONFIG, mnist, [epoch_one])
    trainer.fit()
    return {"epoch1": epoch_one.model, "final": trainer.model.state_dict(), "dcp": epoch_one.dcp_dir / "last.dcp"}


def assert_same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for name in a:  # float sums in another order (per-rank halves, all-reduce), nothing more
        torch.testing.assert_close(a[name].float(), b[name].float(), rtol=1e-4, atol=1e-5, msg=name)


def sections(run: Path) -> dict:
    return json.loads((run / "results.json").read_text())["sections"]


def alive_workers(run: Path) -> list[int]:
    pids = rank_pids(run)
    assert len(set(pids.values())) == 2  # both ranks wrote theirs
    alive = []
    for pid in pids:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if WORKER_MODULE.encode() in cmdline:
            alive.append(pid)
    return alive


@pytest.mark.parametrize("loader", [ResidentBatches, TorchLoaderBatches])
def test_rank_shards_together_are_the_one_process_batches(loader):
    n, batch, world = 203, 16, 2  # 203: the last global batch is short and odd (padding)
    images, labels = torch.zeros(n, 28, 28, dtype=torch.uint8), torch.arange(n)
    whole = loader(images, labels, batch, seed=3)
    ranks = [loader(images, labels, batch // world, seed=3) for _ in range(world)]
    for rank, shard in enumerate(ranks):
        shard.shard(rank, world)
    for epoch in (0, 1):
        for source in (whole, *ranks):
            source.set_epoch(epoch)
        per_rank = [[y.tolist() for _, y in shard] for shard in ranks]
        assert all(len(batches) == len(whole) for batches in per_rank)
        for k, (_, y) in enumerate(whole):
            together = sorted(i for batches in per_rank for i in batches[k])
            expected = sorted(y.tolist())
            padded = len(together) - len(expected)  # DistributedSampler repeats the epoch's first samples
            assert padded == (-n % world if k == len(whole) - 1 else 0)
            assert set(expected) <= set(together)


def test_a_killed_rank_ends_the_job_and_its_dcp_checkpoint_resumes_on_one_process(one_process, mnist, tmp_path, capsys):
    run = tmp_path / "two"
    kill = {KILL_RANK_ENV: f"1:{STEPS_PER_EPOCH + 2}"}  # rank 1, two steps into epoch 2
    args = ["train", "--nproc-per-node", "2", "--ckpt-format", "dcp", "--out", str(run), *JOB, *QUIET]
    with pytest.MonkeyPatch.context() as patch:
        for key, value in kill.items():
            patch.setenv(key, value)
        assert main(args) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("dlscope: error")]
    assert len(errors) == 1
    assert "rank 1 (pid " in errors[0] and "killed by SIGKILL" in errors[0] and "checkpoints/last.dcp" in errors[0]
    assert alive_workers(run) == []
    assert json.loads((run / "results.json").read_text())["run"]["status"] == "failed"
    saved = load_checkpoint(run / "checkpoints" / "last.dcp")  # intact: epoch 1, written by both ranks
    assert saved["epoch"] == 1 and saved["global_step"] == STEPS_PER_EPOCH
    two_ranks = Trainer(CONFIG, mnist)
    two_ranks.load_state_dict(in_memory(saved, two_ranks.model, two_ranks.optimizer))
    assert_same_weights(two_ranks.model.state_dict(), one_process["epoch1"])
    assert main(["ckpt", "verify", str(run / "checkpoints" / "last.dcp")]) == 0  # its fingerprint holds

    resumed = tmp_path / "one"
    args = ["train", "--resume", str(run / "checkpoints" / "last.dcp"), "--threads", "1", "--out", str(resumed)]
    assert main([*args, *QUIET]) == 0
    train = sections(resumed)["train"]
    assert train["resumed_from_epoch"] == 1 and not train["schedule_restarted"]
    final = torch.load(resumed / "checkpoints" / "final.pt", weights_only=True)["model"]
    assert_same_weights(final, one_process["final"])


def test_a_restarted_job_resumes_a_one_process_checkpoint_on_two_ranks(one_process, tmp_path, monkeypatch):
    run = tmp_path / "two"
    monkeypatch.setenv(KILL_RANK_ENV, f"1:{STEPS_PER_EPOCH + 3}")  # in the resumed epoch 2: torchrun restarts
    args = ["train", "--nproc-per-node", "2", "--max-restarts", "1", "--resume", str(one_process["dcp"])]
    assert main([*args, "--out", str(run), *QUIET]) == 0
    results = sections(run)
    assert results["ranks"]["restarts"] == 1 and results["ranks"]["world_size"] == 2
    assert [r["rank"] for r in results["ranks"]["ranks"]] == [0, 1]
    assert results["train"]["resumed_from_epoch"] == 1 and results["checkpoint"]["verify"]["ok"]
    final = torch.load(run / "checkpoints" / "final.pt", weights_only=True)["model"]
    assert_same_weights(final, one_process["final"])
    for rank in (0, 1):
        trace = json.loads((run / "ranks" / f"rank{rank}" / "trace.json").read_text())
        assert trace["distributedInfo"]["rank"] == rank
        names = {e.get("name") for e in trace["traceEvents"]}
        assert "gloo:all_reduce" in names and any(str(n).startswith("ProfilerStep#") for n in names)
    assert alive_workers(run) == []


@pytest.mark.parametrize(
    "flags, says",
    [
        (["--nproc-per-node", "0"], "--nproc-per-node must be ≥ 1"),
        (["--nproc-per-node", "3"], "must divide by the 3 ranks"),
        (["--nnodes", "2"], "--nnodes > 1 needs --rdzv-endpoint"),
        (["--nnodes", "2", "--rdzv-endpoint", "localhost"], "--rdzv-endpoint must be HOST:PORT"),
        (["--nproc-per-node", "2", "--autotune"], "--autotune"),
        (["--bucket-cap-mb", "0"], "--bucket-cap-mb must be > 0"),
    ],
)
def test_bad_distributed_options_are_one_line_and_create_nothing(tmp_path, capsys, flags, says):
    out = tmp_path / "never"
    assert main(["train", "--out", str(out), "--batch-size", "64", *flags]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err
    assert not out.exists()


@pytest.mark.slow
def test_two_nodes_rendezvous_over_c10d_on_one_machine(tmp_path):
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    launcher = [sys.executable, "-m", "dlscope.cli", "train", "--nnodes", "2", "--rdzv-endpoint", f"127.0.0.1:{port}"]
    nodes = [
        subprocess.Popen(
            [
                *launcher,
                "--node-rank",
                str(node),
                "--out",
                str(tmp_path / f"node{node}"),
                *JOB,
                "--epochs",
                "1",
                *QUIET,
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        for node in (0, 1)
    ]
    errors = [node.communicate(timeout=300)[1].decode() for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], errors
    ranks = [sections(tmp_path / f"node{node}")["ranks"] for node in (0, 1)]
    assert all(r["world_size"] == 2 and r["nnodes"] == 2 for r in ranks)
    assert sorted(row["rank"] for r in ranks for row in r["ranks"]) == [0, 1]  # one rank on each node
    assert all(sections(tmp_path / f"node{node}")["checkpoint"]["verify"]["ok"] for node in (0, 1))


@pytest.mark.slow
def test_trace_io_attributes_the_shard_reads_and_checkpoint_writes_to_ranks(tmp_path):
    run = tmp_path / "traced"
    args = ["lab", "--steps", "train", "--trace-io", "--nproc-per-node", "2", "--out", str(run)]
    assert main([*args, *JOB, "--epochs", "1", *QUIET]) == 0
    iotrace = sections(run)["iotrace"]
    ranks = {r["rank"]: r for r in iotrace["ranks"]}
    assert sorted(ranks) == [0, 1]
    for rank in ranks.values():
        phases = {p["phase"]: p for p in rank["phases"]}
        assert phases["data_load"]["bytes_read"] > 1_000_000  # MNIST, which the rank then shards by index
    # each rank reads the whole of the same files: its reads named as the dataset's, all of them —
    # unless the tracer lost events (a per-CPU buffer overflowing on a loaded machine: counted)
    read = [ranks[r]["categories"]["dataset"]["bytes_read"] for r in (0, 1)]
    if (iotrace.get("notes") or {}).get("lost_events", 0) == 0:
        assert read[0] == read[1], iotrace["notes"]
    else:
        assert min(read) > 0.5 * max(read), iotrace["notes"]
    saves = {r: {p["phase"]: p for p in ranks[r]["phases"]}.get("checkpoint_save") for r in ranks}
    assert saves[0]["bytes_written"] > 0 and saves[1] is None  # rank 0 writes the checkpoint
    assert ranks[0]["categories"]["checkpoint"]["bytes_written"] > 0
    assert "checkpoint" not in ranks[1]["categories"] or ranks[1]["categories"]["checkpoint"]["bytes_written"] == 0


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs: one per rank under NCCL")
def test_two_ranks_on_two_gpus_use_nccl(tmp_path):
    run = tmp_path / "gpu"
    assert main(["train", "--nproc-per-node", "2", "--device", "cuda", "--out", str(run), *JOB, *QUIET]) == 0
    ranks = sections(run)["ranks"]
    assert ranks["backend"] == "nccl" and [r["device"] for r in ranks["ranks"]] == ["cuda:0", "cuda:1"]
