"""TensorFlow checkpoints without tensorflow: `<prefix>.index` is a LevelDB-format table (TF writes
it uncompressed) mapping each tensor name to a BundleEntryProto — dtype, shape, shard, offset, size,
crc32c — and `<prefix>.data-NNNNN-of-MMMMM` shards hold the raw little-endian bytes.

Table layout (leveldb doc/table_format.md): data blocks, a metaindex block, an index block whose
values are BlockHandles (varint64 offset, varint64 size) of the data blocks, and a 48-byte footer:
two BlockHandles padded to 40 bytes, then the magic 0xdb4775248b80fb57. Each block is followed by a
5-byte trailer (compression type, crc32c). A block is prefix-compressed entries — varint32 shared,
varint32 non_shared, varint32 value_length, key delta, value — then uint32 restart offsets and
their uint32 count.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, BinaryIO

import torch

from dlscope.ckpt.anatomy import Anatomy, Finding, TensorEntry, dtype_name
from dlscope.ckpt.filemap import mapped_tensor
from dlscope.errors import CheckpointError

TABLE_MAGIC = (0xDB4775248B80FB57).to_bytes(8, "little")
FOOTER_BYTES = 48
TRAILER_BYTES = 5
MAX_INDEX_BYTES = 256 << 20
MAX_ENTRIES = 1_000_000
MAX_SHARDS = 100_000
# tensorflow/core/framework/types.proto
TF_DTYPES: dict[int, torch.dtype | str] = {
    1: torch.float32,
    2: torch.float64,
    3: torch.int32,
    4: torch.uint8,
    5: torch.int16,
    6: torch.int8,
    7: "string",
    8: torch.complex64,
    9: torch.int64,
    10: torch.bool,
    14: torch.bfloat16,
    17: torch.uint16,
    18: torch.complex128,
    19: torch.float16,
    20: "resource",
    21: "variant",
    22: torch.uint32,
    23: torch.uint64,
}
SHARD_NAME = re.compile(r"\.data-\d{5}-of-\d{5}$")


class FormatError(ValueError):
    """A fault inside the table or a protobuf."""


def varint(buf: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    for _ in range(10):
        if pos >= len(buf):
            raise FormatError("varint runs past the end of its block")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
    raise FormatError("varint longer than 10 bytes")


def signed64(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def proto_fields(buf: bytes) -> list[tuple[int, Any]]:
    """(field number, value) of a protobuf message: ints for varint/fixed, bytes for length-delimited."""
    out, pos = [], 0
    while pos < len(buf):
        tag, pos = varint(buf, pos)
        number, wire = tag >> 3, tag & 7
        if wire == 0:
            value, pos = varint(buf, pos)
        elif wire == 1:
            if pos + 8 > len(buf):
                raise FormatError("fixed64 field cut short")
            value, pos = int.from_bytes(buf[pos : pos + 8], "little"), pos + 8
        elif wire == 5:
            if pos + 4 > len(buf):
                raise FormatError("fixed32 field cut short")
            value, pos = int.from_bytes(buf[pos : pos + 4], "little"), pos + 4
        elif wire == 2:
            n, pos = varint(buf, pos)
            if pos + n > len(buf):
                raise FormatError("length-delimited field runs past its message")
            value, pos = buf[pos : pos + n], pos + n
        else:
            raise FormatError(f"protobuf wire type {wire}")
        out.append((number, value))
    return out


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
    if footer[-8:] != TABLE_MAGIC:
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


def role_and_group(name: str) -> tuple[str, str]:
    parts = name.split("/")
    if ".OPTIMIZER_SLOT" in parts or parts[0] in ("optimizer", "Adam", "adam") or "/Adam" in name:
        role = "optimizer"
    elif name.startswith("_CHECKPOINTABLE_OBJECT_GRAPH") or parts[0] in ("save_counter", "global_step"):
        role = "other"
    else:
        role = "parameter"
    return role, parts[0] if len(parts) > 1 and role != "other" else ""


def index_path_for(path: Path) -> Path | None:
    """The .index of a checkpoint named by its prefix, its .index, or one of its data shards."""
    if path.name.endswith(".index"):
        return path
    if SHARD_NAME.search(path.name):
        index = Path(SHARD_NAME.sub(".index", str(path)))
        return index if index.is_file() else None
    index = Path(f"{path}.index")
    return index if index.is_file() else None


def inspect_tf(index: Path, f: BinaryIO, index_bytes: int) -> Anatomy:
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
    anatomy = Anatomy(str(index), "TensorFlow checkpoint (tensor bundle)", index_bytes + sum(present.values()))
    anatomy.layout["tf_index"] = {"entries": len(entries), "data_blocks": blocks, "header": header}
    anatomy.layout["files"] = [{"path": str(index), "bytes": index_bytes}] + [
        {"path": str(s), "bytes": present.get(s)} for s in shards
    ]
    for s in shards:
        if s not in present:
            anatomy.findings.append(Finding("bad", "data shard missing: tensor bytes cannot be read", str(s)))
    if header["endianness"] != "little":
        anatomy.findings.append(Finding("warn", "big-endian bundle: statistics are not computed", str(index)))
    for name, e in parsed:
        dtype = TF_DTYPES.get(e["dtype"], f"dtype {e['dtype']}")
        numel = 1
        for d in e["shape"]:
            numel *= max(d, 0)
        shard = shards[e["shard_id"]] if 0 <= e["shard_id"] < len(shards) else None
        fits = shard in present and e["offset"] >= 0 and e["offset"] + e["size"] <= present[shard]
        if shard in present and not fits:
            anatomy.findings.append(Finding("bad", f"bytes {e['offset']:,}+{e['size']:,} run past its shard", name))
        numeric = isinstance(dtype, torch.dtype)
        if numeric and e["size"] != numel * dtype.itemsize and not e["slices"]:
            anatomy.findings.append(Finding("bad", f"{e['size']:,} bytes for {numel:,} {dtype_name(dtype)}", name))
            numeric = False
        role, group = role_and_group(name)
        readable = numeric and fits and header["endianness"] == "little" and not e["slices"]
        anatomy.tensors.append(
            TensorEntry(
                name=name,
                dtype=dtype_name(dtype) if isinstance(dtype, torch.dtype) else dtype,
                shape=e["shape"],
                numel=numel,
                nbytes=e["size"],
                storage=shard.name if shard else f"shard {e['shard_id']}",
                storage_bytes=e["size"],
                offset=e["offset"],
                role=role,
                group=group,
                read=_reader(shard, e["offset"], e["size"], dtype, e["shape"]) if readable else None,
            )
        )
    return anatomy


def _reader(shard: Path | None, offset: int, size: int, dtype: Any, shape: list[int]):
    def read() -> torch.Tensor:
        return mapped_tensor(shard, offset, size, dtype).reshape(shape)

    return read
