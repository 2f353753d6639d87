"""Crash-safe checkpoints: save, and verify by re-running the test set (reading one back: dlscope.restore).

A checkpoint holds model, optimizer, scheduler, epoch, RNG states, config and history, plus a
fingerprint of the model's test-set predictions at save time, so `verify` can prove that a
fresh model loaded from the file predicts exactly what the saved one did.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from dlscope.errors import OS_CAUSES, CheckpointError, ConfigError, DlscopeError
from dlscope.events import EpochResult, TrainingObserver
from dlscope.fsutil import atomic_write_with, clean_stale_temps
from dlscope.phases import phase
from dlscope.restore import load_checkpoint, model_from_checkpoint
from dlscope.train import Trainer, evaluate, fingerprint


@dataclass
class SaveInfo:
    path: str
    bytes: int
    seconds: float
    stale_temps_removed: int


@dataclass
class VerifyResult:
    path: str
    samples: int
    predictions_identical: bool
    logits_max_abs_diff: float | None  # against the in-memory model, when given one
    accuracy_saved: float
    accuracy_loaded: float
    load_seconds: float

    @property
    def ok(self) -> bool:
        return self.predictions_identical and self.logits_max_abs_diff in (None, 0.0)


def portable_rng(state: dict[str, Any]) -> dict[str, Any]:
    """RNG states in types `torch.load(weights_only=True)` accepts (no numpy objects)."""
    out = dict(state)
    kind, keys, pos, has_gauss, cached = state["numpy"]
    out["numpy"] = {
        "kind": kind,
        "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
        "pos": int(pos),
        "has_gauss": int(has_gauss),
        "cached_gaussian": float(cached),
    }
    return out


def save_checkpoint(path: str | Path, state: dict[str, Any]) -> SaveInfo:
    """Write `state` with torch.save, atomically: temp file, fsync, rename, fsync directory."""
    path = Path(path)
    start = time.perf_counter()
    state = dict(state)
    if "rng" in state:
        state["rng"] = portable_rng(state["rng"])
    try:
        removed = clean_stale_temps(path.parent)
        atomic_write_with(path, lambda f: torch.save(state, f))
    except OSError as e:
        raise CheckpointError(f"cannot write checkpoint: {OS_CAUSES.get(e.errno, e.strerror or e)}", path) from None
    except DlscopeError as e:  # an OS fault atomic_write named: the same words, as a checkpoint error
        raise CheckpointError(f"cannot write checkpoint: {e.message.split(': ', 1)[-1]}", e.path) from None
    return SaveInfo(str(path), path.stat().st_size, time.perf_counter() - start, len(removed))


def verify_checkpoint(
    path: str | Path,
    images: torch.Tensor,
    labels: torch.Tensor,
    reference: nn.Module | None = None,
) -> VerifyResult:
    """Reload into a fresh model; its test predictions must equal the saved fingerprint's.

    With `reference` (the in-memory model that was saved), the logits must also be equal.
    """
    start = time.perf_counter()
    state = load_checkpoint(path)
    saved = state.get("fingerprint")
    if saved is None:
        raise CheckpointError("checkpoint has no prediction fingerprint to verify against", path)
    # a run trained with --test-subset N evaluated (and fingerprinted) the first N test images
    samples = state["config"].get("test_subset") or len(labels)
    if saved["samples"] != samples or samples > len(labels):
        raise CheckpointError(f"fingerprint covers {saved['samples']} test samples, {len(labels)} given", path)
    images, labels = images[:samples].cpu(), labels[:samples].cpu()  # where a fresh model is
    try:
        model = model_from_checkpoint(state)
    except (RuntimeError, KeyError, TypeError, AttributeError, ConfigError) as e:  # weights that do not fit
        first = str(e).strip().splitlines()[0][:160] if str(e).strip() else type(e).__name__
        raise CheckpointError(f"its weights do not load into a fresh model: {first}", path) from None
    load_seconds = time.perf_counter() - start
    loaded = evaluate(model, images, labels, keep_logits=True)
    now = fingerprint(loaded["predictions"], labels)
    diff = None
    if reference is not None:
        device = next(reference.parameters()).device
        saved_logits = evaluate(reference, images.to(device), labels.to(device), keep_logits=True)["logits"]
        diff = (saved_logits - loaded["logits"]).abs().max().item()
    return VerifyResult(
        path=str(path),
        samples=len(labels),
        predictions_identical=now["predictions_sha256"] == saved["predictions_sha256"],
        logits_max_abs_diff=diff,
        accuracy_saved=saved["accuracy"],
        accuracy_loaded=now["accuracy"],
        load_seconds=load_seconds,
    )


def verify_dict(result: VerifyResult) -> dict[str, Any]:
    return {**asdict(result), "ok": result.ok}


class CheckpointObserver(TrainingObserver):
    """Saves `last.pt` at every epoch end: resumable, with the fingerprint `verify` needs."""

    def __init__(self, directory: str | Path) -> None:
        self.path = Path(directory) / "last.pt"
        self.saves: list[SaveInfo] = []

    def on_epoch_end(self, trainer: Trainer, epoch: EpochResult) -> None:
        with phase("checkpoint_save"):  # --trace-io: the writes of each epoch's checkpoint
            self.saves.append(save_checkpoint(self.path, trainer.state_dict()))
