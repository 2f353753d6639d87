"""`--ckpt-format dcp`: checkpoints as torch.distributed.checkpoint writes them, resumable on any world size.

checkpoints/
    last.dcp -> epoch-2.dcp     a symlink, replaced atomically once every rank has written
    epoch-2.dcp/
        .metadata               DCP's index: each tensor, the file and offset that hold it
        __<rank>_0.distcp       one file per rank (DDP's replicated weights are written once)
        trainer.pt              by rank 0 (torch.save, weights_only): epoch, step, scheduler, RNG,
                                config, history, fingerprint — what is not a model or optimizer tensor

A rank killed mid-save leaves last.dcp pointing at the previous epoch, whole.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)

from dlscope.checkpoint import SaveInfo, restore_rng, save_checkpoint
from dlscope.ckpt.dcp_fmt import checked
from dlscope.errors import CheckpointError
from dlscope.fsutil import fsync_dir
from dlscope.phases import phase
from dlscope.train import EpochResult, Observer, Trainer

TRAINER_FILE = "trainer.pt"
LAST = "last.dcp"


def is_dcp_dir(path: str | Path) -> bool:
    return (Path(path) / ".metadata").is_file()


def coordinator() -> bool:
    return not dist.is_initialized() or dist.get_rank() == 0


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


@contextlib.contextmanager
def one_process_is_intended() -> Iterator[None]:
    """Without a process group DCP warns that it assumes one process: that is what we mean."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
        yield


def save_dcp(checkpoints: Path, trainer: Trainer) -> SaveInfo:
    """Every rank calls it: DCP writes model and optimizer, rank 0 the rest, then last.dcp moves."""
    start = time.perf_counter()
    target = checkpoints / f"epoch-{trainer.start_epoch}.dcp"
    if coordinator() and target.exists():  # a save of this epoch cut short before a restart
        shutil.rmtree(target)
    barrier()
    model_state, optimizer_state = get_state_dict(trainer.model, trainer.optimizer)
    with one_process_is_intended():
        dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=target)
    if coordinator():
        rest = {k: v for k, v in trainer.state_dict().items() if k not in ("model", "optimizer")}
        save_checkpoint(target / TRAINER_FILE, rest)
        point_last_at(checkpoints, target)
    barrier()
    size = sum(f.stat().st_size for f in target.iterdir())
    return SaveInfo(str(checkpoints / LAST), size, time.perf_counter() - start, 0)


def point_last_at(checkpoints: Path, target: Path) -> None:
    """Swap the last.dcp symlink in one rename, then delete the epochs it no longer names."""
    link, temp = checkpoints / LAST, checkpoints / f".{LAST}.{os.getpid()}.tmp"
    temp.unlink(missing_ok=True)
    temp.symlink_to(target.name)
    os.replace(temp, link)
    fsync_dir(checkpoints)
    for old in checkpoints.glob("epoch-*.dcp"):
        if old.name != target.name:
            shutil.rmtree(old, ignore_errors=True)


def load_dcp(path: str | Path) -> dict[str, Any]:
    """A DCP checkpoint's non-tensor state, with "dcp" naming the directory its tensors stay in
    (they are read into a model and optimizer of any world size by restore_weights)."""
    path = Path(path)
    if not is_dcp_dir(path):
        raise CheckpointError("a directory without .metadata: not a torch.distributed.checkpoint", path)
    checked(path)  # torch's reader would fail deep inside a collective, with a traceback per rank
    trainer_file = path / TRAINER_FILE
    if not trainer_file.is_file():
        raise CheckpointError(f"a DCP checkpoint without {TRAINER_FILE}: not written by dlscope", path)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            state = torch.load(trainer_file, map_location="cpu", weights_only=True)
    except Exception as e:
        raise CheckpointError(f"{TRAINER_FILE} is not loadable ({type(e).__name__})", path) from None
    if not isinstance(state, dict) or "config" not in state or "epoch" not in state:
        raise CheckpointError(f"{TRAINER_FILE} has no 'config' and 'epoch' entries", path)
    if "rng" in state:
        state["rng"] = restore_rng(state["rng"])
    state["dcp"] = str(path.resolve())
    return state


def restore_weights(path: str | Path, model: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> None:
    """Read model (and optimizer) tensors in place: every rank reads what it needs (collective when
    a process group exists), whichever world size saved them."""
    if optimizer is None:  # the weights alone (ckpt verify)
        state = {"model": get_model_state_dict(model)}
    else:
        model_state, optimizer_state = get_state_dict(model, optimizer)  # the templates DCP fills
        state = {"model": model_state, "optimizer": optimizer_state}
    try:
        with one_process_is_intended():
            dcp.load(state, checkpoint_id=Path(path))
    except (Exception, CheckpointException) as e:  # CheckpointException is a BaseException
        first = str(e).strip().splitlines()[0][:160] if str(e).strip() else type(e).__name__
        raise CheckpointError(f"its tensors do not load into this model: {first}", path) from None
    if optimizer is None:
        set_model_state_dict(model, state["model"])
    else:
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])


class DcpCheckpointObserver(Observer):
    """Saves checkpoints/last.dcp at every epoch end; attached on every rank (the save is collective)."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        self.path = self.directory / LAST
        self.saves: list[SaveInfo] = []

    def on_epoch_end(self, trainer: Trainer, epoch: EpochResult) -> None:
        with phase("checkpoint_save"):
            self.saves.append(save_dcp(self.directory, trainer))
