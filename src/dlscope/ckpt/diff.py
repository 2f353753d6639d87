"""`diff_checkpoints(a, b)`: which tensors were added, removed, reshaped, and how far the rest moved.

Both files go through `inspect_checkpoint` (never torch.load), then each common tensor is read
once from each file. "identical" means every tensor is equal bit for bit and the names match.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from dlscope.ckpt.inspect import inspect_checkpoint


def compare(x: torch.Tensor, y: torch.Tensor) -> dict[str, Any]:
    """Bit equality, then the largest absolute and relative (to |a|) difference over finite pairs."""
    same_bits = (
        x.dtype == y.dtype
        and x.shape == y.shape
        and torch.equal(x.reshape(-1).view(torch.uint8), y.reshape(-1).view(torch.uint8))
    )
    if same_bits:
        return {"identical": True, "max_abs": 0.0, "max_rel": 0.0}
    a, b = x.to(torch.float64), y.to(torch.float64)
    diff = (a - b).abs()
    finite = diff.isfinite()
    max_abs = diff[finite].max().item() if finite.any() else float("nan")
    rel = diff[finite] / a.abs()[finite].clamp_min(torch.finfo(torch.float64).tiny)
    return {
        "identical": False,
        "max_abs": max_abs,
        "max_rel": rel.max().item() if rel.numel() else float("nan"),
        "nonfinite_mismatch": int((~finite).sum()),
    }


def diff_checkpoints(path_a: str | Path, path_b: str | Path) -> dict[str, Any]:
    a, b = inspect_checkpoint(path_a), inspect_checkpoint(path_b)
    ta, tb = {t.name: t for t in a.tensors}, {t.name: t for t in b.tensors}
    rows, changed_layout = [], []
    for name in ta.keys() & tb.keys():
        x, y = ta[name], tb[name]
        if (x.dtype, x.shape) != (y.dtype, y.shape):
            changed_layout.append({"name": name, "a": f"{x.dtype}{x.shape}", "b": f"{y.dtype}{y.shape}"})
            continue
        if x.read is None or y.read is None:
            continue
        rows.append({"name": name, "dtype": x.dtype, "shape": x.shape, **compare(x.read(), y.read())})
    order = {name: i for i, name in enumerate(ta)}
    rows.sort(key=lambda r: order[r["name"]])
    added = [n for n in tb if n not in ta]
    removed = [n for n in ta if n not in tb]
    differing = [r for r in rows if not r["identical"]]
    metadata_changed = sorted(
        k for k in a.metadata.keys() | b.metadata.keys() if a.metadata.get(k) != b.metadata.get(k)
    )
    return {
        "a": {"path": str(path_a), "format": a.format, "tensors": len(a.tensors)},
        "b": {"path": str(path_b), "format": b.format, "tensors": len(b.tensors)},
        "identical": not (added or removed or changed_layout or differing),
        "added": added,
        "removed": removed,
        "shape_or_dtype_changed": changed_layout,
        "tensors": rows,
        "metadata_changed": metadata_changed,
    }
