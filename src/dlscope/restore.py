"""Reading training state back from a path: a torch file (`last.pt`) or a DCP directory (`last.dcp`).

The one place that knows which kind a path is. The engine (Trainer.load_state_dict) and a fresh
model take in-memory state only: `in_memory` reads a DCP directory's tensors into them first.
"""

from __future__ import annotations

import contextlib
import re
import warnings
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from dlscope.ckpt.dcp_fmt import checked, is_dcp_dir
from dlscope.ckpt.sniff import PICKLE_PROTO, sniff
from dlscope.errors import CheckpointError
from dlscope.models import Layout, TunableCNN, build_model

TRAINER_FILE = "trainer.pt"  # in a DCP directory: what is not a model or optimizer tensor


@contextlib.contextmanager
def one_process_is_intended() -> Iterator[None]:
    """Without a process group DCP warns that it assumes one process: that is what we mean."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
        yield


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
    if sniff(head) == "zip":
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


def restore_rng(state: dict[str, Any]) -> dict[str, Any]:
    """The inverse of dlscope.checkpoint.portable_rng: numpy's state as numpy wants it."""
    out = dict(state)
    n = state["numpy"]
    out["numpy"] = (n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached_gaussian"])
    return out


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Load with `weights_only=True` (no arbitrary code); faults become one-line errors. A DCP
    directory (--ckpt-format dcp) gives its trainer state, its tensors named by "dcp"."""
    path = Path(path)
    if is_dcp_dir(path):
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


def load_dcp(path: str | Path) -> dict[str, Any]:
    """A DCP checkpoint's non-tensor state, with "dcp" naming the directory its tensors stay in
    (they are read into a model and optimizer of any world size by `in_memory`)."""
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


def read_dcp_tensors(path: str | Path, model: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> None:
    """Read model (and optimizer) tensors in place: every rank reads what it needs (collective when
    a process group exists), whichever world size saved them."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_state_dict,
        set_model_state_dict,
        set_state_dict,
    )

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


def in_memory(
    state: dict[str, Any], model: nn.Module, optimizer: torch.optim.Optimizer | None = None
) -> dict[str, Any]:
    """`state` with its "model" (and "optimizer") as in-memory state dicts: a DCP directory's
    tensors are read through `model` and `optimizer` (DCP needs their shapes as templates)."""
    if "dcp" not in state:
        return state
    read_dcp_tensors(state["dcp"], model, optimizer)
    out = {k: v for k, v in state.items() if k != "dcp"}
    out["model"] = model.state_dict()
    if optimizer is not None:
        out["optimizer"] = optimizer.state_dict()
    return out


def model_from_checkpoint(state: dict[str, Any]) -> nn.Module:
    """A fresh model holding the checkpoint's weights, in the layout it was trained in (--autotune),
    so that it predicts what the saved one did."""
    model = build_model(state["config"]["model"])
    model.load_state_dict(in_memory(state, model)["model"])
    if "layout" in state and isinstance(model, TunableCNN):
        model.set_layout(Layout.from_dict(state["layout"]))
    return model


def resume(trainer: Any, path: str | Path) -> dict[str, Any]:
    """Load `path` into `trainer` (a dlscope.train.Trainer) and return the state it resumed from."""
    state = in_memory(load_checkpoint(path), trainer.model, trainer.optimizer)
    trainer.load_state_dict(state)
    return state
