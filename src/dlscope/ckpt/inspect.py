"""`inspect_checkpoint(path)`: detect the format from the bytes, read its anatomy, never execute it.

Any fault in the file becomes a `CheckpointError` naming it; reads are bounded by the sizes the
file's own directory declares (checked against the file size first), so a hostile length field
cannot make dlscope allocate gigabytes or loop.
"""

from __future__ import annotations

import math
import struct
import zipfile
import zlib
from pathlib import Path
from typing import BinaryIO

from dlscope.ckpt import dcp_fmt, keras_fmt, safetensors_fmt, torchfmt
from dlscope.ckpt.anatomy import Anatomy
from dlscope.ckpt.hdf5_probe import probe_hdf5
from dlscope.ckpt.sniff import sniff
from dlscope.ckpt.tf_fmt import SHARD_NAME, index_path_for, inspect_tf
from dlscope.ckpt.zipdir import open_zip
from dlscope.errors import CheckpointError

NATIVE_STATS_DTYPES = ("float64", "float32", "int64", "int32")  # torch has fast kernels for these
CHUNK = 1 << 24  # elements per step when computing statistics (bounded extra memory)


def inspect_checkpoint(path: str | Path, stats: bool = False) -> Anatomy:
    """The anatomy of a checkpoint; with `stats`, read every tensor once for min/max/mean/std/zeros/NaN/Inf."""
    path = Path(path)
    if dcp_fmt.is_dcp_dir(path) or (path.name == dcp_fmt.METADATA and dcp_fmt.is_dcp_dir(path.parent)):
        anatomy = dcp_fmt.inspect_dcp(path if path.is_dir() else path.parent)
        if stats:
            add_stats(anatomy)
        return anatomy
    if not path.is_file() or SHARD_NAME.search(path.name):
        # a TF checkpoint is named by its prefix (model.ckpt → model.ckpt.index + data shards) or a shard
        index = index_path_for(path)
        if index is None and not path.is_file():
            raise CheckpointError("not a file (a directory?)" if path.exists() else "no such file", path)
        path = index or path
    file_bytes = path.stat().st_size
    if file_bytes == 0:
        raise CheckpointError("empty file", path)
    with open(path, "rb") as f:
        head = f.read(16)
        f.seek(max(0, file_bytes - 8))
        kind = sniff(head, f.read(8))
        f.seek(0)
        try:
            anatomy = _inspect(path, f, kind, head, file_bytes, stats)
        except CheckpointError:
            raise
        except (
            ValueError,  # includes UnicodeDecodeError, json errors, zipfile.BadZipFile's relatives
            TypeError,
            KeyError,
            IndexError,
            OverflowError,
            RecursionError,
            OSError,
            RuntimeError,
            zipfile.BadZipFile,
            zlib.error,
            struct.error,
        ) as e:
            # a fault a reader did not name: still one line, with the format it was read as
            first = str(e).strip().splitlines()[0] if str(e).strip() else ""
            raise CheckpointError(f"malformed {kind} file: {type(e).__name__}: {first}"[:300], path) from None
    return anatomy


def _inspect(path: Path, f: BinaryIO, kind: str, head: bytes, file_bytes: int, stats: bool) -> Anatomy:
    if kind == "zip":
        zf = open_zip(path, f)
        names = set(zf.namelist())
        if "config.json" in names and ("model.weights.h5" in names or "metadata.json" in names):
            probe_hdf5(path)  # in a child with a timeout: HDF5 can loop forever on a malformed file
            anatomy = keras_fmt.inspect_keras_zip(path, f, zf, file_bytes)
        elif any(n.endswith("/data.pkl") for n in names):
            anatomy = torchfmt.inspect_torch_zip(path, f, zf, file_bytes, check=stats)
        else:
            raise CheckpointError(
                f"zip archive that is neither a torch.save file nor a .keras model ({len(names)} members)", path
            )
    elif kind == "hdf5":
        probe_hdf5(path)
        anatomy = keras_fmt.inspect_hdf5(path, f, file_bytes)
    elif kind == "torch-legacy":
        anatomy = torchfmt.inspect_legacy(path, f, file_bytes)
    elif kind == "safetensors":
        anatomy = safetensors_fmt.inspect_safetensors(path, f, file_bytes)
    elif kind == "tf-index":
        anatomy = inspect_tf(path, f, file_bytes, check=stats)
    elif kind == "pickle":
        anatomy = torchfmt.inspect_bare_pickle(path, f, file_bytes)
    else:
        raise CheckpointError(f"unknown format (first bytes {head[:8].hex(' ')}); wrong magic", path)
    if stats:
        add_stats(anatomy)
    return anatomy


def add_stats(anatomy: Anatomy) -> None:
    for t in anatomy.tensors:
        if t.read is not None:
            t.stats = tensor_stats(t.read())


def tensor_stats(x) -> dict[str, float | int] | None:  # x: torch.Tensor
    """min/max/mean/std (population) over finite values, chunk by chunk; counts of zeros, NaN, Inf.

    Cheap passes first: count_nonzero for zeros, aminmax (NaN propagates, so finite extremes mean no
    NaN and no Inf); the NaN/Inf masks are built only for chunks that have some. Mean and variance
    come from var_mean (Welford) in float32 for float32/16 data and float64 otherwise, merged
    across chunks exactly (Chan et al.).
    """
    import torch  # only --stats computes statistics: inspecting needs no torch

    if x.is_complex():
        return None
    flat = x.reshape(-1)
    floating = flat.is_floating_point()
    count, mean, m2 = 0, 0.0, 0.0
    lo, hi = float("inf"), float("-inf")
    zeros = nans = infs = 0
    for start in range(0, flat.numel(), CHUNK):
        chunk = flat[start : start + CHUNK]
        # bool, float8, small ints: few kernels exist for them
        if str(chunk.dtype).removeprefix("torch.") not in NATIVE_STATS_DTYPES:
            chunk = chunk.to(torch.float32 if floating else torch.float64)
        zeros += chunk.numel() - int(torch.count_nonzero(chunk))
        chunk_lo, chunk_hi = (float(v) for v in torch.aminmax(chunk))
        if floating and not (math.isfinite(chunk_lo) and math.isfinite(chunk_hi)):
            nans += int(chunk.isnan().sum())
            infs += int(chunk.isinf().sum())
            chunk = chunk[chunk.isfinite()]
            if chunk.numel() == 0:
                continue
            chunk_lo, chunk_hi = (float(v) for v in torch.aminmax(chunk))
        lo, hi = min(lo, chunk_lo), max(hi, chunk_hi)
        n = chunk.numel()
        precise = chunk if chunk.dtype in (torch.float32, torch.float64) else chunk.to(torch.float64)
        var, chunk_mean = (v.item() for v in torch.var_mean(precise, correction=0))
        delta = chunk_mean - mean
        total = count + n
        mean += delta * n / total
        m2 += var * n + delta * delta * count * n / total
        count = total
    numel = flat.numel()
    return {
        "min": lo if count else None,
        "max": hi if count else None,
        "mean": mean if count else None,
        "std": (m2 / count) ** 0.5 if count else None,
        "zeros": zeros / numel if numel else 0.0,
        "nan": nans,
        "inf": infs,
    }
