"""torch.distributed.checkpoint (DCP) directories without loading them: `.metadata` is a pickle of a
`Metadata` dataclass — each state-dict key's dtype, global shape and chunks (offsets, sizes), and a
storage map from (key, chunk offsets) to (file, offset, length) — and each rank writes its own
`__<rank>_<n>.distcp` files, in which every item is a torch.save archive of its own.

torch's FileSystemReader loads `.metadata` with plain `pickle.load`, so a hostile one runs code on
`dcp.load`; here it is simulated by the pickle scanner with an allow-list of DCP's own classes, and
the items are located and bounds-checked against the files, never unpickled (`--stats` reads tensor
items with torch.load(weights_only=True)).
"""

from __future__ import annotations

import io
import math
import re
from pathlib import Path
from typing import Any

from dlscope.ckpt.allowlist import DCP_METADATA, TORCH_WEIGHTS_ONLY
from dlscope.ckpt.anatomy import ROLE_OF_KEY, Anatomy, TensorEntry, role_for_path
from dlscope.ckpt.pickle_scan import scan_pickle
from dlscope.ckpt.pickle_values import DType, Global, ObjectKey, Opaque
from dlscope.ckpt.torchfmt import record_pickle
from dlscope.errors import CheckpointError
from dlscope.findings import Finding

METADATA = ".metadata"
MAX_METADATA_BYTES = 256 << 20
RANK_FILE = re.compile(r"^__(\d+)_(\d+)\.distcp$")
DCP_GLOBALS = TORCH_WEIGHTS_ONLY | DCP_METADATA


def is_dcp_dir(path: Path) -> bool:
    return path.is_dir() and (path / METADATA).is_file()


def fields(obj: Any) -> dict[str, Any]:
    """A dataclass instance's attributes as BUILD gave them: a dict, or (dict, slots) for slotted classes."""
    state = obj.state if isinstance(obj, Opaque) else None
    if isinstance(state, tuple) and len(state) == 2 and all(isinstance(s, dict | None) for s in state):
        return {**(state[0] or {}), **(state[1] or {})}
    return state if isinstance(state, dict) else {}


def _kind(obj: Any) -> str:
    return obj.qualname.rsplit(".", 1)[-1] if isinstance(obj, Opaque) else type(obj).__name__


def read_metadata(path: Path) -> tuple[Anatomy, dict[str, Any]]:
    """The scanned `.metadata`: its census and findings in a new Anatomy, and the Metadata's fields."""
    size = path.stat().st_size
    if size == 0:
        raise CheckpointError("empty file", path)
    if size > MAX_METADATA_BYTES:
        raise CheckpointError(f"{size:,} bytes: larger than any DCP metadata dlscope reads", path)
    scan = scan_pickle(path.read_bytes(), allowed=DCP_GLOBALS)
    if scan.error:
        raise CheckpointError(f"malformed DCP metadata pickle at byte {scan.end}: {scan.error}", path)
    if _kind(scan.root) != "Metadata":
        raise CheckpointError(f"not a DCP Metadata pickle (it holds a {_kind(scan.root)})", path)
    anatomy = Anatomy(path=str(path.parent), format="torch.distributed.checkpoint", file_bytes=0)
    record_pickle(anatomy, scan, METADATA)
    meta = fields(scan.root)
    if not isinstance(meta.get("state_dict_metadata"), dict) or not isinstance(meta.get("storage_data"), dict):
        raise CheckpointError("DCP metadata without state_dict_metadata and storage_data maps", path)
    return anatomy, meta


def storage_map(meta: dict[str, Any], path: Path) -> dict[tuple[str, tuple[int, ...] | None], dict[str, Any]]:
    """(key, chunk offsets) → {file, offset, length}; offsets None for non-tensor (bytes) entries."""
    out = {}
    for key, info in meta["storage_data"].items():
        index = fields(key.value if isinstance(key, ObjectKey) else key)
        where = fields(info)
        fqn, offsets = index.get("fqn"), index.get("offset")
        name, start, length = where.get("relative_path"), where.get("offset"), where.get("length")
        if not isinstance(fqn, str) or not isinstance(name, str) or not _ints(start, length):
            raise CheckpointError(f"storage entry {fqn!r} without a file, offset and length", path)
        if "/" in name or name in ("", ".", ".."):
            raise CheckpointError(f"storage entry {fqn!r} names a file outside the checkpoint: {name!r}", path)
        out[(fqn, tuple(offsets) if isinstance(offsets, tuple | list) else None)] = {
            "file": name,
            "offset": start,
            "length": length,
        }
    return out


def _ints(*values: Any) -> bool:
    return all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values)


def check_files(directory: Path, storage: dict[Any, dict[str, Any]]) -> dict[str, int]:
    """Each file the map names exists and holds every item it is said to hold; its size."""
    sizes: dict[str, int] = {}
    for (fqn, _), item in sorted(storage.items(), key=lambda kv: (kv[1]["file"], kv[1]["offset"])):
        file = directory / item["file"]
        if item["file"] not in sizes:
            if not file.is_file():
                raise CheckpointError(f"missing: {METADATA} stores {fqn!r} in it", file)
            sizes[item["file"]] = file.stat().st_size
        end = item["offset"] + item["length"]
        if end > sizes[item["file"]]:
            raise CheckpointError(
                f"truncated: {fqn!r} lies at bytes {item['offset']:,}–{end:,}, the file has {sizes[item['file']]:,}",
                file,
            )
    return sizes


def _reader(file: Path, offset: int, length: int):
    def read():
        import torch  # only --stats reads tensor values

        with open(file, "rb") as f:
            f.seek(offset)
            return torch.load(io.BytesIO(f.read(length)), map_location="cpu", weights_only=True)

    return read


def checked(directory: Path) -> tuple[Anatomy, dict[str, Any], dict[Any, dict[str, Any]], dict[str, int]]:
    """The metadata read safely, its storage map, and each file's size, once every entry is checked:
    what dcp.load would trip over (a missing or cut file, a broken .metadata) as one line naming the file."""
    meta_path = directory / METADATA
    anatomy, meta = read_metadata(meta_path)
    storage = storage_map(meta, meta_path)
    return anatomy, meta, storage, check_files(directory, storage)


def inspect_dcp(directory: Path) -> Anatomy:
    meta_path = directory / METADATA
    anatomy, meta, storage, sizes = checked(directory)
    order = sorted(storage, key=lambda k: (storage[k]["file"], storage[k]["offset"]))
    numbered = {key: n for n, key in enumerate(order)}
    bare = not any(str(k).split(".", 1)[0] in ROLE_OF_KEY for k in meta["state_dict_metadata"])
    sharded = []
    for fqn, entry in meta["state_dict_metadata"].items():
        if _kind(entry) == "BytesStorageMetadata":
            item = storage.get((fqn, None))
            anatomy.metadata[fqn] = f"{item['length']:,} bytes in {item['file']}" if item else "not stored"
            continue
        chunks = [fields(c) for c in fields(entry).get("chunks") or []]
        if len(chunks) > 1:
            sharded.append(f"{fqn} in {len(chunks)}")
        role, group = _role(fqn, bare)
        dtype = _dtype(fields(entry).get("properties"))
        for chunk in chunks:
            offsets, shape = tuple(chunk.get("offsets") or ()), list(chunk.get("sizes") or ())
            item = storage.get((fqn, offsets))
            if item is None:
                raise CheckpointError(f"{fqn!r} chunk at {offsets} has no storage entry", meta_path)
            numel = math.prod(shape)
            anatomy.tensors.append(
                TensorEntry(
                    name=fqn if len(chunks) == 1 else f"{fqn}@{','.join(map(str, offsets))}",
                    dtype=dtype,
                    shape=shape,
                    numel=numel,
                    nbytes=numel * DType(dtype).itemsize,
                    storage=f"{item['file']}#{numbered[(fqn, offsets)]}",
                    storage_bytes=numel * DType(dtype).itemsize,  # the tensor's own bytes inside its item
                    offset=item["offset"],
                    role=role,
                    group=group,
                    read=_reader(directory / item["file"], item["offset"], item["length"]),
                )
            )
    anatomy.tensors.sort(key=lambda t: (t.storage.split("#")[0], t.offset))  # file by file: rank by rank
    anatomy.file_bytes = meta_path.stat().st_size + sum(sizes.values())
    anatomy.layout["dcp"] = layout(meta, storage, sizes, meta_path.stat().st_size, anatomy)
    add_findings(anatomy, sharded)
    return anatomy


def _role(fqn: str, bare: bool) -> tuple[str, str]:
    """Role and layer of a state-dict key: `model.<layer>.<name>`, `optim.state.<layer>.<name>.<slot>`."""
    parts = fqn.split(".")
    role = role_for_path(parts, bare)
    inner = parts if bare else parts[1:]
    if role == "optimizer":
        return role, ".".join(inner[1:-2]) if inner[:1] == ["state"] else ""
    return role, ".".join(inner[:-1]) if role in ("parameter", "buffer") else ""


def _dtype(props: Any) -> str:
    state = props.state if isinstance(props, Opaque) else None
    first = state[0] if isinstance(state, tuple) and state else fields(props).get("dtype")
    return str(first).removeprefix("torch.") if isinstance(first, Global) else "unknown"


def layout(
    meta: dict[str, Any], storage: dict[Any, dict[str, Any]], sizes: dict[str, int], meta_bytes: int, anatomy: Anatomy
) -> dict[str, Any]:
    """Per file: the rank that wrote it (its name), its items, its tensors' bytes."""
    files = []
    for name, size in sorted(sizes.items()):
        match = RANK_FILE.match(name)
        items = [i for i in storage.values() if i["file"] == name]
        tensors = [t for t in anatomy.tensors if t.storage.startswith(f"{name}#")]
        files.append(
            {
                "file": name,
                "rank": int(match.group(1)) if match else None,
                "bytes": size,
                "items": len(items),
                "item_bytes": sum(i["length"] for i in items),
                "tensors": len(tensors),
                "tensor_bytes": sum(t.nbytes for t in tensors),
            }
        )
    storage_meta = fields(meta.get("storage_meta"))
    return {
        "version": meta.get("version"),
        "save_id": storage_meta.get("save_id"),
        "metadata_bytes": meta_bytes,
        "files": files,
        "entries": len(meta["state_dict_metadata"]),
    }


def add_findings(anatomy: Anatomy, sharded: list[str]) -> None:
    dcp = anatomy.layout["dcp"]
    ranks = sorted({f["rank"] for f in dcp["files"] if f["rank"] is not None})
    items = sum(f["item_bytes"] for f in dcp["files"])
    data = sum(t.nbytes for t in anatomy.tensors)
    facts = {"ranks": ranks, "files": len(dcp["files"]), "tensor_bytes": data, "item_bytes": items}
    anatomy.findings.append(Finding("ckpt.dcp_written", "info", facts))
    if sharded:
        anatomy.findings.append(Finding("ckpt.dcp_sharded", "info", {"tensors": sharded[:8]}))
    anatomy.findings.append(Finding("ckpt.dcp_metadata_pickle", "warn", {"metadata": METADATA}))
