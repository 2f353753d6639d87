"""torch.save files — the zip format (≥ 1.6), the legacy stream (< 1.6) and bare pickles — read
without torch.load: the pickle goes through the restricted unpickler, tensor bytes stay on disk."""

from __future__ import annotations

import struct
import zipfile
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from dlscope.ckpt.anatomy import Anatomy, TensorEntry, dtype_name, role_for_path
from dlscope.ckpt.filemap import mapped_tensor
from dlscope.ckpt.pickle_scan import scan_pickle
from dlscope.ckpt.pickle_values import DType, Opaque, PickleScan, ScanError, StorageRef, TensorRef
from dlscope.ckpt.scan import MAX_PICKLE_BYTES
from dlscope.ckpt.zipdir import Member, MemberError, member_chunks, member_crc_ok, members
from dlscope.errors import CheckpointError
from dlscope.findings import Finding

if TYPE_CHECKING:
    import torch

MAX_NODES = 1_000_000  # objects walked in the unpickled tree (shared references make a DAG, not a bomb)
MAX_DEPTH = 64  # a deeper container is one metadata entry: paths stay short, the walk stays linear
MAX_METADATA = 200  # scalar entries listed
LONG_SEQUENCE = 16  # longer sequences of scalars are one metadata entry
SCALARS = (bool, int, float, str, bytes, type(None))
MODULE_KEYS = {"_modules", "_parameters", "_buffers"}  # nn.Module's own dicts, not names


def read_storage(path: Path, offset: int, nbytes: int, ref: TensorRef) -> torch.Tensor:
    """The tensor's elements, read from its storage's bytes at `offset` in the file, as the view it is."""
    import torch  # only --stats and diff read tensor data: inspecting the layout needs no torch

    flat = mapped_tensor(path, offset, nbytes, getattr(torch, ref.dtype))
    return flat.as_strided(ref.shape, ref.stride, ref.offset)


def view_in_bounds(ref: TensorRef, storage_numel: int) -> bool:
    if ref.numel == 0:
        return True
    if any(d < 0 for d in ref.shape) or any(s < 0 for s in ref.stride) or ref.offset < 0:
        return False
    last = ref.offset + sum((d - 1) * s for d, s in zip(ref.shape, ref.stride, strict=False))
    return len(ref.shape) == len(ref.stride) and last < storage_numel


def walk(root: Any) -> Iterator[tuple[list[str], Any]]:
    """Every (path, leaf) of the unpickled tree, depth-first in pickle order; each container once."""
    stack: list[tuple[list[str], Any]] = [([], root)]
    seen: set[int] = set()
    nodes = 0
    while stack:
        path, obj = stack.pop()
        nodes += 1
        if nodes > MAX_NODES:
            raise ScanError(f"more than {MAX_NODES:,} objects in the pickle")
        children: list[tuple[str, Any]] | None = None
        if len(path) >= MAX_DEPTH:
            yield path, f"<nested deeper than {MAX_DEPTH} levels>"
            continue
        if isinstance(obj, dict):
            children = [(str(k), v) for k, v in obj.items()]
        elif isinstance(obj, list | tuple | set | frozenset):
            if len(obj) > LONG_SEQUENCE and all(isinstance(v, SCALARS) for v in obj):
                yield path, obj  # a Python RNG state's 625 ints: one metadata entry, not 625
                continue
            children = [(str(i), v) for i, v in enumerate(obj)]
        elif isinstance(obj, Opaque):  # what an unknown class was called with, its state, its entries
            children = [(f"<{obj.qualname}>", obj.args)] if obj.args else []
            children += [(f"<{obj.qualname}>", obj.state)] if obj.state is not None else []
            children += [(str(i), v) for i, v in enumerate(obj.items)]
        if children is None or (isinstance(obj, Opaque) and not children):
            yield path, obj
            continue
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        stack.extend(([*path, k], v) for k, v in reversed(children))


def short(value: Any, limit: int = 80) -> Any:
    if isinstance(value, bool | int | float) or value is None:
        return value
    if isinstance(value, list | tuple | set | frozenset) and len(value) > LONG_SEQUENCE:
        return f"{type(value).__name__} of {len(value):,} scalars"
    text = repr(value) if not isinstance(value, str) else value
    return text if len(text) <= limit else text[: limit - 1] + "…"


def record_pickle(anatomy: Anatomy, scan: PickleScan, where: str) -> None:
    """The pickle's census in the layout; each name off the allow-list is a finding, at its first use."""
    calls = Counter(e.name for e in scan.events if e.call)
    anatomy.layout.setdefault("pickles", []).append(
        {
            "where": where,
            "protocol": scan.protocol,
            "opcodes": scan.opcodes,
            "bytes": scan.nbytes,
            "globals": sorted({e.name for e in scan.imports}),
            "calls": dict(calls.most_common()),
        }
    )
    flagged: set[str] = set()
    for e in scan.unsafe_events:
        if e.subject not in flagged:  # `X.__setstate__`, `X(…)`: uses of X, flagged once
            flagged.add(e.subject)
            facts = {"opcode": e.opcode, "name": e.name, "where": f"{where} @ byte {e.position}"}
            anatomy.findings.append(Finding("ckpt.off_allow_list", "bad", facts))
            anatomy.safe_to_load = False


def build_anatomy(
    anatomy: Anatomy,
    scan: PickleScan,
    where: str,
    locate: Callable[[StorageRef], tuple[int | None, int]],
    reader: Callable[[TensorRef, int | None, int], Callable[[], torch.Tensor]],
) -> None:
    """Fill the anatomy from a scanned pickle: tensors with roles and groups, metadata, findings.

    `locate(storage)` gives the storage's file offset and byte size; `reader` makes a lazy loader.
    """
    record_pickle(anatomy, scan, where)
    leaves = list(walk(scan.root))
    only_tensors = isinstance(scan.root, dict) and all(isinstance(v, TensorRef) for _, v in leaves)
    parameters: list[TensorEntry] = []
    module_classes: dict[str, str] = {}
    for path, obj in leaves:
        name = ".".join(path) or "<root>"
        if not isinstance(obj, TensorRef):
            if len(anatomy.metadata) < MAX_METADATA:
                anatomy.metadata[name] = short(obj)
            continue
        offset, storage_bytes = locate(obj.storage)
        itemsize = obj.dtype.itemsize
        if not view_in_bounds(obj, storage_bytes // itemsize if itemsize else 0):
            facts = {"storage": obj.storage.key, "where": name}
            anatomy.findings.append(Finding("ckpt.view_outside_storage", "bad", facts))
        module = module_tensor(path)
        if module is not None:  # a whole pickled nn.Module: name it as its state_dict would
            name, role, group, module_classes[group] = module
        else:
            parts = name.split(".")  # state_dict keys are dotted module paths themselves
            role = role_for_path(parts, only_tensors)
            inner = parts[1:] if not only_tensors else parts
            group = ".".join(inner[:-1]) if role in ("parameter", "buffer") else ""
        entry = TensorEntry(
            name=name,
            dtype=dtype_name(obj.dtype),
            shape=list(obj.shape),
            numel=obj.numel,
            nbytes=obj.numel * itemsize,
            storage=obj.storage.key,
            storage_bytes=storage_bytes,
            offset=offset,
            role=role,
            group=group,
            device=obj.storage.location,
            read=reader(obj, offset, storage_bytes),
        )
        if role == "parameter":
            parameters.append(entry)
        anatomy.tensors.append(entry)
    devices = sorted({t.device for t in anatomy.tensors if t.device and t.device != "cpu"})
    if devices:
        anatomy.findings.append(Finding("ckpt.device_storages", "info", {"devices": devices, "where": where}))
    _group_optimizer_state(anatomy.tensors, parameters)
    anatomy.architecture = _architecture(scan.root, anatomy.tensors, module_classes)
    anatomy.training = _training(scan.root)


def _group_optimizer_state(tensors: list[TensorEntry], parameters: list[TensorEntry]) -> None:
    """`optimizer.state.3.exp_avg` belongs to the 4th parameter: torch numbers optimizer state in the order
    the parameters were given, which is the state dict's order minus its buffers for `model.parameters()`."""
    for t in tensors:
        parts = t.name.split(".")
        if t.role != "optimizer" or "state" not in parts:
            continue
        i = parts.index("state")
        if i + 1 < len(parts) and parts[i + 1].isdigit() and int(parts[i + 1]) < len(parameters):
            t.group = parameters[int(parts[i + 1])].group


def module_tensor(path: list[str]) -> tuple[str, str, str, str] | None:
    """A tensor inside a pickled nn.Module (`torch.save(model)`): its state_dict name, role, layer, class.

    The walk names it `<…Sequential>._modules.0.<…Linear>._parameters.weight`; the module's own
    bookkeeping keys and the class markers drop out, leaving `0.weight`.
    """
    kind = next((p for p in reversed(path) if p in ("_parameters", "_buffers")), None)
    if kind is None:
        return None
    kept = [p for p in path if not p.startswith("<") and p not in MODULE_KEYS]
    i = len(path) - 1 - path[::-1].index(kind)
    owner = path[i - 1][1:-1].rsplit(".", 1)[-1] if i > 0 and path[i - 1].startswith("<") else ""
    return ".".join(kept), "parameter" if kind == "_parameters" else "buffer", ".".join(kept[:-1]), owner


def _architecture(root: Any, tensors: list[TensorEntry], classes: dict[str, str]) -> dict[str, Any] | None:
    layers: dict[str, list[str]] = {}
    for t in tensors:
        if t.role in ("parameter", "buffer"):
            layers.setdefault(t.group, []).append(f"{t.name.rsplit('.', 1)[-1]} {tuple(t.shape)}")
    if not layers:
        return None
    config = root.get("config") if isinstance(root, dict) else None
    name = config.get("model") if isinstance(config, dict) else None
    if classes:
        source = "modules"
        name = root.qualname.rsplit(".", 1)[-1] if isinstance(root, Opaque) else None
    else:
        source = "config" if name else "names"
    return {
        "class_name": short(name) if name else "state dict",
        "source": source,
        "layers": [{"name": g, "class_name": classes.get(g, ""), "tensors": ts} for g, ts in layers.items()],
    }


def _training(root: Any) -> dict[str, Any] | None:
    """Optimizer hyperparameters from its param_groups, the scheduler's scalars, a run config's scalars."""
    if not isinstance(root, dict):
        return None
    out: dict[str, Any] = {}
    for key in ("optimizer", "optimizer_state_dict", "optimizer_states"):
        opt = root.get(key)
        opt = opt[0] if isinstance(opt, list) and opt else opt
        if isinstance(opt, dict) and isinstance(opt.get("param_groups"), list):
            groups = opt["param_groups"]
            out["optimizer_param_groups"] = [
                {k: short(v) for k, v in g.items() if k != "params"} for g in groups if isinstance(g, dict)
            ]
    for key in ("scheduler", "lr_scheduler", "lr_schedulers"):
        sched = root.get(key)
        sched = sched[0] if isinstance(sched, list) and sched else sched
        if isinstance(sched, dict):
            out["scheduler"] = {k: short(v) for k, v in sched.items() if isinstance(v, int | float | str)}
    config = root.get("config") or root.get("hyper_parameters")
    if isinstance(config, dict):
        out["config"] = {k: short(v) for k, v in config.items() if isinstance(v, int | float | str | bool)}
    return out or None


def _scan(path: Path, data: bytes, where: str, start: int = 0) -> PickleScan:
    scan = scan_pickle(data, start)
    if scan.error:
        raise CheckpointError(f"{where}: the stream breaks @ {scan.end} ({scan.error})", path)
    return scan


def inspect_torch_zip(path: Path, f: BinaryIO, zf: zipfile.ZipFile, file_bytes: int, check: bool) -> Anatomy:
    ms = members(path, f, zf, file_bytes)
    by_name = {m.name: m for m in ms}
    pickles = [m for m in ms if m.name.endswith("data.pkl") and m.name.count("/") == 1]
    if not pickles:
        raise CheckpointError("zip without a <root>/data.pkl: not a torch.save file", path)
    pkl = pickles[0]
    prefix = pkl.name.rsplit("/", 1)[0]
    if pkl.size > MAX_PICKLE_BYTES:
        raise CheckpointError(f"{pkl.name} is {pkl.size:,} bytes, over the {MAX_PICKLE_BYTES:,}-byte limit", path)
    infos = zf.infolist()  # members() lists them in this order

    def read(m: Member, limit: int) -> bytes:
        """A member's bytes, never more than its declared size: a member that inflates past it is refused."""
        try:
            data = b"".join(member_chunks(f, infos[ms.index(m)], m.data_offset, limit + 1))
        except MemberError as e:
            raise CheckpointError(f"{m.name} cannot be decompressed: {e}", path) from None
        if len(data) > limit:
            raise CheckpointError(f"{m.name} inflates past its declared {limit:,} bytes", path)
        return data

    data = read(pkl, pkl.size)
    anatomy = Anatomy(str(path), "torch zip (torch.save ≥ 1.6)", file_bytes)
    small = {
        m.name.removeprefix(prefix + "/"): read(m, m.size).decode("utf-8", "replace").strip()
        for m in ms
        if m.size <= 64 and not m.name.startswith(f"{prefix}/data/")
    }
    if check:
        for m, info in zip(ms, infos, strict=True):
            m.crc_ok = member_crc_ok(f, info, m.data_offset) if m.compression == "stored" else None
            if m.crc_ok is False:
                anatomy.findings.append(Finding("ckpt.member_crc", "bad", {"where": m.name}))
    anatomy.layout["zip_members"] = [m.to_dict() for m in ms]
    anatomy.layout["records"] = small
    misaligned = [m.name for m in ms if m.name.startswith(f"{prefix}/data/") and not m.aligned]
    if misaligned:
        anatomy.findings.append(Finding("ckpt.misaligned", "warn", {"storages": len(misaligned)}))

    def locate(storage: StorageRef) -> tuple[int | None, int]:
        member = by_name.get(f"{prefix}/data/{storage.key}")
        if member is None:
            raise CheckpointError(f"storage {storage.key} named in data.pkl has no member data/{storage.key}", path)
        return (member.data_offset if member.compression == "stored" else None), member.size

    def reader(ref: TensorRef, offset: int | None, nbytes: int) -> Callable[[], torch.Tensor]:
        if offset is None:
            raise CheckpointError(f"storage {ref.storage.key} is compressed; torch.save never writes that", path)
        return lambda: read_storage(path, offset, nbytes, ref)

    build_anatomy(anatomy, _scan(path, data, pkl.name), pkl.name, locate, reader)
    return anatomy


def inspect_legacy(path: Path, f: BinaryIO, file_bytes: int) -> Anatomy:
    """Pre-1.6 torch.save: magic, protocol, sys_info, the object, storage keys — five pickles — then
    each storage as an int64 element count and its raw bytes, in the order of the keys."""
    head = f.read(min(file_bytes, MAX_PICKLE_BYTES))
    anatomy = Anatomy(str(path), "legacy torch.save (< 1.6)", file_bytes)
    offset, scans = 0, []
    for what in ("magic number", "protocol version", "system info", "object", "storage keys"):
        scan = _scan(path, head, f"{what} pickle @ byte {offset}", offset)
        if what != "object":
            record_pickle(anatomy, scan, f"{what} pickle @ byte {offset}")
        scans.append((offset, scan))
        offset = scan.end
    keys = scans[4][1].root
    if not isinstance(keys, list):
        raise CheckpointError("storage key list is not a list", path)
    anatomy.layout["records"] = {"protocol_version": short(scans[1][1].root), "sys_info": short(scans[2][1].root)}
    storages: dict[str, tuple[int, int]] = {}
    dtypes: dict[str, DType] = {}
    for _, obj in walk(scans[3][1].root):
        if isinstance(obj, TensorRef):
            dtypes[obj.storage.key] = obj.dtype
    for key in keys:
        key = str(key)
        f.seek(offset)
        raw = f.read(8)
        if len(raw) < 8:
            raise CheckpointError(f"storage {key} header cut off at byte {offset:,}: truncated", path)
        (numel,) = struct.unpack("<q", raw)
        nbytes = numel * (dtypes[key].itemsize if key in dtypes else 1)
        if numel < 0 or offset + 8 + nbytes > file_bytes:
            raise CheckpointError(f"storage {key} ({numel:,} elements) runs past the end of the file", path)
        storages[key] = (offset + 8, nbytes)
        offset += 8 + nbytes
    anatomy.layout["storages"] = [{"key": k, "offset": o, "bytes": n} for k, (o, n) in storages.items()]

    def locate(storage: StorageRef) -> tuple[int | None, int]:
        if storage.key not in storages:
            raise CheckpointError(f"storage {storage.key} is not in the file's storage list", path)
        return storages[storage.key]

    def reader(ref: TensorRef, at: int | None, nbytes: int) -> Callable[[], torch.Tensor]:
        return lambda: read_storage(path, at or 0, nbytes, ref)

    build_anatomy(anatomy, scans[3][1], f"object pickle @ byte {scans[3][0]}", locate, reader)
    return anatomy


def inspect_bare_pickle(path: Path, f: BinaryIO, file_bytes: int) -> Anatomy:
    if file_bytes > MAX_PICKLE_BYTES:
        raise CheckpointError(f"a {file_bytes:,}-byte bare pickle is over the {MAX_PICKLE_BYTES:,}-byte limit", path)
    anatomy = Anatomy(str(path), "bare pickle", file_bytes)

    def locate(storage: StorageRef) -> tuple[int | None, int]:
        raise CheckpointError("a bare pickle names a tensor storage it does not contain", path)

    build_anatomy(anatomy, _scan(path, f.read(), "pickle"), "pickle", locate, lambda *a: None)
    return anatomy
