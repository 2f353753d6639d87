"""`dlscope ckpt inspect DIR` on a torch.distributed.checkpoint directory written by a real 2-rank
gloo job (tests/scripts/dcp_save.py): which rank wrote which shard of which tensor, bytes per file,
shapes and dtypes checked against torch's own DCP reader; corrupt and hostile directories give one
line naming the file, and nothing in `.metadata` is ever run."""

from __future__ import annotations

import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from dlscope.ckpt.inspect import inspect_checkpoint
from dlscope.cli import main
from dlscope.errors import CheckpointError

SCRIPT = Path(__file__).parent / "scripts" / "dcp_save.py"


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> tuple[Path, dict]:
    """The DCP directory, and its contents as torch's own reader returns them (one flat torch.save)."""
    root = tmp_path_factory.mktemp("dcp")
    directory = root / "ckpt"
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    done = subprocess.run([*torchrun, str(SCRIPT), str(directory)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    dcp_to_torch_save(directory, root / "reference.pt")
    return directory, torch.load(root / "reference.pt", weights_only=False)  # our own file, just written


def flat(state: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in state.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flat(value, f"{name}."))
        elif isinstance(value, list | tuple) and not isinstance(value, torch.Size):
            out.update(flat(dict(enumerate(value)), f"{name}."))
        else:
            out[name] = value
    return out


def test_each_ranks_files_shards_and_tensors(saved):
    directory, reference = saved
    a = inspect_checkpoint(directory)
    assert a.format == "torch.distributed.checkpoint" and a.safe_to_load
    files = {f["file"]: f for f in a.layout["dcp"]["files"]}
    assert {f["rank"] for f in files.values()} == {0, 1}
    for name, f in files.items():
        assert f["bytes"] == (directory / name).stat().st_size
    # the sharded tensor: one chunk of rows per rank, each in that rank's file
    shards = sorted((t for t in a.tensors if t.name.startswith("table@")), key=lambda t: t.name)
    assert [(t.shape, t.storage.split("#")[0]) for t in shards] == [([6, 8], "__0_0.distcp"), ([6, 8], "__1_0.distcp")]
    # every other tensor matches what torch's DCP reader returns, by name, shape and dtype
    tensors = {k: v for k, v in flat(reference).items() if isinstance(v, torch.Tensor)}
    ours = {t.name: t for t in a.tensors if not t.name.startswith("table@")}
    assert set(ours) == set(tensors) - {"table"}
    for name, t in ours.items():
        assert (t.shape, t.dtype) == (list(tensors[name].shape), str(tensors[name].dtype).removeprefix("torch."))
    assert sum(t.nbytes for t in a.tensors) == sum(v.numel() * v.element_size() for v in tensors.values())
    roles = {t.name: (t.role, t.group) for t in a.tensors}
    assert roles["model.0.weight"] == ("parameter", "0") and roles["optim.state.2.bias.exp_avg"] == ("optimizer", "2")
    assert a.metadata["step"].endswith(".distcp")  # a pickled value: its size and file, never unpickled


def test_stats_read_the_shards_values(saved):
    directory, reference = saved
    a = inspect_checkpoint(directory, stats=True)
    low, high = (next(t for t in a.tensors if t.name == f"table@{r},0") for r in (0, 6))
    assert (low.stats["min"], low.stats["max"], high.stats["min"], high.stats["max"]) == (0, 47, 48, 95)
    weight = next(t for t in a.tensors if t.name == "model.0.weight")
    assert weight.stats["mean"] == pytest.approx(reference["model"]["0.weight"].mean().item(), rel=1e-5)


def test_cli_prints_the_files_each_rank_wrote_at_80_columns(saved, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["ckpt", "inspect", str(saved[0])]) == 0
    out = capsys.readouterr().out
    assert "__1_0.distcp" in out and "Sharded across ranks: table in 2 chunks" in out
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.startswith("table@")}
    assert rows["table@0,0"][-2:] == ["0", "other"] and rows["table@6,0"][-2:] == ["1", "other"]  # the writer
    assert [line for line in out.splitlines() if len(line) > 80] == []


def copy_of(saved, tmp_path) -> Path:
    directory = tmp_path / "ckpt"
    shutil.copytree(saved[0], directory)
    return directory


@pytest.mark.parametrize("damage", ["truncate_shard", "remove_shard", "truncate_metadata"])
def test_a_damaged_directory_is_one_line_naming_the_file(saved, tmp_path, capsys, damage):
    directory = copy_of(saved, tmp_path)
    shard, metadata = directory / "__1_0.distcp", directory / ".metadata"
    if damage == "truncate_shard":
        shard.write_bytes(shard.read_bytes()[:1000])
    elif damage == "remove_shard":
        shard.unlink()
    else:
        metadata.write_bytes(metadata.read_bytes()[:3000])
    named = metadata if damage == "truncate_metadata" else shard
    with pytest.raises(CheckpointError) as error:
        inspect_checkpoint(directory)
    assert str(named) in str(error.value)
    assert main(["ckpt", "inspect", str(directory)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(named) in err[0]


class Payload:
    def __init__(self, flag: Path):
        self.flag = flag

    def __reduce__(self):
        return (subprocess.call, (["touch", str(self.flag)],))


def test_a_hostile_metadata_is_reported_and_never_run(saved, tmp_path):
    """dcp.load would pickle.load this `.metadata` and run the payload; inspect names it instead."""
    directory = copy_of(saved, tmp_path)
    flag = tmp_path / "ran"
    metadata = pickle.loads((directory / ".metadata").read_bytes())  # our own file, just written
    metadata.planner_data = Payload(flag)
    (directory / ".metadata").write_bytes(pickle.dumps(metadata))
    a = inspect_checkpoint(directory)
    assert not a.safe_to_load and not flag.exists()
    assert any(f.level == "bad" and f.values.get("name") == "subprocess.call" for f in a.findings)


def test_ckpt_scan_judges_dcp_metadata_by_dcps_own_classes(saved, tmp_path, capsys):
    """Every DCP directory would read DANGEROUS against torch.load's list; against DCP's it is safe, and
    a payload added to it is still named."""
    assert main(["ckpt", "scan", str(saved[0])]) == 0
    assert "3 files: 3 safe" in capsys.readouterr().out
    directory = copy_of(saved, tmp_path)
    metadata = pickle.loads((directory / ".metadata").read_bytes())  # our own file, just written
    metadata.planner_data = Payload(tmp_path / "ran")
    (directory / ".metadata").write_bytes(pickle.dumps(metadata))
    assert main(["ckpt", "scan", str(directory)]) == 1
    assert "subprocess.call" in capsys.readouterr().out and not (tmp_path / "ran").exists()


TINY = ["--epochs", "1", "--train-subset", "256", "--test-subset", "100", "--no-progress", "--no-tensorboard"]


@pytest.fixture(scope="module")
def trained_dcp(tmp_path_factory) -> Path:
    """A DCP checkpoint of the built-in job, written once; each test damages its own copy."""
    first = tmp_path_factory.mktemp("dcp-train") / "first"
    assert main(["train", "--ckpt-format", "dcp", *TINY, "--out", str(first)]) == 0
    return (first / "checkpoints" / "last.dcp").resolve()


@pytest.mark.parametrize("damage", ["remove_shard", "truncate_shard"])
def test_resuming_a_damaged_dcp_checkpoint_is_one_line_and_creates_no_run(trained_dcp, tmp_path, capsys, damage):
    """torch's DCP reader fails inside a collective with a BaseException and a traceback per rank;
    resume and verify check the directory first, as inspect does."""
    directory = tmp_path / "last.dcp"
    shutil.copytree(trained_dcp, directory)
    shard = next(directory.glob("*.distcp"))
    if damage == "remove_shard":
        shard.unlink()
    else:
        shard.write_bytes(shard.read_bytes()[:100])
    capsys.readouterr()
    again = tmp_path / "again"
    assert main(["train", "--resume", str(directory), "--epochs", "2", *TINY[2:], "--out", str(again)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(shard) in err[0], err
    assert not again.exists()
    assert main(["ckpt", "verify", str(directory)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(shard) in err[0], err
