"""Step: the anatomy of the checkpoint the lab saved — zip layout, pickle census, tensors by role
and layer, overhead — and a diff proving that load → save reproduces it bit for bit. With the
`keras_seed` option it also trains seed 003's Keras MLP and lists what its .h5 and .keras hold."""

from __future__ import annotations

import json
import time
from typing import Any

from rich.table import Table as RichTable

from dlscope.checkpoint import load_checkpoint, save_checkpoint
from dlscope.ckpt.anatomy import Anatomy
from dlscope.ckpt.diff import diff_checkpoints
from dlscope.ckpt.inspect import inspect_checkpoint
from dlscope.ckpt.show import kib
from dlscope.console import console, safe
from dlscope.report.blocks import Block, Code, Findings, Para, Table
from dlscope.steps.base import LabContext, LabStep

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


def print_summary(section: dict[str, Any]) -> None:
    t = section["totals"]
    if "pickles" not in section["layout"]:
        safe = "[good]no pickle (data only)[/]"
    else:
        safe = "[good]safe to torch.load[/]" if section["safe_to_load"] else "[bad]NOT safe to torch.load[/]"
    console.print(
        f"[path]{section['path']}[/]: {section['format']}, {section['file_bytes']:,} bytes, {safe}; "
        f"{t['tensors']} tensors in {t['storages']} storages ({kib(t['storage_bytes'])}), "
        f"overhead {kib(t['overhead_bytes'])}"
    )
    table = RichTable(box=None, padding=(0, 2))
    for col in ("role", "tensors", "elements", "bytes"):
        table.add_column(col, justify="left" if col == "role" else "right")
    for r in section["by_role"]:
        table.add_row(r["role"], f"{r['tensors']:,}", f"{r['elements']:,}", kib(r["bytes"]))
    console.print(table)


def torch_part(ctx: LabContext) -> dict[str, Any]:
    checkpoints = ctx.run.sub("checkpoints")
    final = checkpoints / "final.pt"
    start = time.perf_counter()
    anatomy = inspect_checkpoint(final, stats=True)
    inspect_seconds = time.perf_counter() - start
    section = compact(anatomy, ctx.run.rel(final))
    section["inspect_seconds"] = inspect_seconds
    print_summary(section)
    # load with weights_only, save again, compare every tensor: the round trip must be exact
    reloaded = checkpoints / "reloaded.pt"
    save_checkpoint(reloaded, load_checkpoint(final))
    diff = diff_checkpoints(final, reloaded)
    diff["a"]["path"], diff["b"]["path"] = ctx.run.rel(final), ctx.run.rel(reloaded)
    section["reload_diff"] = diff
    style = "good" if diff["identical"] else "bad"
    console.print(f"load → save → diff: [{style}]{diff['verdict']}[/]")
    return section


def keras_part(ctx: LabContext) -> dict[str, Any]:
    from dlscope.ckpt.keras_seed import train_seed_mlp

    assert ctx.data is not None, "the dataset step runs first"
    extra = ctx.options.extra
    n = extra.get("keras_train_subset") or len(ctx.data.train_labels)
    backend = extra.get("keras_backend", "torch")
    epochs = extra.get("keras_epochs", 1)
    with console.status(f"training seed 003's Keras MLP ({backend}) on {n:,} images, {epochs} epoch(s)"):
        trained = train_seed_mlp(
            ctx.data.train_images[:n],
            ctx.data.train_labels[:n],
            ctx.run.sub("keras"),
            epochs,
            batch_size=extra.get("keras_batch_size", 32),
            backend=backend,
            optimizer=extra.get("keras_optimizer", "adam"),
        )
    files = trained.pop("files")
    console.print(
        f"keras {trained['keras_version']} ({trained['backend']} backend, {trained['optimizer']}, batch "
        f"{trained['batch_size']}): trained in {trained['train_seconds']:.1f}s, accuracy {trained['accuracy'][-1]:.2%}"
    )
    console.print(profile_table(trained["profile"]))
    out = {"training": trained}
    for kind, path in files.items():
        anatomy = inspect_checkpoint(path, stats=kind == "tf_bundle")  # the bundle's CRC32Cs checked too
        out[kind] = compact(anatomy, ctx.run.rel(path))
        print_summary(out[kind])
    return out


def profile_table(profile: dict[str, Any]) -> RichTable:
    table = RichTable(
        title=f"top-10 operators, {profile['steps']} steps ({profile['profiler']})", title_justify="left", box=None
    )
    for col in PROFILE_COLUMNS:
        table.add_column(col, justify="left" if col == "operator" else "right")
    for row in profile_cells(profile):
        table.add_row(safe(row[0]), *(f"{c:,}" if isinstance(c, int) else f"{c:.2f}" for c in row[1:]))
    return table


PROFILE_COLUMNS = ["operator", "calls", "self ms/step", "self %"]


def profile_cells(profile: dict[str, Any]) -> list[list[Any]]:
    steps = max(profile["steps"], 1)
    return [[r["name"], r["calls"], r["self_us"] / 1000 / steps, r["self_pct"]] for r in profile["top"]]


def run(ctx: LabContext) -> dict[str, Any]:
    section: dict[str, Any] = {}
    if (ctx.run.path / "checkpoints" / "final.pt").is_file():  # the checkpoint step ran
        section["torch"] = torch_part(ctx)
    if ctx.options.extra.get("keras_seed"):
        section["keras"] = keras_part(ctx)
    return section


def training_rows(training: dict[str, Any]) -> list[list[str]]:
    """One row per part (loss, metrics, optimizer, its hyperparameters, scheduler, run config)."""
    rows = []
    for key, value in training.items():
        parts = value if isinstance(value, list) and all(isinstance(p, dict) for p in value) else [value]
        for part in parts:
            if isinstance(part, dict):
                settings = [f"{k}={v}" for k, v in part.items() if v is not None and not str(k).startswith("_")]
                rows.append([key, " ".join(settings)])
            elif part is not None:
                rows.append([key, str(part)])
    return rows


def seed_listing(model_config: dict[str, Any]) -> str:
    """model_config as the handout prints it: the model, then one line per layer."""
    inner = model_config.get("config", {})
    head = {k: v for k, v in model_config.items() if k != "config"}
    lines = [json.dumps({**head, "config": {k: v for k, v in inner.items() if k != "layers"}}), "layers:"]
    lines += [json.dumps(layer, separators=(", ", ": ")) for layer in inner.get("layers", [])]
    return "\n".join(lines)


def render_anatomy(a: dict[str, Any], stats_columns: bool) -> list[Block]:
    t = a["totals"]
    blocks: list[Block] = []
    levels = [(f["level"], f"{f['what']} ({f['where']})" if f["where"] else f["what"]) for f in a["findings"]]
    if "pickles" not in a["layout"]:
        levels.insert(0, ("good", f"{a['format']}: no pickle, data only — nothing in the file can run."))
    else:
        p = a["layout"]["pickles"][0]
        safe = "good" if a["safe_to_load"] else "bad"
        levels.insert(
            0,
            (
                safe,
                f"{p['where']}: pickle protocol {p['protocol']}, {p['opcodes']:,} opcodes; it names only "
                f"{len(p['globals'])} globals ({', '.join(p['globals'])}) — "
                + ("all on the allow-list: safe to torch.load." if a["safe_to_load"] else "NOT safe to torch.load."),
            ),
        )
    blocks.append(Findings(levels))
    members = a["layout"].get("zip_members")
    if members:
        rows = [
            [m["name"], m["header_offset"], m["data_offset"], m["size"], m["alignment"], m["crc32"]] for m in members
        ]
        more = a["layout"]["zip_members_total"] - len(members)
        aligned = all(m["alignment"] == 0 for m in members)
        caption = (
            "An uncompressed zip; every member's data starts on a 64-byte boundary, so torch can mmap it"
            if aligned
            else "Zip members, their offsets and CRC32s"
        )
        blocks.append(
            Table(
                ["zip member", "header @", "data @", "bytes", "offset mod 64", "CRC32"],
                rows,
                caption + (f" ({more} more data/N storages not listed)" if more > 0 else ""),
            )
        )
    if a.get("architecture"):
        arch = a["architecture"]
        columns = {
            "layer": [layer["name"] for layer in arch["layers"]],
            "class": [layer.get("class_name", "") for layer in arch["layers"]],
            "tensors": [", ".join(layer.get("tensors", [])) for layer in arch["layers"]],
            "config": [", ".join(f"{k}={v}" for k, v in layer.get("config", {}).items()) for layer in arch["layers"]],
        }
        shown = [name for name, cells in columns.items() if any(cells)]
        rows = [list(row) for row in zip(*(columns[name] for name in shown), strict=True)]
        blocks.append(Table(shown, rows, f"{arch['class_name']} (from {arch['source']})"))
    if a.get("training"):
        blocks.append(Table(["training config", "settings"], training_rows(a["training"])))
    columns = ["tensor", "dtype", "shape", "bytes", "storage @ offset", "role"]
    if stats_columns:
        columns += ["mean", "std", "zeros"]
    rows = []
    for x in a["tensors"]:
        where = f"@ {x['offset']:,}" if x["offset"] is not None else "—"
        row = [
            x["name"],
            x["dtype"],
            str(tuple(x["shape"])),
            x["nbytes"],
            (x["storage"] + " " if x["storage"] != x["name"] else "") + where,
            x["role"],
        ]
        if stats_columns:
            s = x["stats"] or {}
            row += [s.get("mean"), s.get("std"), f"{s['zeros']:.1%}" if s else None]
        rows.append(row)
    blocks.append(Table(columns, rows, "Every tensor, where its bytes are, and what it is for"))
    blocks.append(
        Table(
            ["role", "tensors", "elements", "bytes"],
            [[r["role"], r["tensors"], r["elements"], r["bytes"]] for r in a["by_role"]],
            f"{t['tensors']} tensors, {t['storage_bytes']:,} bytes of storage in a {a['file_bytes']:,}-byte file: "
            f"{t['overhead_bytes']:,} bytes ({t['overhead_bytes'] / a['file_bytes']:.1%}) are headers, metadata "
            "and padding",
        )
    )
    groups = a["by_group"]
    if groups:
        roles = [r for r in ("parameter", "buffer", "optimizer") if any(r in g for g in groups)]
        blocks.append(
            Table(
                ["layer", *roles, "total bytes"],
                [[g["group"], *(g.get(r) for r in roles), g["bytes"]] for g in groups],
                "Bytes per layer: optimizer state is mapped to the parameter it belongs to",
            )
        )
    for s in a["shared_storages"]:
        blocks.append(
            Para(
                f"Storage {s['storage']} ({s['storage_bytes']:,} bytes) is shared by {', '.join(s['tensors'])}: "
                f"the views use {s['viewed_bytes']:,} bytes, the whole storage is saved."
            )
        )
    return blocks


def render(section: dict[str, Any]) -> list[Block]:
    blocks: list[Block] = []
    if "torch" in section:
        a = section["torch"]
        opt = a["by_role"]
        optimizer = next((r["bytes"] for r in opt if r["role"] == "optimizer"), 0)
        params = sum(r["bytes"] for r in opt if r["role"] in ("parameter", "buffer"))
        blocks.append(
            Para(
                f"What {a['path']} holds, read by dlscope ckpt inspect without torch.load: the pickle goes "
                "through a restricted unpickler that imports nothing, tensor bytes are located by zip member "
                f"and offset and read only for statistics ({a['inspect_seconds'] * 1000:.0f} ms). The "
                f"optimizer state is {optimizer / max(params, 1):.1f}× the model's own weights"
                " (Adam keeps exp_avg and exp_avg_sq per parameter)."
            )
        )
        blocks += render_anatomy(a, stats_columns=True)
        d = a["reload_diff"]
        blocks.append(
            Findings(
                [
                    (
                        "good" if d["identical"] else "bad",
                        f"Reload is exact: {d['a']['path']} loaded with weights_only and saved again as "
                        f"{d['b']['path']} — dlscope ckpt diff: {d['verdict']}.",
                    )
                ]
            )
        )
    if "keras" in section:
        k = section["keras"]
        tr = k["training"]
        blocks.append(
            Para(
                f"Seed 003's MLP, trained with Keras {tr['keras_version']} on the {tr['backend']} backend "
                f"({tr['samples']:,} images, {tr['epochs']} epoch(s), {tr.get('optimizer', 'adam')}, batch "
                f"{tr.get('batch_size', 32)}, accuracy {tr['accuracy'][-1]:.2%}) and saved "
                "with model.save('model.h5') as in the handout: the HDF5 root attributes hold model_config and "
                "training_config, the groups model_weights/<layer>/… and optimizer_weights/… the tensors."
            )
        )
        h5 = k["h5"]
        if "model_config" in h5["layout"]:
            blocks.append(Code("model_config = " + seed_listing(h5["layout"]["model_config"]), "json"))
        if "training_config" in h5["layout"]:
            blocks.append(Code("training_config = " + json.dumps(h5["layout"]["training_config"]), "json"))
        blocks += render_anatomy(h5, stats_columns=False)
        blocks.append(
            Para(
                "The same model saved as Keras 3's native .keras: a zip of metadata.json, config.json and "
                "model.weights.h5."
            )
        )
        blocks += render_anatomy(k["keras"], stats_columns=False)
        if "tf_bundle" in k:
            blocks.append(
                Para(
                    "The handout's other format, TensorFlow's own checkpoint (tf.train.Checkpoint): a LevelDB index "
                    "of every tensor's dtype, shape, offset and CRC32C, and a data shard. Its object graph says "
                    "which layer each variable belongs to and which variable each optimizer slot serves."
                )
            )
            blocks += render_anatomy(k["tf_bundle"], stats_columns=False)
            variable_map = k["tf_bundle"]["layout"].get("variable_map", [])
            if variable_map:
                blocks.append(
                    Table(
                        ["tensor", "layer", "variable", "slot"],
                        [[r["tensor"], r["layer"], r["variable"], r["slot"] or ""] for r in variable_map],
                        "The object graph decoded: variables → layers and optimizer slots",
                    )
                )
        if "profile" in tr:
            blocks.append(
                Table(
                    PROFILE_COLUMNS,
                    profile_cells(tr["profile"]),
                    f"Top-10 operators by self time over {tr['profile']['steps']} training steps "
                    f"({tr['profile']['profiler']}, {tr['backend']} backend): the same table for either backend",
                )
            )
    return blocks


STEP = LabStep("ckpt_anatomy", "Checkpoint anatomy", run, render)
