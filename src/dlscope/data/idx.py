"""The IDX file format (LeCun's MNIST container), read and written, gzip or plain.

Layout: two zero bytes, a dtype code, the number of dimensions, then one big-endian uint32 per
dimension, then the data in C order, big-endian.
"""

from __future__ import annotations

import gzip
import io
import math
import os
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

from dlscope.errors import DatasetError
from dlscope.fsutil import atomic_write_bytes

GZIP_MAGIC = b"\x1f\x8b"

# dtype code -> big-endian numpy dtype (0x0A is not assigned by the format)
IDX_DTYPES: dict[int, np.dtype] = {
    0x08: np.dtype(">u1"),
    0x09: np.dtype(">i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}
CODE_OF_DTYPE = {dt.newbyteorder("="): code for code, dt in IDX_DTYPES.items()}


HEADER_MAX = 4 + 4 * 255  # magic, dtype, ndim, then up to 255 uint32 dimensions
CHUNK = 1 << 20


@dataclass(frozen=True)
class Header:
    dims: tuple[int, ...]
    dtype: np.dtype
    length: int  # bytes of header

    @property
    def total(self) -> int:
        """Bytes the whole file must have, header included."""
        return self.length + math.prod(self.dims) * self.dtype.itemsize


def parse_header(content: bytes | bytearray, path: str | Path) -> Header:
    """The IDX header at the start of `content`, every field validated."""
    if len(content) < 4:
        raise DatasetError(f"too short for an IDX header ({len(content)} bytes)", path)
    if content[0] != 0 or content[1] != 0:
        raise DatasetError(f"wrong magic: first two bytes are {content[:2].hex()}, IDX files start with 0000", path)
    code, ndim = content[2], content[3]
    if code not in IDX_DTYPES:
        raise DatasetError(f"unknown IDX dtype code 0x{code:02X}", path)
    if ndim == 0:
        raise DatasetError("IDX header declares zero dimensions", path)
    length = 4 + 4 * ndim
    if len(content) < length:
        raise DatasetError(f"truncated header: {ndim} dimensions need {length} bytes", path)
    dims = tuple(int(d) for d in np.frombuffer(content, ">u4", count=ndim, offset=4))
    return Header(dims, IDX_DTYPES[code], length)


def read_file_bytes(path: str | Path, limit: int | None = None) -> bytes | bytearray:
    """The content of an IDX file, decompressed when it starts with the gzip magic.

    Never more than `limit` bytes (default: what the IDX header declares) are read or inflated,
    so a sparse 64 GiB file or a gzip bomb ends with one line, in bounded memory and time.
    """
    path = Path(path)
    try:
        with open(path, "rb") as f:
            head = f.read(HEADER_MAX)
            f.seek(0)
            if head[:2] == GZIP_MAGIC:
                return gunzip_capped(f, limit, path)
            size = os.fstat(f.fileno()).st_size
            cap = limit if limit is not None else parse_header(head, path).total
            if size > cap:
                raise DatasetError(size_mismatch(cap, size, limit is None), path)
            check_memory(size, path)
            return f.read()
    except FileNotFoundError:
        raise DatasetError("file not found", path) from None
    except OSError as e:
        raise DatasetError(f"cannot read: {e.strerror}", path) from None


def check_memory(size: int, path: str | Path) -> int:
    """`size`, unless no memory here could hold that many bytes."""
    available = available_memory()
    if available is not None and size > available:
        raise DatasetError(f"{size:,} bytes to load, more than the {available:,} available in memory", path)
    return size


def size_mismatch(cap: int, size: int, from_header: bool) -> str:
    if from_header:
        return f"size/dimension mismatch: dimensions need {cap} bytes, file has {size} ({size - cap} trailing)"
    return f"file has {size:,} bytes, more than the {cap:,} expected"


def gunzip_capped(f: BinaryIO, limit: int | None, path: str | Path) -> bytearray:
    """Inflate a gzip stream (members may be concatenated) chunk by chunk, stopping as soon as
    the output exceeds `limit` or the size its own IDX header declares."""
    out = bytearray()
    cap = limit
    inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    try:
        while chunk := f.read(CHUNK):
            while chunk:
                room = (cap if cap is not None else HEADER_MAX) + 1 - len(out)
                out += inflater.decompress(chunk, room)
                if cap is None and len(out) >= 4 and len(out) >= 4 + 4 * out[3]:  # the header is in
                    cap = check_memory(parse_header(out, path).total, path)
                if cap is not None and len(out) > cap:
                    raise DatasetError(
                        f"gzip stream inflates to more than the {cap:,} bytes expected (a decompression bomb?)", path
                    )
                chunk = inflater.unconsumed_tail
                if inflater.eof:  # the next gzip member, if any
                    chunk = inflater.unused_data + chunk
                    if chunk:
                        inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    except zlib.error as e:
        raise DatasetError(f"corrupt gzip data ({e})", path) from None
    if not inflater.eof:
        raise DatasetError("truncated gzip stream", path)
    return out


def available_memory() -> int | None:
    """MemAvailable from /proc/meminfo, in bytes (None where there is no such file)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def maybe_gunzip(raw: bytes, path: str | Path, limit: int | None = None) -> bytes | bytearray:
    """`raw` decompressed (at most `limit` bytes) when it starts with the gzip magic, else unchanged."""
    if raw[:2] != GZIP_MAGIC:
        return raw
    return gunzip_capped(io.BytesIO(raw), limit, path)


def parse_idx(content: bytes | bytearray, path: str | Path = "<bytes>") -> np.ndarray:
    """Parse IDX content into an array in native byte order, validating every header field."""
    header = parse_header(content, path)
    dims, dtype, expected = header.dims, header.dtype, header.total
    if len(content) < expected:
        raise DatasetError(f"truncated body: dimensions {dims} need {expected} bytes, file has {len(content)}", path)
    if len(content) > expected:
        raise DatasetError(
            f"size/dimension mismatch: dimensions {dims} need {expected} bytes, "
            f"file has {len(content)} ({len(content) - expected} trailing)",
            path,
        )
    data = np.frombuffer(content, dtype, offset=header.length).reshape(dims)
    return data.astype(dtype.newbyteorder("="), copy=False)


def read_idx(path: str | Path) -> np.ndarray:
    """Read an IDX file (gzip or plain, detected from content) into a numpy array."""
    return parse_idx(read_file_bytes(path), path)


def encode_idx(array: np.ndarray) -> bytes:
    """The IDX encoding of an array of one of the format's six dtypes."""
    native = np.dtype(array.dtype).newbyteorder("=")
    if native not in CODE_OF_DTYPE:
        raise ValueError(f"IDX cannot store dtype {array.dtype}")
    if array.ndim == 0 or array.ndim > 255:
        raise ValueError("IDX stores arrays of 1 to 255 dimensions")
    code = CODE_OF_DTYPE[native]
    header = bytes([0, 0, code, array.ndim]) + np.asarray(array.shape, ">u4").tobytes()
    return header + np.ascontiguousarray(array, IDX_DTYPES[code]).tobytes()


def write_idx(path: str | Path, array: np.ndarray, compress: bool | None = None) -> Path:
    """Write an array as IDX, atomically; gzip when `compress` or when the name ends in .gz."""
    path = Path(path)
    if compress is None:
        compress = path.suffix == ".gz"
    payload = encode_idx(array)
    if compress:
        payload = gzip.compress(payload, compresslevel=6, mtime=0)
    return atomic_write_bytes(path, payload)
