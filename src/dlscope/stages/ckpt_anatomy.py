"""Step: the anatomy of the checkpoint the lab saved — zip layout, pickle census, tensors by role
and layer, overhead — and a diff proving that load → save reproduces it bit for bit. With the
`keras_seed` option it also trains seed 003's Keras MLP (torch or TensorFlow backend), lists what its
.h5, .keras and TF checkpoint hold, and profiles it."""

from __future__ import annotations

import time
from typing import Any

from dlscope.checkpoint import save_checkpoint
from dlscope.ckpt.anatomy import Anatomy
from dlscope.ckpt.diff import diff_checkpoints
from dlscope.ckpt.inspect import inspect_checkpoint
from dlscope.restore import load_checkpoint
from dlscope.stages.base import Context, Step

MEMBER_ROWS = 12  # zip members listed in the report; the rest are data/N storages like them


def compact(anatomy: Anatomy, rel: str) -> dict[str, Any]:
    """The anatomy as results.json keeps it: everything but the per-member list beyond MEMBER_ROWS."""
    out = anatomy.to_dict()
    out["path"] = rel
    members = out["layout"].get("zip_members")
    if members is not None:
        out["layout"]["zip_members_total"] = len(members)
        out["layout"]["zip_members"] = members[:MEMBER_ROWS]
    return out


def torch_part(ctx: Context) -> dict[str, Any]:
    checkpoints = ctx.run.sub("checkpoints")
    final = checkpoints / "final.pt"
    start = time.perf_counter()
    anatomy = inspect_checkpoint(final, stats=True)
    inspect_seconds = time.perf_counter() - start
    section = compact(anatomy, ctx.run.rel(final))
    section["inspect_seconds"] = inspect_seconds
    # load with weights_only, save again, compare every tensor: the round trip must be exact
    reloaded = checkpoints / "reloaded.pt"
    save_checkpoint(reloaded, load_checkpoint(final))
    diff = diff_checkpoints(final, reloaded)
    diff["a"]["path"], diff["b"]["path"] = ctx.run.rel(final), ctx.run.rel(reloaded)
    section["reload_diff"] = diff
    return section


def keras_part(ctx: Context) -> dict[str, Any]:
    from dlscope.ckpt.keras_seed import train_seed_mlp

    assert ctx.data is not None
    options = ctx.steps.ckpt_anatomy
    n = options.keras_train_subset or len(ctx.data.train_labels)
    backend = options.keras_backend
    with ctx.task(f"training seed 003's Keras MLP ({backend}) on {n:,} images, {options.keras_epochs} epoch(s)"):
        trained = train_seed_mlp(
            ctx.data.train_images[:n],
            ctx.data.train_labels[:n],
            ctx.run.sub("keras"),
            options.keras_epochs,
            batch_size=options.keras_batch_size,
            backend=backend,
            optimizer=options.keras_optimizer,
        )
    files = trained.pop("files")
    out = {"training": trained}
    for kind, path in files.items():
        anatomy = inspect_checkpoint(path, stats=kind == "tf_bundle")  # the bundle's CRC32Cs checked too
        out[kind] = compact(anatomy, ctx.run.rel(path))
    return out


def run(ctx: Context) -> dict[str, Any]:
    section: dict[str, Any] = {}
    if (ctx.run.path / "checkpoints" / "final.pt").is_file():  # the checkpoint step ran
        section["torch"] = torch_part(ctx)
    if ctx.steps.ckpt_anatomy.keras_seed:
        section["keras"] = keras_part(ctx)
    return section


STEP = Step("ckpt_anatomy", run, needs=("dataset",))
