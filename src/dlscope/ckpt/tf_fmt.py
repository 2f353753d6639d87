"""TensorFlow checkpoints without tensorflow: `<prefix>.index` is a LevelDB-format table (TF writes
it uncompressed) mapping each tensor name to a BundleEntryProto — dtype, shape, shard, offset, size,
crc32c — and `<prefix>.data-NNNNN-of-MMMMM` shards hold the raw little-endian bytes.

Table layout (leveldb doc/table_format.md): data blocks, a metaindex block, an index block whose
values are BlockHandles (varint64 offset, varint64 size) of the data blocks, and a 48-byte footer:
two BlockHandles padded to 40 bytes, then the magic 0xdb4775248b80fb57. Each block is followed by a
5-byte trailer (compression type, crc32c). A block is prefix-compressed entries — varint32 shared,
varint32 non_shared, varint32 value_length, key delta, value — then uint32 restart offsets and
their uint32 count.

Every entry carries the masked CRC32C of its bytes in the shard (the same mask as TFRecords);
TF checks it on restore, and so do `ckpt inspect --stats` and `ckpt verify`. String tensors (the
object graph among them) are stored as varint64 lengths, a masked CRC32C of those, then the bytes.
`_CHECKPOINTABLE_OBJECT_GRAPH` is a serialized TrackableObjectGraph: the tree of objects (model,
layers, optimizer) whose edges name every path to a variable, and the optimizer's slot variables
with the variable each belongs to.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, BinaryIO

import crc32c

from dlscope.ckpt.anatomy import Anatomy, TensorEntry, dtype_name
from dlscope.ckpt.filemap import mapped_tensor
from dlscope.ckpt.pickle_values import DType
from dlscope.ckpt.sniff import TF_TABLE_MAGIC
from dlscope.errors import CheckpointError
from dlscope.experiments.pipeline.tfrecord import mask
from dlscope.findings import Finding
from dlscope.protowire import FormatError, proto_fields, signed64, varint

FOOTER_BYTES = 48
TRAILER_BYTES = 5
MAX_INDEX_BYTES = 256 << 20
MAX_ENTRIES = 1_000_000
MAX_SHARDS = 100_000
CRC_CHUNK = 16 << 20
# tensorflow/core/framework/types.proto
TF_DTYPES: dict[int, DType | str] = {  # a str: no fixed-size elements to read
    1: DType("float32"),
    2: DType("float64"),
    3: DType("int32"),
    4: DType("uint8"),
    5: DType("int16"),
    6: DType("int8"),
    7: "string",
    8: DType("complex64"),
    9: DType("int64"),
    10: DType("bool"),
    14: DType("bfloat16"),
    17: DType("uint16"),
    18: DType("complex128"),
    19: DType("float16"),
    20: "resource",
    21: "variant",
    22: DType("uint32"),
    23: DType("uint64"),
}
SHARD_NAME = re.compile(r"\.data-\d{5}-of-\d{5}$")


def read_block(f: BinaryIO, file_bytes: int, handle: tuple[int, int]) -> bytes:
    offset, size = handle
    if offset + size + TRAILER_BYTES > file_bytes:
        raise FormatError(f"block at {offset:,} (+{size:,} bytes) runs past the end of the file")
    f.seek(offset)
    raw = f.read(size + TRAILER_BYTES)
    if raw[size] != 0:
        raise FormatError(
            f"block at {offset:,} is compressed (type {raw[size]}); TF writes bundle indexes uncompressed"
        )
    return raw[:size]


def block_entries(block: bytes) -> list[tuple[bytes, bytes]]:
    if len(block) < 4:
        raise FormatError("block shorter than its restart count")
    restarts = int.from_bytes(block[-4:], "little")
    end = len(block) - 4 - 4 * restarts
    if end < 0:
        raise FormatError(f"block claims {restarts:,} restart points, more than fit")
    out, pos, key = [], 0, b""
    while pos < end:
        shared, pos = varint(block, pos)
        unshared, pos = varint(block, pos)
        length, pos = varint(block, pos)
        if shared > len(key) or pos + unshared + length > end:
            raise FormatError("block entry runs past its block")
        key = key[:shared] + block[pos : pos + unshared]
        pos += unshared
        out.append((key, block[pos : pos + length]))
        pos += length
    return out


def handle_of(value: bytes) -> tuple[int, int]:
    offset, pos = varint(value, 0)
    size, _ = varint(value, pos)
    return offset, size


def read_table(f: BinaryIO, file_bytes: int) -> tuple[list[tuple[bytes, bytes]], int]:
    """Every (key, value) of the table, in key order, and the number of data blocks."""
    if file_bytes < FOOTER_BYTES:
        raise FormatError("shorter than a table footer")
    if file_bytes > MAX_INDEX_BYTES:
        raise FormatError(f"a {file_bytes:,}-byte index is over the {MAX_INDEX_BYTES:,}-byte limit")
    f.seek(file_bytes - FOOTER_BYTES)
    footer = f.read(FOOTER_BYTES)
    if footer[-8:] != TF_TABLE_MAGIC:
        raise FormatError("no table magic in the footer")
    _, pos = varint(footer, 0)  # metaindex offset
    _, pos = varint(footer, pos)  # metaindex size
    index_offset, pos = varint(footer, pos)
    index_size, _ = varint(footer, pos)
    index = block_entries(read_block(f, file_bytes, (index_offset, index_size)))
    entries: list[tuple[bytes, bytes]] = []
    for _, value in index:
        entries += block_entries(read_block(f, file_bytes, handle_of(value)))
        if len(entries) > MAX_ENTRIES:
            raise FormatError(f"more than {MAX_ENTRIES:,} entries")
    return entries, len(index)


def parse_entry(value: bytes) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "dtype": 0,
        "shape": [],
        "shard_id": 0,
        "offset": 0,
        "size": 0,
        "crc32c": None,
        "slices": 0,
    }
    for number, v in proto_fields(value):
        if number == 1:
            entry["dtype"] = v
        elif number == 2:
            for dim_number, dim in proto_fields(v):
                if dim_number == 2:  # TensorShapeProto.dim; Dim.size is field 1
                    entry["shape"].append(next((signed64(s) for n, s in proto_fields(dim) if n == 1), 0))
        elif number in (3, 4, 5):
            entry[{3: "shard_id", 4: "offset", 5: "size"}[number]] = signed64(v)
        elif number == 6:
            entry["crc32c"] = f"{v:08x}"
        elif number == 7:
            entry["slices"] += 1
    return entry


def parse_header(value: bytes) -> dict[str, Any]:
    header: dict[str, Any] = {"num_shards": 1, "endianness": "little"}
    for number, v in proto_fields(value):
        if number == 1:
            header["num_shards"] = v
        elif number == 2:
            header["endianness"] = "big" if v == 1 else "little"
        elif number == 3:
            header["version"] = {{1: "producer", 2: "min_consumer"}.get(n, str(n)): x for n, x in proto_fields(v)}
    if not 1 <= header["num_shards"] <= MAX_SHARDS:
        raise FormatError(f"header claims {header['num_shards']:,} data shards")
    return header


def tensor_crc(shard: Path, offset: int, size: int, dtype: int, numel: int) -> int | None:
    """The masked CRC32C TF stores for a tensor's bytes (None: a dtype whose checksum is not computed here).

    Numbers: over the bytes, read in chunks (bounded memory). Strings: over each length as uint32
    (uint64 past 4 GiB) rather than its varint bytes, then the stored length checksum and the string
    bytes (tensor_bundle.cc, WriteStringTensor)."""
    if dtype in (20, 21):  # resource, variant: not stored as plain bytes
        return None
    if dtype != 7:
        crc = 0
        with open(shard, "rb") as f:
            f.seek(offset)
            for start in range(0, size, CRC_CHUNK):
                crc = crc32c.crc32c(f.read(min(CRC_CHUNK, size - start)), crc)
        return mask(crc)
    if size > MAX_INDEX_BYTES:
        return None
    raw = read_shard_bytes(shard, offset, size)
    crc, pos, total = 0, 0, 0
    for _ in range(numel):
        size, pos = varint(raw, pos)
        crc = crc32c.crc32c(size.to_bytes(4 if size < 1 << 32 else 8, "little"), crc)
        total += size
    crc = crc32c.crc32c(raw[pos : pos + 4], crc)
    return mask(crc32c.crc32c(raw[pos + 4 : pos + 4 + total], crc))


def string_values(raw: bytes, numel: int) -> list[bytes]:
    sizes, pos = [], 0
    for _ in range(numel):
        size, pos = varint(raw, pos)
        sizes.append(size)
    pos += 4  # the length checksum
    if pos + sum(sizes) > len(raw):
        raise FormatError("string tensor shorter than its lengths")
    out = []
    for size in sizes:
        out.append(raw[pos : pos + size])
        pos += size
    return out


def object_graph(graph: bytes) -> dict[str, dict[str, Any]]:
    """checkpoint key → where the variable sits: its object path from the root, the layer (or
    other object) that owns it and the variable's name there; for an optimizer slot, the layer and
    name of the variable it serves, and the slot's name.

    Slots come from two encodings: TF's SlotVariableReference (tf.keras 2, `.OPTIMIZER_SLOT` keys)
    and Keras 3's parallel lists (optimizer/_momentums/i and _velocities/i belong to
    optimizer/_trainable_variables/i)."""
    nodes = [proto_fields(node) for number, node in proto_fields(graph) if number == 1]
    children: list[list[tuple[int, str]]] = []
    keys: dict[int, str] = {}
    slot_refs: list[tuple[int, str, int]] = []
    for i, fields in enumerate(nodes):
        edges = []
        for number, value in fields:
            sub = dict(proto_fields(value)) if number in (1, 2, 3) else {}
            if number == 1:
                edges.append((sub.get(1, 0), sub.get(2, b"").decode("utf-8", "replace")))
            elif number == 2 and sub.get(1) == b"VARIABLE_VALUE" and 3 in sub:
                keys[i] = sub[3].decode("utf-8", "replace")
            elif number == 3:
                slot_refs.append((sub.get(1, 0), sub.get(2, b"").decode("utf-8", "replace"), sub.get(3, 0)))
        children.append(edges)
    # every path from the root to each node (breadth first, so the shortest comes first)
    paths: dict[int, list[list[str]]] = {0: [[]]}
    queue = [0]
    for node in queue:
        for child, name in children[node]:
            if not 0 <= child < len(nodes) or len(paths.get(child, ())) >= 4:
                continue
            if child not in paths:
                queue.append(child)
            paths.setdefault(child, []).append([*paths[node][0], name])
    slots: dict[int, tuple[str, int]] = {slot: (name, original) for original, name, slot in slot_refs}
    for node in queue:
        names = dict((name, child) for child, name in children[node])
        trainable = names.get("_trainable_variables")
        if trainable is None:
            continue
        order = [child for child, _ in children[trainable]]
        for list_name, lst in names.items():
            if list_name in ("_variables", "_trainable_variables", "_trainable_variables_indices"):
                continue
            entries = [child for child, _ in children[lst]] if 0 <= lst < len(nodes) else []
            if len(entries) == len(order) and all(c in keys for c in entries):
                for child, original in zip(entries, order, strict=True):
                    slots[child] = (singular(list_name.lstrip("_")), original)

    def owner(node: int) -> list[str]:
        """The path that best names the variable: one outside the optimizer when there is one."""
        candidates = paths.get(node, [[]])
        return next((p for p in candidates if p and p[0] != "optimizer"), candidates[0])

    out = {}
    for node, key in keys.items():
        slot = slots.get(node)
        path = owner(slot[1] if slot else node)
        out[key] = {
            "object": "/".join(owner(node)),
            "layer": layer_name(path[:-1]),
            "variable": path[-1] if path else "",
            "slot": slot[0] if slot else None,
        }
    return out


def singular(name: str) -> str:
    """Keras 3's slot lists are plurals of the slot names: _momentums, _velocities, _accumulators."""
    return name[:-3] + "y" if name.endswith("ies") else name.removesuffix("s")


def layer_name(path: list[str]) -> str:
    """The owner's short name: `layer_with_weights-0`, or `_operations/1` for an indexed list entry."""
    if not path:
        return ""
    return "/".join(path[-2:]) if path[-1].isdigit() else path[-1]


def role_and_group(name: str) -> tuple[str, str]:
    """Without an object graph: guessed from the key."""
    parts = name.split("/")
    if ".OPTIMIZER_SLOT" in parts or parts[0] in ("optimizer", "Adam", "adam") or "/Adam" in name:
        role = "optimizer"
    elif name.startswith("_CHECKPOINTABLE_OBJECT_GRAPH") or parts[0] in ("save_counter", "global_step"):
        role = "other"
    else:
        role = "parameter"
    return role, parts[0] if len(parts) > 1 and role != "other" else ""


def index_path_for(path: Path) -> Path | None:
    """The .index of a checkpoint named by its prefix, its .index, one of its data shards, or a
    SavedModel directory (its variables/ are a bundle)."""
    if path.is_dir():
        index = path / "variables" / "variables.index"
        return index if index.is_file() else None
    if path.name.endswith(".index"):
        return path
    if SHARD_NAME.search(path.name):
        index = Path(SHARD_NAME.sub(".index", str(path)))
        return index if index.is_file() else None
    index = Path(f"{path}.index")
    return index if index.is_file() else None


def read_shard_bytes(shard: Path, offset: int, size: int) -> bytes:
    with open(shard, "rb") as f:
        f.seek(offset)
        return f.read(size)


def inspect_tf(index: Path, f: BinaryIO, index_bytes: int, check: bool = False) -> Anatomy:
    """The bundle's tensors, mapped to layers and optimizer slots by its object graph; with
    `check`, every tensor's CRC32C is verified (a mismatch is a "bad" finding naming the tensor)."""
    try:
        entries, blocks = read_table(f, index_bytes)
        header = parse_header(entries[0][1]) if entries and entries[0][0] == b"" else None
        if header is None:
            raise FormatError("no bundle header entry (empty key)")
        parsed = [(key.decode("utf-8", "replace"), parse_entry(value)) for key, value in entries[1:]]
    except FormatError as e:
        raise CheckpointError(f"corrupt TensorFlow checkpoint index: {e}", index) from None
    prefix = str(index).removesuffix(".index")
    shards = [Path(f"{prefix}.data-{i:05d}-of-{header['num_shards']:05d}") for i in range(header["num_shards"])]
    present = {s: s.stat().st_size for s in shards if s.is_file()}
    saved_model = index.parent.name == "variables" and (index.parent.parent / "saved_model.pb").is_file()
    kind = "TensorFlow SavedModel (variables/ bundle)" if saved_model else "TensorFlow checkpoint (tensor bundle)"
    anatomy = Anatomy(str(index), kind, index_bytes + sum(present.values()))
    anatomy.layout["tf_index"] = {"entries": len(entries), "data_blocks": blocks, "header": header}
    anatomy.layout["files"] = [{"path": str(index), "bytes": index_bytes}] + [
        {"path": str(s), "bytes": present.get(s)} for s in shards
    ]
    for s in shards:
        if s not in present:
            anatomy.findings.append(Finding("ckpt.shard_missing", "bad", {"where": str(s)}))
    if header["endianness"] != "little":
        anatomy.findings.append(Finding("ckpt.big_endian", "warn", {"where": str(index)}))
    places: dict[str, dict[str, Any]] = {}
    for name, e in parsed:
        dtype = TF_DTYPES.get(e["dtype"], f"dtype {e['dtype']}")
        numel = 1
        for d in e["shape"]:
            numel *= max(d, 0)
        shard = shards[e["shard_id"]] if 0 <= e["shard_id"] < len(shards) else None
        fits = shard in present and e["offset"] >= 0 and e["offset"] + e["size"] <= present[shard]
        if shard in present and not fits:
            facts = {"offset": e["offset"], "bytes": e["size"], "where": name}
            anatomy.findings.append(Finding("ckpt.past_shard", "bad", facts))
        if fits and check and e["crc32c"] is not None:
            _check_crc(anatomy, name, shard, e, numel)
        if fits and name == "_CHECKPOINTABLE_OBJECT_GRAPH" and e["dtype"] == 7 and e["size"] <= MAX_INDEX_BYTES:
            places = _places(anatomy, read_shard_bytes(shard, e["offset"], e["size"]))
        numeric = isinstance(dtype, DType)
        if numeric and e["size"] != numel * dtype.itemsize and not e["slices"]:
            facts = {"bytes": e["size"], "elements": numel, "dtype": dtype_name(dtype), "where": name}
            anatomy.findings.append(Finding("ckpt.size_mismatch", "bad", facts))
            numeric = False
        readable = numeric and fits and header["endianness"] == "little" and not e["slices"]
        anatomy.tensors.append(
            TensorEntry(
                name=name,
                dtype=str(dtype),
                shape=e["shape"],
                numel=numel,
                nbytes=e["size"],
                storage=f"{shard.name if shard else e['shard_id']}@{e['offset']}",
                storage_bytes=e["size"],
                offset=e["offset"],
                read=_reader(shard, e["offset"], e["size"], dtype, e["shape"]) if readable else None,
            )
        )
    for t in anatomy.tensors:
        place = places.get(t.name)
        if place is None:
            t.role, t.group = role_and_group(t.name)
        else:
            optimizer = place["slot"] is not None or place["object"].startswith("optimizer/")
            t.role, t.group = ("optimizer" if optimizer else "parameter"), place["layer"]
    return anatomy


def _check_crc(anatomy: Anatomy, name: str, shard: Path, entry: dict[str, Any], numel: int) -> None:
    try:
        computed = tensor_crc(shard, entry["offset"], entry["size"], entry["dtype"], numel)
    except FormatError as e:
        computed = None
        anatomy.findings.append(Finding("ckpt.string_unreadable", "bad", {"error": str(e), "where": name}))
    if computed is not None and f"{computed:08x}" != entry["crc32c"]:
        anatomy.corrupt.append(name)
        facts = {"stored": entry["crc32c"], "computed": f"{computed:08x}", "where": name}
        anatomy.findings.append(Finding("ckpt.crc32c_mismatch", "bad", facts))


def _places(anatomy: Anatomy, raw: bytes) -> dict[str, dict[str, Any]]:
    """Decode the object graph into anatomy.layout["variable_map"]; a graph that does not parse is a finding."""
    try:
        places = object_graph(string_values(raw, 1)[0])
    except (FormatError, IndexError) as e:
        anatomy.findings.append(Finding("ckpt.object_graph_unreadable", "warn", {"error": str(e)}))
        return {}
    anatomy.layout["variable_map"] = [{"tensor": key, **place} for key, place in sorted(places.items())]
    return places


def bundle_index(path: Path) -> Path | None:
    """The .index when `path` names a TF bundle (prefix, .index, shard or SavedModel directory)."""
    index = index_path_for(path)
    if index is None or index.stat().st_size < FOOTER_BYTES:
        return None
    with open(index, "rb") as f:
        f.seek(-len(TF_TABLE_MAGIC), 2)
        return index if f.read() == TF_TABLE_MAGIC else None


def verify_bundle(index: Path) -> Anatomy:
    """Every tensor's CRC32C, as TF checks them on restore (`ckpt verify` of a TF checkpoint)."""
    with open(index, "rb") as f:
        return inspect_tf(index, f, index.stat().st_size, check=True)


def _reader(shard: Path | None, offset: int, size: int, dtype: DType, shape: list[int]):
    def read():  # -> torch.Tensor
        import torch  # only --stats reads tensor data: inspecting the layout needs no torch

        return mapped_tensor(shard, offset, size, getattr(torch, dtype)).reshape(shape)

    return read
