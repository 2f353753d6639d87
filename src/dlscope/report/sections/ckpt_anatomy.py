"""Section ckpt_anatomy: the anatomy of the checkpoint the lab saved — zip layout, pickle census, tensors by role"""

from __future__ import annotations

import json
from typing import Any

from dlscope.report.blocks import Block, Code, Findings, Para, Table
from dlscope.report.wording import Words, located

TITLE = "Checkpoint anatomy"

# what a format reader found (dlscope.ckpt.anatomy's findings), each in words; the place it cites follows
WORDS: Words = {
    "ckpt.off_allow_list": lambda v: f"{v['opcode']} {v['name']} is off the torch.load(weights_only) allow-list",
    "ckpt.view_outside_storage": lambda v: f"tensor view reaches outside its storage {v['storage']}",
    "ckpt.device_storages": lambda v: (
        f"storages saved from {', '.join(v['devices'])}: torch.load on a machine "
        "without that device needs map_location='cpu'"
    ),
    "ckpt.member_crc": lambda v: "CRC32 mismatch: the member's bytes are corrupt",
    "ckpt.misaligned": lambda v: f"{v['storages']} storages not 64-byte aligned (no mmap)",
    "ckpt.shard_missing": lambda v: "data shard missing: tensor bytes cannot be read",
    "ckpt.big_endian": lambda v: "big-endian bundle: statistics are not computed",
    "ckpt.past_shard": lambda v: f"bytes {v['offset']:,}+{v['bytes']:,} run past its shard",
    "ckpt.size_mismatch": lambda v: f"{v['bytes']:,} bytes for {v['elements']:,} {v['dtype']}",
    "ckpt.string_unreadable": lambda v: f"string tensor unreadable: {v['error']}",
    "ckpt.crc32c_mismatch": lambda v: f"CRC32C mismatch: stored {v['stored']}, bytes give {v['computed']}",
    "ckpt.object_graph_unreadable": lambda v: f"object graph unreadable ({v['error']}): layers guessed from the keys",
    "ckpt.optimizer_unmatched": lambda v: "optimizer variables do not line up with the layers' shapes",
    "ckpt.no_weights": lambda v: "no model.weights.h5 member: the model has no saved weights",
    "ckpt.dcp_written": lambda v: (
        f"Written by {len(v['ranks'])} rank(s) ({', '.join(map(str, v['ranks']))}) into "
        f"{v['files']} file(s); each item is a torch.save archive of its own: {v['tensor_bytes']:,} bytes of tensor "
        f"data in {v['item_bytes']:,} bytes of items"
    ),
    "ckpt.dcp_sharded": lambda v: f"Sharded across ranks: {', '.join(v['tensors'])} chunks",
    "ckpt.dcp_metadata_pickle": lambda v: (
        f"dcp.load reads {v['metadata']} with plain pickle.load (torch's "
        "FileSystemReader), not weights_only: load only DCP checkpoints you trust"
    ),
    "ckpt.unowned_data": lambda v: f"{v['bytes']:,} bytes of the data area belong to no tensor",
}
# where an architecture was read from (the readers' `source`)
SOURCES = {
    "modules": "the pickled module objects",
    "config": "the checkpoint's config and its parameter names",
    "names": "parameter names",
}


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


def _more(total: int, limit: int | None) -> str:
    return f" — {total - limit:,} more not shown (--limit N, or --json for all)" if limit and total > limit else ""


def verdict_finding(a: dict[str, Any]) -> tuple[str, str]:
    if "pickles" not in a["layout"]:
        return "good", f"{a['format']}: no pickle, data only — nothing in the file can run."
    pickles = a["layout"]["pickles"]
    names = sorted({g for p in pickles for g in p["globals"]})
    listed = ", ".join(names[:12]) + (f", … {len(names) - 12:,} more" if len(names) > 12 else "")
    opcodes = sum(p["opcodes"] for p in pickles)
    where = pickles[0]["where"] if len(pickles) == 1 else f"{len(pickles)} pickles"
    head = f"{where}: pickle protocol {pickles[0]['protocol']}, {opcodes:,} opcodes; it names {len(names)} globals"
    loader = "dcp.load" if "dcp" in a["layout"] else "torch.load"
    if a["safe_to_load"]:
        return "good", f"{head} ({listed}) — all on the allow-list: safe to {loader}."
    return "bad", f"{head} ({listed}) — NOT safe to {loader}."


def layout_blocks(a: dict[str, Any], limit: int | None) -> list[Block]:
    """Where the bytes are: zip members, pickle streams, the safetensors header, a TF index, HDF5 groups."""
    layout = a["layout"]
    blocks: list[Block] = []
    members = layout.get("zip_members")
    if members:
        shown = members[:limit] if limit else members
        rows = [
            [m["name"], m["header_offset"], m["data_offset"], m["size"], m["alignment"], m["crc32"], m.get("crc_ok")]
            for m in shown
        ]
        total = layout.get("zip_members_total", len(members))
        aligned = all(m["alignment"] == 0 for m in members)
        caption = (
            "An uncompressed zip; every member's data starts on a 64-byte boundary, so torch can mmap it"
            if aligned
            else "Zip members, their offsets and CRC32s"
        )
        blocks.append(
            Table(
                ["zip member", "header @", "data @", "bytes", "mod 64", "CRC32", "CRC ok"],
                rows,
                caption + _more(total, len(shown)),
                legend="@: byte offset in the file; mod 64: the data offset's distance from a 64-byte boundary",
                optional=("CRC ok", "header @"),
            )
        )
    for key, value in layout.get("records", {}).items():
        blocks.append(Para(f"{key}: {value}"))
    for p in layout.get("pickles", []):
        calls = ", ".join(f"{name} ×{n}" for name, n in p["calls"].items()) if p.get("calls") else "none"
        text = (
            f"pickle {p['where']}: protocol {p['protocol']}, {p['opcodes']:,} opcodes, {p['bytes']:,} bytes; "
            f"globals: {', '.join(p['globals']) or 'none'}; calls: {calls}."
        )
        blocks.append(Para(text))
    if "safetensors_header" in layout:
        h = layout["safetensors_header"]
        text = (
            f"safetensors header: {h['header_bytes']:,} bytes of JSON, data from byte {h['data_offset']:,}; "
            f"{h['tensors']} tensors; metadata {json.dumps(h['metadata'])[:200]}"
        )
        blocks.append(Para(text))
    if "tf_index" in layout:
        tf = layout["tf_index"]
        text = (
            f"TF index: a LevelDB table of {tf['entries']:,} entries in {tf['data_blocks']} data blocks; "
            f"header {json.dumps(tf['header'])}"
        )
        blocks.append(Para(text))
        blocks.append(
            Table(
                ["file", "bytes"],
                [[f["path"], f["bytes"] if f["bytes"] is not None else "missing"] for f in layout["files"]],
            )
        )
    if "dcp" in layout:
        dcp = layout["dcp"]
        blocks.append(
            Table(
                ["file", "rank", "items", "tensors", "tensor bytes", "file bytes"],
                [[f["file"], f["rank"], f["items"], f["tensors"], f["tensor_bytes"], f["bytes"]] for f in dcp["files"]],
                f"DCP {dcp['version']}: {dcp['entries']} state-dict entries in {dcp['metadata_bytes']:,} bytes of "
                "metadata; the files each rank wrote",
                legend="rank: from the file name __<rank>_<n>.distcp; items: entries stored in the file (tensors "
                "and pickled values), each a torch.save archive",
            )
        )
    for h5 in layout.get("hdf5", []):
        groups = h5["groups"][:limit] if limit else h5["groups"]
        rows = [["/" + g["path"], "  ".join(f"{k}={str(v)[:60]}" for k, v in g["attributes"].items())] for g in groups]
        caption = f"HDF5 {h5['where']}: {len(h5['groups'])} groups; root attributes {', '.join(h5['root_attributes'])}"
        blocks.append(Table(["group", "attributes"], rows, caption + _more(len(h5["groups"]), len(groups))))
    return blocks


def stats_row(x: dict[str, Any]) -> list[Any]:
    """A tensor's --stats figures as cells (— for a tensor that has none)."""
    s = x.get("stats") or {}
    zeros = round(100 * s["zeros"], 1) if s else None
    return [x["name"], *(s.get(k) for k in ("min", "max", "mean", "std")), zeros, s.get("nan"), s.get("inf")]


def render_anatomy(a: dict[str, Any], stats_columns: bool, limit: int | None = None) -> list[Block]:
    """A checkpoint's anatomy (`Anatomy.to_dict()`): the lab's section and `dlscope ckpt inspect` alike."""
    t = a["totals"]
    levels = [located(f, WORDS) for f in a["findings"]]
    if limit and len(levels) > limit:  # a hostile pickle can name 100,000 globals
        levels = [*levels[:limit], ("info", f"{len(levels) - limit:,} more findings (--limit N, or --json for all)")]
    blocks: list[Block] = [
        Para(f"{a['path']}: {a['format']}, {a['file_bytes']:,} bytes"),
        Findings([verdict_finding(a), *levels]),
        *layout_blocks(a, limit),
    ]
    if a.get("architecture"):
        arch = a["architecture"]
        columns = {
            "layer": [layer["name"] or "<root>" for layer in arch["layers"]],
            "class": [layer.get("class_name", "") for layer in arch["layers"]],
            "tensors": [", ".join(layer.get("tensors", [])) for layer in arch["layers"]],
            "config": [", ".join(f"{k}={v}" for k, v in layer.get("config", {}).items()) for layer in arch["layers"]],
        }
        shown = [name for name, cells in columns.items() if any(cells)]
        rows = [list(row) for row in zip(*(columns[name] for name in shown), strict=True)]
        blocks.append(Table(shown, rows, f"{arch['class_name']} (from {SOURCES.get(arch['source'], arch['source'])})"))
    if a.get("training"):
        blocks.append(Table(["training config", "settings"], training_rows(a["training"])))
    variable_map = a["layout"].get("variable_map")
    if variable_map:
        shown_map = variable_map[:limit] if limit else variable_map
        blocks.append(
            Table(
                ["tensor", "layer", "variable", "slot"],
                [
                    [
                        r["tensor"].removesuffix("/.ATTRIBUTES/VARIABLE_VALUE"),
                        r["layer"],
                        r["variable"],
                        r["slot"] or "",
                    ]
                    for r in shown_map
                ],
                "Variables → layers and optimizer slots (a TF checkpoint's object graph; Keras 3's optimizer "
                "variables by their order)" + _more(len(variable_map), len(shown_map)),
            )
        )
    tensors = a["tensors"][:limit] if limit else a["tensors"]
    # a DCP directory: the rank whose file holds each tensor (or shard), kept at any width
    writer = {f["file"]: f["rank"] for f in a["layout"]["dcp"]["files"]} if "dcp" in a["layout"] else None
    columns = ["tensor", "dtype", "shape", "bytes", "storage @ offset", *(["rank"] if writer else []), "role"]
    rows = []
    for x in tensors:
        where = f"@ {x['offset']:,}" if x["offset"] is not None else "not contiguous"
        rank = [writer.get(x["storage"].split("#")[0])] if writer else []
        rows.append(
            [
                x["name"],
                x["dtype"],
                "×".join(str(d) for d in x["shape"]) or "scalar",
                x["nbytes"],
                (x["storage"] + " " if x["storage"] != x["name"] else "") + where,
                *rank,
                x["role"],
            ]
        )
    blocks.append(
        Table(
            columns,
            rows,
            "Every tensor, where its bytes are, and what it is for" + _more(len(a["tensors"]), len(tensors)),
            optional=("storage @ offset", "dtype"),
        )
    )
    if stats_columns and any(x.get("stats") for x in tensors):
        blocks.append(
            Table(
                ["tensor", "min", "max", "mean", "std", "zeros %", "NaN", "Inf"],
                [stats_row(x) for x in tensors],
                "Tensor statistics (finite values; std is the population's)",
                optional=("min", "max"),
            )
        )
    if a.get("metadata"):
        items = list(a["metadata"].items())
        shown_items = items[:limit] if limit else items
        blocks.append(
            Table(
                ["metadata", "value"],
                [[k, str(v)[:200]] for k, v in shown_items],
                f"{len(items)} non-tensor entries" + _more(len(items), len(shown_items)),
            )
        )
    blocks.append(
        Table(
            ["role", "tensors", "elements", "bytes"],
            [[r["role"], r["tensors"], r["elements"], r["bytes"]] for r in a["by_role"]],
            f"{t['tensors']} tensors, {t['storage_bytes']:,} bytes of storage in a {a['file_bytes']:,}-byte file: "
            f"{t['overhead_bytes']:,} bytes ({t['overhead_bytes'] / max(a['file_bytes'], 1):.1%}) are headers, "
            "metadata and padding",
        )
    )
    groups = a["by_group"]
    if groups:
        roles = [r for r in ("parameter", "buffer", "optimizer") if any(r in g for g in groups)]
        shown_groups = groups[:limit] if limit else groups
        blocks.append(
            Table(
                ["layer", *roles, "total bytes"],
                [[g["group"], *(g.get(r) for r in roles), g["bytes"]] for g in shown_groups],
                "Bytes per layer: optimizer state is mapped to the parameter it belongs to"
                + _more(len(groups), len(shown_groups)),
            )
        )
    for s in a["shared_storages"]:
        shared = (
            f"Storage {s['storage']} ({s['storage_bytes']:,} bytes) is shared by {', '.join(s['tensors'])}: the "
            f"views use {s['viewed_bytes']:,} bytes, the whole storage is saved."
        )
        blocks.append(Findings([("warn", shared)]))
    return blocks


def diff_verdict(result: dict[str, Any]) -> str:
    """`ckpt diff`'s answer in one line: identical, or how many tensors differ and the largest change."""
    rows, added, removed = result["tensors"], result["added"], result["removed"]
    if result["identical"]:
        return f"identical: all {len(rows)} tensors equal bit for bit"
    differing = [r for r in rows if not r["identical"]]
    worst = max(differing, key=lambda r: r["max_abs"], default=None)
    parts = [f"{len(differing)} of {len(rows)} common tensors differ"]
    if worst is not None:
        parts.append(f"largest |Δ| {worst['max_abs']:.3g} in {worst['name']}")
    if added or removed:
        parts.append(f"{len(added)} added, {len(removed)} removed")
    if result["shape_or_dtype_changed"]:
        parts.append(f"{len(result['shape_or_dtype_changed'])} changed shape or dtype")
    return "; ".join(parts)


def render_diff(result: dict[str, Any], limit: int | None = None) -> list[Block]:
    """`dlscope ckpt diff`: what was added, removed or changed between two checkpoints."""
    blocks: list[Block] = [
        Table(
            ["", "file", "format", "tensors"],
            [[side, result[side]["path"], result[side]["format"], result[side]["tensors"]] for side in ("a", "b")],
        )
    ]
    items = []
    for key, label in (("added", "only in b"), ("removed", "only in a")):
        if result[key]:
            names = result[key][:limit] if limit else result[key]
            items.append(("warn", f"{label}: " + ", ".join(names) + _more(len(result[key]), len(names))))
    for c in result["shape_or_dtype_changed"]:
        items.append(("warn", f"changed {c['name']}: {c['a']} → {c['b']}"))
    if result["metadata_changed"]:
        items.append(("info", "metadata that differs: " + ", ".join(result["metadata_changed"][:limit])))
    items.append(("good" if result["identical"] else "bad", diff_verdict(result)))
    blocks.append(Findings(items))
    differing = sorted((r for r in result["tensors"] if not r["identical"]), key=lambda r: -r["max_abs"])
    if differing:
        shown = differing[:limit] if limit else differing
        blocks.append(
            Table(
                ["tensor", "dtype", "shape", "max |Δ|", "max rel Δ"],
                [[r["name"], r["dtype"], "×".join(map(str, r["shape"])), r["max_abs"], r["max_rel"]] for r in shown],
                "Tensors that differ" + _more(len(differing), len(shown)),
                legend="max rel Δ: max |Δ| divided by max |a|",
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
        text = (
            f"What {a['path']} holds, read by dlscope ckpt inspect without torch.load: the pickle goes "
            "through a restricted unpickler that imports nothing, tensor bytes are located by zip member "
            f"and offset and read only for statistics ({a['inspect_seconds'] * 1000:.0f} ms). The "
            f"optimizer state is {optimizer / max(params, 1):.1f}× the model's own weights"
            " (Adam keeps exp_avg and exp_avg_sq per parameter)."
        )
        blocks.append(Para(text))
        blocks += render_anatomy(a, stats_columns=True)
        d = a["reload_diff"]
        exact = (
            f"Reload is exact: {d['a']['path']} loaded with weights_only and saved again as {d['b']['path']} — "
            f"dlscope ckpt diff: {diff_verdict(d)}."
        )
        blocks.append(Findings([("good" if d["identical"] else "bad", exact)]))
    if "keras" in section:
        k = section["keras"]
        tr = k["training"]
        text = (
            f"Seed 003's MLP, trained with Keras {tr['keras_version']} on the {tr['backend']} backend "
            f"({tr['samples']:,} images, {tr['epochs']} epoch(s), {tr.get('optimizer', 'adam')}, batch "
            f"{tr.get('batch_size', 32)}, accuracy {tr['accuracy'][-1]:.2%}) and saved "
            "with model.save('model.h5') as in the handout: the HDF5 root attributes hold model_config and "
            "training_config, the groups model_weights/<layer>/… and optimizer_weights/… the tensors."
        )
        blocks.append(Para(text))
        blocks.append(formats_table([k[kind] for kind in ("h5", "keras", "tf_bundle") if kind in k]))
        h5 = k["h5"]
        if "model_config" in h5["layout"]:
            blocks.append(Code("model_config = " + seed_listing(h5["layout"]["model_config"]), "json"))
        if "training_config" in h5["layout"]:
            blocks.append(Code("training_config = " + json.dumps(h5["layout"]["training_config"]), "json"))
        blocks += render_anatomy(h5, stats_columns=False)
        text = (
            "The same model saved as Keras 3's native .keras: a zip of metadata.json, config.json and model.weights.h5."
        )
        blocks.append(Para(text))
        blocks += render_anatomy(k["keras"], stats_columns=False)
        if "tf_bundle" in k:
            text = (
                "The handout's other format, TensorFlow's own checkpoint (tf.train.Checkpoint): a LevelDB index "
                "of every tensor's dtype, shape, offset and CRC32C (all checked here), and a data shard. Its "
                "object graph says which layer each variable belongs to and which variable each optimizer slot "
                "serves."
            )
            blocks.append(Para(text))
            blocks += render_anatomy(k["tf_bundle"], stats_columns=False)
        if "profile" in tr:
            blocks.append(profile_table(tr["profile"], tr["backend"]))
    return blocks


def formats_table(anatomies: list[dict[str, Any]]) -> Table:
    """The same trained model in each format it was saved in, side by side."""

    def role_bytes(a: dict[str, Any], role: str) -> int:
        return sum(r["bytes"] for r in a["by_role"] if r["role"] == role)

    return Table(
        ["file", "format", "bytes", "tensors", "parameters", "optimizer", "overhead"],
        [
            [
                a["path"],
                a["format"],
                a["file_bytes"],
                a["totals"]["tensors"],
                role_bytes(a, "parameter"),
                role_bytes(a, "optimizer"),
                a["totals"]["overhead_bytes"],
            ]
            for a in anatomies
        ],
        "One model, each format it was saved in (bytes; overhead: headers, metadata, padding)",
        optional=("format",),
    )


def profile_table(profile: dict[str, Any], backend: str) -> Table:
    """The backend profiler's top-10 operators: the same table for torch and TensorFlow."""
    steps = max(profile["steps"], 1)
    return Table(
        ["operator", "calls", "self ms/step", "self %"],
        [
            [r["name"], r["calls"], round(r["self_us"] / 1000 / steps, 2), round(r["self_pct"], 1)]
            for r in profile["top"]
        ],
        f"Top-10 operators by self time over {profile['steps']} training steps ({profile['profiler']}, "
        f"{backend} backend): the same table for either backend",
    )
