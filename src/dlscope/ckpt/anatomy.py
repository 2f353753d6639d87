"""What every format reader produces: the tensor table, findings (dlscope.findings: facts, each with
the `where` it cites; worded in report/sections/ckpt_anatomy.py), and the totals built from them."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dlscope.findings import Finding

if TYPE_CHECKING:
    import torch

ROLES = ("parameter", "buffer", "optimizer", "scheduler", "rng", "other")
# top-level keys of torch checkpoints (ours, Lightning's, the usual hand-rolled ones) → role of their tensors
ROLE_KEYS = {
    "parameter": ("model", "state_dict", "model_state_dict", "model_state", "module", "net"),
    "optimizer": ("optimizer", "optimizer_state_dict", "optimizer_states", "optim"),
    "scheduler": ("scheduler", "lr_scheduler", "lr_schedulers", "scheduler_state_dict"),
    "rng": ("rng", "rng_state", "rng_states"),
}
ROLE_OF_KEY = {key: role for role, keys in ROLE_KEYS.items() for key in keys}
# state_dict entries that are buffers, not parameters (a state dict does not say which is which)
BUFFER_NAMES = ("running_mean", "running_var", "num_batches_tracked")


@dataclass
class TensorEntry:
    name: str
    dtype: str
    shape: list[int]
    numel: int
    nbytes: int  # this tensor's elements
    storage: str  # storage key, zip member or dataset path
    storage_bytes: int  # the whole storage the tensor is a view of
    offset: int | None  # file offset of the storage's first byte (None: not contiguous in the file)
    role: str = "other"
    group: str = ""
    stats: dict[str, Any] | None = None
    device: str = ""  # where torch.save found the storage (cpu, cuda:0 …); empty for other formats
    read: Callable[[], torch.Tensor] | None = field(default=None, repr=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "read"}


@dataclass
class Anatomy:
    path: str
    format: str
    file_bytes: int
    layout: dict[str, Any] = field(default_factory=dict)
    architecture: dict[str, Any] | None = None
    training: dict[str, Any] | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    tensors: list[TensorEntry] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    # False when some global in a pickle is off the allow-list: torch.load could run code
    safe_to_load: bool = True
    # tensors whose bytes fail their stored checksum (TF bundles' CRC32C, checked with --stats)
    corrupt: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "format": self.format,
            "file_bytes": self.file_bytes,
            "safe_to_load": self.safe_to_load,
            "corrupt": self.corrupt,
            "findings": [f.to_json() for f in self.findings],
            "layout": self.layout,
            "architecture": self.architecture,
            "training": self.training,
            "metadata": self.metadata,
            "totals": totals(self),
            "by_role": by_role(self.tensors),
            "by_group": by_group(self.tensors),
            "shared_storages": shared_storages(self.tensors),
            "tensors": [t.to_dict() for t in self.tensors],
        }


def dtype_name(dtype: object) -> str:
    """`torch.float32` or the name a reader kept (`float32`) → float32."""
    return str(dtype).removeprefix("torch.")


def role_for_path(path: list[str], only_tensors: bool) -> str:
    """Role from where a tensor sits: the top-level key, or a bare state dict's entry name."""
    key = path[0] if path else ""
    role = ROLE_OF_KEY.get(key)
    if role is None and "rng" in key.lower():
        role = "rng"
    if role is None and only_tensors:
        role = "parameter"  # a bare state dict: {name: tensor}
    if role == "parameter" and path and path[-1] in BUFFER_NAMES:
        return "buffer"
    return role or "other"


def storage_totals(tensors: list[TensorEntry]) -> int:
    """Bytes of distinct storages: what the file holds for these tensors."""
    return sum({t.storage: t.storage_bytes for t in tensors}.values())


def totals(anatomy: Anatomy) -> dict[str, Any]:
    stored = storage_totals(anatomy.tensors)
    return {
        "tensors": len(anatomy.tensors),
        "elements": sum(t.numel for t in anatomy.tensors),
        "tensor_bytes": sum(t.nbytes for t in anatomy.tensors),
        "storages": len({t.storage for t in anatomy.tensors}),
        "storage_bytes": stored,
        "overhead_bytes": anatomy.file_bytes - stored,
    }


def by_role(tensors: list[TensorEntry]) -> list[dict[str, Any]]:
    rows = []
    for role in ROLES:
        members = [t for t in tensors if t.role == role]
        if members:
            elements, nbytes = sum(t.numel for t in members), sum(t.nbytes for t in members)
            rows.append({"role": role, "tensors": len(members), "elements": elements, "bytes": nbytes})
    return rows


def by_group(tensors: list[TensorEntry]) -> list[dict[str, Any]]:
    """Bytes per module / layer, split by role, in the order the layers first appear."""
    groups: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for t in tensors:
        if t.group:
            groups[t.group][t.role] += t.nbytes
    return [{"group": g, **dict(roles), "bytes": sum(roles.values())} for g, roles in groups.items()]


def shared_storages(tensors: list[TensorEntry]) -> list[dict[str, Any]]:
    """Storages several tensors view, and single views that drag a larger storage into the file."""
    users: dict[str, list[TensorEntry]] = defaultdict(list)
    for t in tensors:
        users[t.storage].append(t)
    out = []
    for storage, ts in users.items():
        used = sum(t.nbytes for t in ts)
        if len(ts) > 1 or used < ts[0].storage_bytes:
            names = [t.name for t in ts]
            out.append(
                {"storage": storage, "storage_bytes": ts[0].storage_bytes, "tensors": names, "viewed_bytes": used}
            )
    return out
