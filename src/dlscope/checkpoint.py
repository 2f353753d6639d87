"""Crash-safe checkpoints: save, load (weights_only), and verify by re-running the test set.

A checkpoint holds model, optimizer, scheduler, epoch, RNG states, config and history, plus a
fingerprint of the model's test-set predictions at save time, so `verify` can prove that a
fresh model loaded from the file predicts exactly what the saved one did.
"""

from __future__ import annotations

import re
import time
import warnings
import zipfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from dlscope.errors import OS_CAUSES, CheckpointError, ConfigError, DlscopeError
from dlscope.fsutil import atomic_write_with, clean_stale_temps
from dlscope.models import Layout, TunableCNN, build_model
from dlscope.phases import phase
from dlscope.train import EpochResult, Observer, Trainer, fingerprint


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


@torch.no_grad()
def predict(model: nn.Module, images: torch.Tensor, batch_size: int = 500) -> torch.Tensor:
    """Logits for normalised images, in eval mode, on the model's device, returned on CPU."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    out = torch.cat([model(images[i : i + batch_size].to(device)).cpu() for i in range(0, len(images), batch_size)])
    model.train(was_training)
    return out


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


def restore_rng(state: dict[str, Any]) -> dict[str, Any]:
    out = dict(state)
    n = state["numpy"]
    out["numpy"] = (n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached_gaussian"])
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


ZIP_MAGIC = b"PK\x03\x04"  # torch.save ≥ 1.6
PICKLE_PROTO = 0x80  # the legacy torch.save format and plain pickles start with the PROTO opcode


def check_torch_file(path: Path) -> None:
    """Refuse, in words, what torch.load would fail on with a traceback: not a file, empty, text,
    neither zip nor pickle, or a zip cut short before its central directory."""
    if path.is_dir():
        raise CheckpointError("is a directory, not a checkpoint file", path)
    if not path.exists():
        raise CheckpointError("checkpoint not found", path)
    try:
        with path.open("rb") as f:
            head = f.read(512)
    except OSError as e:
        raise CheckpointError(f"cannot read: {e.strerror or e}", path) from None
    if not head:
        raise CheckpointError("empty file, not a checkpoint", path)
    if head.startswith(ZIP_MAGIC):
        if not zipfile.is_zipfile(path):
            raise CheckpointError("not a loadable checkpoint: a zip cut short (no central directory)", path)
        return
    if head[0] == PICKLE_PROTO:
        return
    kind = "a text file" if head.isascii() and all(b >= 0x20 or b in b"\t\n\r" for b in head) else "unknown bytes"
    raise CheckpointError(f"not a PyTorch checkpoint ({kind}, neither a torch zip nor a pickle)", path)


def refusal(e: Exception) -> str:
    """torch.load's failure in one line of our own: what it could not read, never its advice to
    retry with weights_only=False (that runs whatever code the file holds)."""
    unpickler = re.search(r"WeightsUnpickler error:\s*([^\n]+)", str(e))
    if unpickler:
        what = unpickler.group(1).split(". Please use")[0].strip()  # the rest is torch's advice
        return f"the safe loader refused it ({what}); `dlscope ckpt scan` says whether it would run code"
    first = str(e).strip().splitlines()[0][:120] if str(e).strip() else ""
    return f"torch.load cannot read it ({type(e).__name__}{': ' + first if first else ''})"


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Load with `weights_only=True` (no arbitrary code); faults become one-line errors. A DCP
    directory (--ckpt-format dcp) gives its trainer state, its tensors named by "dcp"."""
    path = Path(path)
    if path.is_dir() and (path / ".metadata").exists():
        from dlscope.distributed.dcp import load_dcp

        return load_dcp(path)
    check_torch_file(path)
    try:
        with warnings.catch_warnings():  # its notes on pickle protocols are not the user's concern
            warnings.simplefilter("ignore")
            state = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:  # any garbage reaches the unpickler, which fails in any way (IndexError, KeyError…)
        raise CheckpointError(f"not a loadable checkpoint: {refusal(e)}", path) from None
    if not isinstance(state, dict) or "model" not in state or "config" not in state:
        raise CheckpointError("not a dlscope checkpoint (no 'model' and 'config' entries)", path)
    if "rng" in state:
        state["rng"] = restore_rng(state["rng"])
    return state


def model_from_checkpoint(state: dict[str, Any]) -> nn.Module:
    model = build_model(state["config"]["model"])
    if "dcp" in state:  # a DCP directory's weights, however many ranks wrote them
        from dlscope.distributed.dcp import restore_weights

        restore_weights(state["dcp"], model)
    else:
        model.load_state_dict(state["model"])
    if "layout" in state and isinstance(model, TunableCNN):  # as trained (--autotune): the same predictions
        model.set_layout(Layout.from_dict(state["layout"]))
    return model


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
    images, labels = images[:samples], labels[:samples]
    try:
        model = model_from_checkpoint(state)
    except (RuntimeError, KeyError, TypeError, AttributeError, ConfigError) as e:  # weights that do not fit
        first = str(e).strip().splitlines()[0][:160] if str(e).strip() else type(e).__name__
        raise CheckpointError(f"its weights do not load into a fresh model: {first}", path) from None
    load_seconds = time.perf_counter() - start
    logits = predict(model, images)
    now = fingerprint(logits.argmax(1), labels)
    diff = None
    if reference is not None:
        diff = (predict(reference, images) - logits).abs().max().item()
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


class CheckpointObserver(Observer):
    """Saves `last.pt` at every epoch end: resumable, with the fingerprint `verify` needs."""

    def __init__(self, directory: str | Path) -> None:
        self.path = Path(directory) / "last.pt"
        self.saves: list[SaveInfo] = []

    def on_epoch_end(self, trainer: Trainer, epoch: EpochResult) -> None:
        with phase("checkpoint_save"):  # --trace-io: the writes of each epoch's checkpoint
            self.saves.append(save_checkpoint(self.path, trainer.state_dict()))
