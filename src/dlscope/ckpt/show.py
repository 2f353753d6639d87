"""Terminal views of an anatomy and of a diff (rich tables); the JSON forms are their to_dict()s."""

from __future__ import annotations

import json
from typing import Any

from rich.console import Console
from rich.table import Table

from dlscope.ckpt.anatomy import Anatomy, by_group, by_role, shared_storages, totals
from dlscope.console import safe

LEVEL_STYLE = {"bad": "bad", "warn": "warn", "info": "dim"}


def kib(n: int | None) -> str:
    if n is None:
        return "—"
    return f"{n:,} B" if n < 10 * 1024 else f"{n / 1024:,.1f} KiB" if n < 10 << 20 else f"{n / (1 << 20):,.1f} MiB"


def _num(x: Any) -> str:
    return "—" if x is None else f"{x:.4g}"


def _members_table(members: list[dict[str, Any]], limit: int) -> Table:
    table = Table(title="zip members", title_justify="left", box=None, padding=(0, 1))
    for col in ("member", "header @", "data @", "bytes", "align 64", "crc32", "crc ok"):
        table.add_column(col, justify="left" if col in ("member", "crc32") else "right")
    for m in members[:limit]:
        crc_ok = {True: "[good]yes", False: "[bad]NO", None: "[dim]—"}[m["crc_ok"]]
        align = "[good]0" if m["alignment"] == 0 else f"[warn]{m['alignment']}"
        table.add_row(
            m["name"],
            f"{m['header_offset']:,}",
            f"{m['data_offset']:,}",
            f"{m['size']:,}",
            align,
            m["crc32"],
            crc_ok,
        )
    if len(members) > limit:
        table.add_row(f"[dim]… {len(members) - limit:,} more", "", "", "", "", "", "")
    return table


def _variable_map_table(rows: list[dict[str, Any]], limit: int) -> Table:
    """Which layer and variable each tensor is, or which variable an optimizer slot serves."""
    table = Table(title="variables → layers and optimizer slots", title_justify="left", box=None, padding=(0, 1))
    for col in ("tensor", "layer", "variable", "slot"):
        table.add_column(col, overflow="fold")
    for row in rows[:limit]:
        table.add_row(safe(_short(row["tensor"])), safe(row["layer"]), safe(row["variable"]), safe(row["slot"] or ""))
    if len(rows) > limit:
        table.add_row(f"[dim]… {len(rows) - limit:,} more (--json)", "", "", "")
    return table


def _short(name: str) -> str:
    return name.removesuffix("/.ATTRIBUTES/VARIABLE_VALUE")


def print_anatomy(anatomy: Anatomy, console: Console, limit: int = 40) -> None:
    t = totals(anatomy)
    if "pickles" not in anatomy.layout:
        verdict = "[good]no pickle[/]: data only, nothing in it can run"
    elif anatomy.safe_to_load:
        verdict = "[good]safe to torch.load[/] (every pickle global is on the allow-list)"
    else:
        verdict = "[bad]NOT safe to torch.load[/]"
    console.print(f"[path]{anatomy.path}[/]: {anatomy.format}, {anatomy.file_bytes:,} bytes — {verdict}")
    for f in anatomy.findings:
        console.print(f"  [{LEVEL_STYLE[f.level]}]{f.level}[/] {f.what}" + (f"  [dim]{f.where}" if f.where else ""))
    layout = anatomy.layout
    if "zip_members" in layout:
        console.print(_members_table(layout["zip_members"], limit))
    for key, value in layout.get("records", {}).items():
        console.print(f"  [dim]{key}[/] {value}")
    for p in layout.get("pickles", []):
        console.print(
            f"pickle [path]{p['where']}[/]: protocol {p['protocol']}, {p['opcodes']:,} opcodes, {p['bytes']:,} bytes; "
            f"globals: {', '.join(p['globals']) or 'none'}"
        )
        if p["calls"]:
            console.print("  calls: " + ", ".join(f"{name} ×{n}" for name, n in p["calls"].items()))
    if "safetensors_header" in layout:
        h = layout["safetensors_header"]
        console.print(
            f"safetensors header: {h['header_bytes']:,} bytes of JSON, data from byte {h['data_offset']:,}; "
            f"{h['tensors']} tensors; metadata {json.dumps(h['metadata'])[:200]}"
        )
    if "tf_index" in layout:
        tf = layout["tf_index"]
        console.print(
            f"TF index: a LevelDB table of {tf['entries']:,} entries in {tf['data_blocks']} data blocks; "
            f"header {json.dumps(tf['header'])}"
        )
        for file in layout["files"]:
            size = f"{file['bytes']:,} bytes" if file["bytes"] is not None else "[bad]missing[/]"
            console.print(f"  [path]{file['path']}[/]  {size}")
    if layout.get("variable_map"):
        console.print(_variable_map_table(layout["variable_map"], limit))
    for h5 in layout.get("hdf5", []):
        console.print(
            f"HDF5 [path]{h5['where']}[/]: {len(h5['groups'])} groups; root attributes {list(h5['root_attributes'])}"
        )
        for g in h5["groups"][: limit // 3]:
            attrs = "  ".join(f"[dim]{k}=[/]{v[:60]}" for k, v in g["attributes"].items())
            console.print(f"  /{g['path']}  {attrs}")
    if anatomy.architecture:
        arch = anatomy.architecture
        table = Table(title=f"architecture: {arch['class_name']} (from {arch['source']})", title_justify="left")
        table.add_column("layer")
        if arch["source"] == "model_config":
            table.add_column("class")
            table.add_column("config")
            for layer in arch["layers"]:
                config = ", ".join(f"{k}={v}" for k, v in layer["config"].items())
                table.add_row(layer["name"], layer["class_name"], config)
        else:
            with_class = any(layer["class_name"] for layer in arch["layers"])
            if with_class:
                table.add_column("class")
            table.add_column("tensors")
            for layer in arch["layers"]:
                cells = [layer["class_name"]] if with_class else []
                table.add_row(layer["name"] or "<root>", *cells, ", ".join(layer["tensors"]))
        console.print(table)
    if anatomy.training:
        print_training(anatomy.training, console)
    print_tensors(anatomy, console, limit)
    if anatomy.metadata:
        items = list(anatomy.metadata.items())
        shown = ", ".join(f"{k}={v}" for k, v in items[: limit // 2])
        more = f" [dim]… {len(items) - limit // 2} more (--json)" if len(items) > limit // 2 else ""
        console.print(f"[phase]metadata[/] ({len(items)} non-tensor entries): {shown}{more}")
    roles = Table(title="by role", title_justify="left")
    for col in ("role", "tensors", "elements", "bytes"):
        roles.add_column(col, justify="left" if col == "role" else "right")
    for r in by_role(anatomy.tensors):
        roles.add_row(r["role"], f"{r['tensors']:,}", f"{r['elements']:,}", kib(r["bytes"]))
    console.print(roles)
    groups = by_group(anatomy.tensors)
    if groups:
        present = [r for r in ("parameter", "buffer", "optimizer") if any(r in g for g in groups)]
        table = Table(title="by module / layer", title_justify="left")
        for col in ("layer", *present, "total"):
            table.add_column(col, justify="left" if col == "layer" else "right")
        for g in groups[:limit]:
            table.add_row(g["group"], *(kib(g.get(r)) if g.get(r) else "" for r in present), kib(g["bytes"]))
        console.print(table)
    for s in shared_storages(anatomy.tensors):
        console.print(
            f"[warn]shared storage[/] {s['storage']} ({kib(s['storage_bytes'])}) viewed by "
            f"{', '.join(s['tensors'][:6])} — {kib(s['viewed_bytes'])} of views; the whole storage is saved"
        )
    console.print(
        f"[metric]{t['tensors']:,}[/] tensors, {t['elements']:,} elements, {kib(t['storage_bytes'])} in "
        f"{t['storages']:,} storages; file {kib(anatomy.file_bytes)}, overhead {kib(t['overhead_bytes'])} "
        f"({t['overhead_bytes'] / anatomy.file_bytes:.1%})"
    )


def _value(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def print_training(training: dict[str, Any], console: Console) -> None:
    """One line per part (loss, optimizer and its hyperparameters, scheduler, run config), no nulls."""
    console.print("[phase]training config[/]")
    for key, value in training.items():
        parts = value if isinstance(value, list) and all(isinstance(p, dict) for p in value) else [value]
        for i, part in enumerate(parts):
            label = f"{key}[{i}]" if len(parts) > 1 else key
            if isinstance(part, dict):
                shown = [f"{k}={_value(v)}" for k, v in part.items() if v is not None and not str(k).startswith("_")]
                console.print(f"  [dim]{label}:[/] " + " ".join(shown))
            elif part is not None:
                console.print(f"  [dim]{label}:[/] {_value(part)}")


def print_tensors(anatomy: Anatomy, console: Console, limit: int) -> None:
    widest = max((len(t.name) for t in anatomy.tensors[:limit]), default=8)
    table = Table(title="tensors", title_justify="left")
    table.add_column("name", overflow="fold", min_width=min(widest, 48))
    for col in ("dtype", "shape", "elements", "bytes", "storage @ offset", "role"):
        table.add_column(col, justify="right" if col in ("elements", "bytes") else "left")
    for t in anatomy.tensors[:limit]:
        where = f"@ {t.offset:,}" if t.offset is not None else "not contiguous"
        if t.storage != t.name:
            where = f"{t.storage} {where}"
        table.add_row(t.name, t.dtype, str(tuple(t.shape)), f"{t.numel:,}", kib(t.nbytes), where, t.role)
    if len(anatomy.tensors) > limit:
        table.add_row(f"[dim]… {len(anatomy.tensors) - limit:,} more (--limit N, or --json for all)")
    console.print(table)
    if not any(t.stats for t in anatomy.tensors):
        return
    stats = Table(title="tensor statistics (finite values; std is the population's)", title_justify="left")
    stats.add_column("name", overflow="fold", min_width=min(widest, 48))
    for col in ("min", "max", "mean", "std", "zeros", "NaN", "Inf"):
        stats.add_column(col, justify="right")
    for t in anatomy.tensors[:limit]:
        s = t.stats
        if s is None:
            stats.add_row(t.name, *["—"] * 7)
            continue
        bad = "[bad]" if s["nan"] or s["inf"] else ""
        cells = [_num(s["min"]), _num(s["max"]), _num(s["mean"]), _num(s["std"]), f"{s['zeros']:.1%}"]
        stats.add_row(t.name, *cells, f"{bad}{s['nan']}", f"{bad}{s['inf']}")
    console.print(stats)


def print_diff(result: dict[str, Any], console: Console, limit: int = 40) -> None:
    console.print(f"a: [path]{result['a']['path']}[/] ({result['a']['format']}, {result['a']['tensors']} tensors)")
    console.print(f"b: [path]{result['b']['path']}[/] ({result['b']['format']}, {result['b']['tensors']} tensors)")
    for key, label in (("added", "only in b"), ("removed", "only in a")):
        if result[key]:
            console.print(f"[warn]{label}[/]: " + ", ".join(result[key][:limit]))
    for c in result["shape_or_dtype_changed"]:
        console.print(f"[warn]changed[/] {c['name']}: {c['a']} → {c['b']}")
    differing = [r for r in result["tensors"] if not r["identical"]]
    if differing:
        table = Table(title="tensors that differ", title_justify="left")
        for col in ("name", "dtype", "shape", "max |Δ|", "max |Δ|/|a|"):
            table.add_column(col, justify="left" if col in ("name", "dtype", "shape") else "right")
        for r in sorted(differing, key=lambda r: -r["max_abs"])[:limit]:
            table.add_row(r["name"], r["dtype"], str(tuple(r["shape"])), f"{r['max_abs']:.3g}", f"{r['max_rel']:.3g}")
        console.print(table)
    if result["metadata_changed"]:
        console.print("[dim]metadata that differs:[/] " + ", ".join(result["metadata_changed"][:limit]))
    style = "good" if result["identical"] else "bad"
    console.print(f"[{style}]{result['verdict']}[/]")
