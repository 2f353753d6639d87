"""The IDX file format (LeCun's MNIST container), read and written, gzip or plain.

Layout: two zero bytes, a dtype code, the number of dimensions, then one big-endian uint32 per
dimension, then the data in C order, big-endian.
"""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path

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


def read_file_bytes(path: str | Path) -> bytes:
    """The content of an IDX file, decompressed when it starts with the gzip magic."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise DatasetError("file not found", path) from None
    except OSError as e:
        raise DatasetError(f"cannot read: {e.strerror}", path) from None
    return maybe_gunzip(raw, path)


def maybe_gunzip(raw: bytes, path: str | Path) -> bytes:
    """`raw` decompressed when it starts with the gzip magic, else unchanged."""
    if raw[:2] != GZIP_MAGIC:
        return raw
    try:
        return gzip.decompress(raw)
    except (gzip.BadGzipFile, EOFError, zlib.error) as e:
        reason = "truncated gzip stream" if isinstance(e, EOFError) else f"corrupt gzip data ({e})"
        raise DatasetError(reason, path) from None


def parse_idx(content: bytes, path: str | Path = "<bytes>") -> np.ndarray:
    """Parse IDX content into an array in native byte order, validating every header field."""
    if len(content) < 4:
        raise DatasetError(f"too short for an IDX header ({len(content)} bytes)", path)
    if content[0] != 0 or content[1] != 0:
        raise DatasetError(f"wrong magic: first two bytes are {content[:2].hex()}, IDX files start with 0000", path)
    code, ndim = content[2], content[3]
    if code not in IDX_DTYPES:
        raise DatasetError(f"unknown IDX dtype code 0x{code:02X}", path)
    if ndim == 0:
        raise DatasetError("IDX header declares zero dimensions", path)
    header_len = 4 + 4 * ndim
    if len(content) < header_len:
        raise DatasetError(f"truncated header: {ndim} dimensions need {header_len} bytes", path)
    dims = tuple(int(d) for d in np.frombuffer(content, ">u4", count=ndim, offset=4))
    dtype = IDX_DTYPES[code]
    expected = header_len + int(np.prod(dims, dtype=np.int64)) * dtype.itemsize
    if len(content) < expected:
        raise DatasetError(
            f"truncated body: dimensions {dims} need {expected} bytes, file has {len(content)}",
            path,
        )
    if len(content) > expected:
        raise DatasetError(
            f"size/dimension mismatch: dimensions {dims} need {expected} bytes, "
            f"file has {len(content)} ({len(content) - expected} trailing)",
            path,
        )
    data = np.frombuffer(content, dtype, offset=header_len).reshape(dims)
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
