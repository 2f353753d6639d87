"""Keras files: legacy HDF5 (`model.save("m.h5")`, `save_weights`) and Keras 3 `.keras` zips.

HDF5 is read with h5py (never Keras: `load_model` deserialises layers and Lambda code). The
`.keras` zip's `model.weights.h5` member is opened in place through a window on the file, so
dataset offsets are real file offsets and nothing is copied.
"""

from __future__ import annotations

import functools
import io
import json
import re
import zipfile
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from dlscope.ckpt.anatomy import Anatomy, TensorEntry
from dlscope.ckpt.zipdir import Member, members
from dlscope.errors import CheckpointError
from dlscope.findings import Finding

MAX_OBJECTS = 100_000  # HDF5 groups + datasets walked
MAX_JSON = 64 << 20  # config.json / metadata.json read into memory
LAYER_KEYS = (
    "units",
    "activation",
    "rate",
    "filters",
    "kernel_size",
    "strides",
    "padding",
    "pool_size",
    "use_bias",
    "batch_shape",
    "batch_input_shape",
    "target_shape",
)


def _h5py():
    try:
        import h5py
    except ImportError:
        return None
    return h5py


class Window(io.RawIOBase):
    """A read-only file object over bytes [start, start + size) of another file."""

    def __init__(self, f: BinaryIO, start: int, size: int) -> None:
        self.f, self.start, self.size, self.pos = f, start, size, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, pos: int, whence: int = 0) -> int:
        self.pos = {0: pos, 1: self.pos + pos, 2: self.size + pos}[whence]
        return self.pos

    def tell(self) -> int:
        return self.pos

    def readinto(self, buffer: Any) -> int:
        n = max(0, min(len(buffer), self.size - self.pos))
        self.f.seek(self.start + self.pos)
        data = self.f.read(n)
        buffer[: len(data)] = data
        self.pos += len(data)
        return len(data)


def _attr(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, np.ndarray):
        return [_attr(v) for v in value.tolist()]
    if isinstance(value, np.generic):
        return value.item()
    return value


def _json_attr(text: Any) -> Any:
    try:
        return json.loads(text) if isinstance(text, str) else None
    except json.JSONDecodeError:
        return None


def architecture_from_config(config: Any) -> dict[str, Any] | None:
    """model_config → the layer list the seed prints: class, name, the config keys that shape it."""
    if not isinstance(config, dict):
        return None
    inner = config.get("config") if isinstance(config.get("config"), dict) else {}
    layers = inner.get("layers") if isinstance(inner.get("layers"), list) else []
    out = []
    for layer in layers:
        if not isinstance(layer, dict):
            continue
        cfg = layer.get("config") if isinstance(layer.get("config"), dict) else {}
        out.append(
            {
                "class_name": str(layer.get("class_name", "?")),
                "name": str(cfg.get("name", "")),
                "config": {k: cfg[k] for k in LAYER_KEYS if k in cfg},
            }
        )
    return {"class_name": str(config.get("class_name", "?")), "source": "model_config", "layers": out}


def training_from_config(config: Any) -> dict[str, Any] | None:
    """training_config (legacy .h5) or compile_config (.keras) → loss, metrics, optimizer and its hyperparameters."""
    if not isinstance(config, dict):
        return None
    optimizer = config.get("optimizer_config") or config.get("optimizer")
    out = {"loss": config.get("loss"), "metrics": config.get("metrics")}
    if isinstance(optimizer, dict):
        out["optimizer"] = optimizer.get("class_name")
        out["optimizer_config"] = optimizer.get("config")
    elif optimizer is not None:
        out["optimizer"] = optimizer
    return out


def _role_and_group(parts: list[str]) -> tuple[str, str]:
    top = parts[0]
    if top in ("optimizer_weights", "optimizer"):
        return "optimizer", ""
    if top in ("model_weights", "layers") and len(parts) > 2:
        return "parameter", parts[1]
    return "parameter", top if len(parts) > 1 else ""


def _read_dataset(path: Path, base: int, size: int, name: str):  # -> torch.Tensor
    import torch  # only --stats reads tensor data: inspecting the layout needs no torch

    h5py = _h5py()
    with open(path, "rb") as f, h5py.File(Window(f, base, size), "r") as h5:
        return torch.from_numpy(np.ascontiguousarray(h5[name][()]))


def _group_optimizer_slots(tensors: list[TensorEntry]) -> None:
    """Legacy .h5 names slots after their variable (`adam/sequential_dense_1_kernel_momentum`): give each
    the layer whose name it contains, the longest match winning (dense_1 over dense)."""
    layers = sorted({t.group for t in tensors if t.role == "parameter" and t.group}, key=len, reverse=True)
    for t in tensors:
        if t.role == "optimizer" and not t.group:
            slot = t.name.rsplit("/", 1)[-1]
            t.group = next((g for g in layers if re.search(rf"(^|_){re.escape(g)}_", slot)), "")


# Keras 3 slot names per optimizer class, in the order add_optimizer_variables creates them
SLOT_NAMES = {
    "Adam": ("momentum", "velocity"),
    "AdamW": ("momentum", "velocity"),
    "Adamax": ("momentum", "norm"),
    "Nadam": ("momentum", "velocity"),
    "RMSprop": ("velocity",),
    "Adagrad": ("accumulator",),
}


def map_keras3_optimizer(anatomy: Anatomy) -> None:
    """Keras 3 names optimizer variables `optimizer/vars/N` only. After the scalars (iterations,
    learning rate) come the slots, one set per trainable variable in model order: interleaved
    (m0 v0 m1 v1 …, Keras ≥ 3.10) or blocked (m0 m1 … v0 v1 …, earlier). The arrangement whose
    shapes all match is used; each slot gets its variable's layer; layout["variable_map"] says which."""
    params = [t for t in anatomy.tensors if t.role == "parameter" and re.match(r"(layers/.+/)?vars/\d+$", t.name)]
    slots = [t for t in anatomy.tensors if t.role == "optimizer" and t.name.startswith("optimizer/vars/") and t.shape]
    if not params or not slots or len(slots) % len(params):
        return
    per = len(slots) // len(params)
    arrangements = (
        [(i // per, i % per) for i in range(len(slots))],  # interleaved
        [(i % len(params), i // len(params)) for i in range(len(slots))],  # blocked
    )
    match = next(
        (a for a in arrangements if all(slots[i].shape == params[p].shape for i, (p, _) in enumerate(a))), None
    )
    if match is None:
        anatomy.findings.append(Finding("ckpt.optimizer_unmatched", "info"))
        return
    optimizer = (anatomy.training or {}).get("optimizer")
    names = SLOT_NAMES.get(optimizer if isinstance(optimizer, str) else "", ())
    mapping = []
    for slot, (p, k) in zip(slots, match, strict=True):
        slot.group = params[p].group
        name = names[k] if k < len(names) else f"slot {k}"
        variable = params[p].name.removeprefix(f"layers/{slot.group}/")
        mapping.append({"tensor": slot.name, "layer": slot.group, "variable": variable, "slot": name})
    anatomy.layout["variable_map"] = mapping


def _walk_h5(path: Path, f: BinaryIO, base: int, size: int, where: str, anatomy: Anatomy) -> None:
    """Groups, attributes and datasets of the HDF5 image at bytes [base, base + size) of the file."""
    h5py = _h5py()
    if h5py is None:
        raise CheckpointError("HDF5 file: reading it needs h5py (pip install h5py), which is not importable", path)
    try:
        h5 = h5py.File(Window(f, base, size), "r")
    except (OSError, ValueError) as e:
        raise CheckpointError(f"unreadable HDF5 ({where}): {str(e).splitlines()[0]}", path) from None
    groups: list[dict[str, Any]] = []
    with h5:
        try:
            root_attrs = {k: _attr(v) for k, v in h5.attrs.items()}
            objects: list[tuple[str, Any]] = []

            def visit(name: str, obj: Any) -> None:
                if len(objects) >= MAX_OBJECTS:
                    raise CheckpointError(f"more than {MAX_OBJECTS:,} HDF5 objects", path)
                objects.append((name, obj))

            h5.visititems(visit)
            for name, obj in objects:
                attrs = {k: _attr(v) for k, v in obj.attrs.items()}
                if isinstance(obj, h5py.Group):
                    groups.append({"path": name, "attributes": {k: str(v)[:120] for k, v in attrs.items()}})
                    continue
                # numeric datasets: numpy's dtype names are torch's (float32, int64, bool, …)
                dtype = obj.dtype.name if obj.dtype.kind in "fiub" else None
                shape = list(obj.shape)
                numel = int(np.prod(shape, dtype=np.int64)) if shape else 1
                offset = obj.id.get_offset()
                role, group = _role_and_group(name.split("/"))

                anatomy.tensors.append(
                    TensorEntry(
                        name=name,
                        dtype=dtype or str(obj.dtype),
                        shape=shape,
                        numel=numel,
                        nbytes=numel * obj.dtype.itemsize,
                        storage=name,
                        storage_bytes=obj.id.get_storage_size(),
                        offset=base + offset if offset is not None else None,
                        role=role,
                        group=group,
                        read=functools.partial(_read_dataset, path, base, size, name) if dtype else None,
                    )
                )
        except (OSError, KeyError, RuntimeError, ValueError, TypeError) as e:
            raise CheckpointError(f"corrupt HDF5 ({where}): {str(e).splitlines()[0]}", path) from None
    anatomy.layout.setdefault("hdf5", []).append(
        {"where": where, "root_attributes": {k: str(v)[:120] for k, v in root_attrs.items()}, "groups": groups}
    )
    _group_optimizer_slots(anatomy.tensors)
    for key in ("keras_version", "backend"):
        if key in root_attrs:
            anatomy.metadata[key] = root_attrs[key]
    model_config = _json_attr(root_attrs.get("model_config"))
    if model_config is not None:
        anatomy.architecture = architecture_from_config(model_config)
        anatomy.layout["model_config"] = model_config
    training_config = _json_attr(root_attrs.get("training_config"))
    if training_config is not None:
        anatomy.training = training_from_config(training_config)
        anatomy.layout["training_config"] = training_config


def inspect_hdf5(path: Path, f: BinaryIO, file_bytes: int) -> Anatomy:
    anatomy = Anatomy(str(path), "HDF5", file_bytes)
    _walk_h5(path, f, 0, file_bytes, path.name, anatomy)
    map_keras3_optimizer(anatomy)
    if anatomy.architecture is not None:
        anatomy.format = "Keras HDF5 model (model.save .h5)"
    elif anatomy.metadata.get("keras_version") or any(
        g["path"] == "layers" for g in anatomy.layout["hdf5"][0]["groups"]
    ):
        anatomy.format = "Keras HDF5 weights"
    return anatomy


def _read_json(path: Path, zf: Any, member: Member) -> Any:
    if member.size > MAX_JSON:
        raise CheckpointError(f"{member.name} is {member.size:,} bytes, over the {MAX_JSON:,}-byte limit", path)
    try:
        return json.loads(zf.read(member.name))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{member.name} is not JSON: {e}", path) from None


def inspect_keras_zip(path: Path, f: BinaryIO, zf: zipfile.ZipFile, file_bytes: int) -> Anatomy:
    ms = {m.name: m for m in members(path, f, zf, file_bytes)}
    anatomy = Anatomy(str(path), "Keras v3 (.keras zip)", file_bytes)
    anatomy.layout["zip_members"] = [m.to_dict() for m in ms.values()]
    if "metadata.json" in ms:
        metadata = _read_json(path, zf, ms["metadata.json"])
        anatomy.metadata.update(metadata if isinstance(metadata, dict) else {"metadata.json": metadata})
    config = _read_json(path, zf, ms["config.json"])
    anatomy.layout["model_config"] = config
    anatomy.architecture = architecture_from_config(config)
    compile_config = config.get("compile_config") if isinstance(config, dict) else None
    anatomy.training = training_from_config(compile_config)
    weights = ms.get("model.weights.h5")
    if weights is None:
        anatomy.findings.append(Finding("ckpt.no_weights", "warn"))
        return anatomy
    if weights.compression != "stored":
        raise CheckpointError("model.weights.h5 is compressed in the zip; Keras stores it uncompressed", path)
    _walk_h5(path, f, weights.data_offset, weights.size, "model.weights.h5", anatomy)
    map_keras3_optimizer(anatomy)
    return anatomy
