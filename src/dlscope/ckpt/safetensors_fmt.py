"""safetensors: an 8-byte little-endian header length, a JSON header, then raw tensor bytes.

Every rule of the format is checked before anything is read: the header length is bounded and
inside the file, each tensor's `data_offsets` match its dtype × shape, stay inside the data area
and do not overlap another tensor's.
"""

from __future__ import annotations

import itertools
import json
import struct
from pathlib import Path
from typing import Any, BinaryIO

from dlscope.ckpt.anatomy import Anatomy, TensorEntry, dtype_name, role_for_path
from dlscope.ckpt.filemap import mapped_tensor
from dlscope.ckpt.pickle_values import DType
from dlscope.errors import CheckpointError
from dlscope.findings import Finding

MAX_HEADER = 100_000_000  # the format's own limit
DTYPES = {
    "F64": DType("float64"),
    "F32": DType("float32"),
    "F16": DType("float16"),
    "BF16": DType("bfloat16"),
    "I64": DType("int64"),
    "I32": DType("int32"),
    "I16": DType("int16"),
    "I8": DType("int8"),
    "U64": DType("uint64"),
    "U32": DType("uint32"),
    "U16": DType("uint16"),
    "U8": DType("uint8"),
    "BOOL": DType("bool"),
    "F8_E4M3": DType("float8_e4m3fn"),
    "F8_E5M2": DType("float8_e5m2"),
    "C64": DType("complex64"),
}


def header_length(head: bytes) -> int:
    return struct.unpack("<Q", head[:8])[0]


def read_header(path: Path, f: BinaryIO, file_bytes: int) -> tuple[int, dict[str, Any]]:
    f.seek(0)
    head = f.read(8)
    if len(head) < 8:
        raise CheckpointError("safetensors file shorter than its 8-byte header length", path)
    n = header_length(head)
    if n > MAX_HEADER:
        raise CheckpointError(f"safetensors header length {n:,} is over the format's 100 MB limit", path)
    if 8 + n > file_bytes:
        raise CheckpointError(
            f"safetensors header length {n:,} runs past the end of the {file_bytes:,}-byte file", path
        )
    raw = f.read(n)
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"safetensors header is not JSON: {e}", path) from None
    if not isinstance(header, dict):
        raise CheckpointError("safetensors header is not a JSON object", path)
    return n, header


def _entry(path: Path, name: str, spec: Any) -> tuple[DType, list[int], int, int]:
    if not (isinstance(spec, dict) and {"dtype", "shape", "data_offsets"} <= spec.keys()):
        raise CheckpointError(f"tensor {name!r}: header entry needs dtype, shape and data_offsets", path)
    dtype = DTYPES.get(spec["dtype"])
    if dtype is None:
        raise CheckpointError(f"tensor {name!r}: unknown dtype {spec['dtype']!r}", path)
    shape, offsets = spec["shape"], spec["data_offsets"]
    if not (isinstance(shape, list) and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)):
        raise CheckpointError(f"tensor {name!r}: shape {shape!r} is not a list of non-negative integers", path)
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) and o >= 0 for o in offsets)):
        raise CheckpointError(f"tensor {name!r}: data_offsets {offsets!r} is not [begin, end]", path)
    begin, end = offsets
    numel = 1
    for d in shape:
        numel *= d
    if end - begin != numel * dtype.itemsize:
        raise CheckpointError(
            f"tensor {name!r}: data_offsets span {end - begin:,} bytes, {spec['dtype']} {shape} needs "
            f"{numel * dtype.itemsize:,}",
            path,
        )
    return dtype, shape, begin, end


def inspect_safetensors(path: Path, f: BinaryIO, file_bytes: int) -> Anatomy:
    n, header = read_header(path, f, file_bytes)
    data_start = 8 + n
    data_bytes = file_bytes - data_start
    anatomy = Anatomy(str(path), "safetensors", file_bytes)
    metadata = header.pop("__metadata__", None)
    if metadata is not None and not isinstance(metadata, dict):
        raise CheckpointError("safetensors __metadata__ is not a JSON object", path)
    anatomy.metadata = dict(metadata or {})
    spans = []
    for name, spec in header.items():
        dtype, shape, begin, end = _entry(path, name, spec)
        if end > data_bytes:
            raise CheckpointError(
                f"tensor {name!r}: data_offsets end {end:,} is past the {data_bytes:,}-byte data area", path
            )
        spans.append((begin, end, name, dtype, shape))
    spans.sort()
    for (_b0, e0, n0, *_), (b1, _, n1, *_) in itertools.pairwise(spans):
        if b1 < e0:
            raise CheckpointError(f"tensors {n0!r} and {n1!r} overlap (bytes {b1:,}–{e0:,})", path)
    covered = sum(e - b for b, e, *_ in spans)
    if covered != data_bytes:
        facts = {"bytes": data_bytes - covered, "where": str(path)}
        anatomy.findings.append(Finding("ckpt.unowned_data", "warn", facts))
    anatomy.layout["safetensors_header"] = {
        "header_bytes": n,
        "data_offset": data_start,
        "data_offset_mod_8": data_start % 8,  # the writer pads the header so tensors start 8-byte aligned
        "tensors": len(spans),
        "metadata": anatomy.metadata,
    }
    order = {name: i for i, name in enumerate(header)}
    for begin, end, name, dtype, shape in sorted(spans, key=lambda s: order[s[2]]):
        at = data_start + begin
        role = role_for_path(name.split("."), only_tensors=True)
        numel = (end - begin) // dtype.itemsize

        def read(at: int = at, size: int = end - begin, name: str = dtype, shape: list[int] = shape):
            import torch  # only --stats reads tensor data: inspecting the layout needs no torch

            return mapped_tensor(path, at, size, getattr(torch, name)).reshape(shape)

        anatomy.tensors.append(
            TensorEntry(
                name=name,
                dtype=dtype_name(dtype),
                shape=shape,
                numel=numel,
                nbytes=end - begin,
                storage=name,
                storage_bytes=end - begin,
                offset=at,
                role=role,
                group=name.rsplit(".", 1)[0] if "." in name else "",
                read=read,
            )
        )
    return anatomy
