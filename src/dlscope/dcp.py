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

import os
import shutil
import time
from pathlib import Path

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict

from dlscope.checkpoint import SaveInfo, save_checkpoint
from dlscope.events import EpochResult, TrainingObserver
from dlscope.fsutil import fsync_dir
from dlscope.phases import phase
from dlscope.restore import TRAINER_FILE, one_process_is_intended
from dlscope.train import Trainer

LAST = "last.dcp"


def coordinator() -> bool:
    return not dist.is_initialized() or dist.get_rank() == 0


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


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


class DcpCheckpointObserver(TrainingObserver):
    """Saves checkpoints/last.dcp at every epoch end; attached on every rank (the save is collective)."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        self.path = self.directory / LAST
        self.saves: list[SaveInfo] = []

    def on_epoch_end(self, trainer: Trainer, epoch: EpochResult) -> None:
        with phase("checkpoint_save"):
            self.saves.append(save_dcp(self.directory, trainer))
