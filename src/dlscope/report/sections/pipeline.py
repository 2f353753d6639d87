"""Section pipeline: input-pipeline experiments — read buffer, small files against shards, cold and warm"""

from __future__ import annotations

from functools import partial
from typing import Any

from dlscope.findings import Finding
from dlscope.report.blocks import Block, Figure, Para, Table, Verdict
from dlscope.report.wording import worded

TITLE = "Input pipeline"


TABLE_TITLES = {
    "batch": "Batch size",
    "shuffle": "Shuffle buffer",
    "read_buffer": "Read buffer on small files",
    "layout": "Small files against shards, cold and warm",
    "workers": "Workers and prefetch",
}


def table_note(section: dict[str, Any], table: dict[str, Any]) -> str:
    """How a table maps to the seed, and what it holds fixed."""
    plan, buffer, file_bytes = section["plan"], section["default_read_buffer"], table["file_bytes"]
    batch, compute = plan["batch_size"], f"simulated compute {plan['compute_ms']:g} ms/batch"
    return {
        "batch": f"Seed table 1: TFRecord shards, read buffer {buffer:,} B, no shuffle, warm cache; the consumer is "
        f"the real training step of `{plan['model']}`.",
        "shuffle": f"Seed table 2: batch {batch}, TFRecord shards, warm cache, training consumer. A buffer as large "
        "as the dataset is a full shuffle; 500 only shuffles locally.",
        "read_buffer": f"Seed table 3: one {file_bytes}-byte file per sample, batch {batch}; read buffers of half a "
        f"file, one file and {buffer:,} B, each cold (page cache evicted) and warm. No shuffle, so the rows differ "
        f"only in the read calls; {compute}.",
        "layout": "The same samples as one file each, as 8 TFRecord shards and as one memory-mapped array; read "
        f"buffer {buffer:,} B, batch {batch}, {compute}.",
        "workers": f"Small files, cold cache (reads wait on the disk, so readers can overlap), batch {batch}, "
        "simulated compute. Workers are DataLoader processes, each reading its own files; without workers, "
        "prefetch is a background thread.",
    }[table["key"]]


def time_split_figure(table: dict[str, Any]) -> bytes:
    """Wall time split into waiting for data and computing, AU on top of each bar."""
    from dlscope.report import plots  # matplotlib: only when a report draws

    rows = own_rows(table)
    fig, (ax,) = plots.subplots(1, width=max(3.6, 1.1 * len(rows) + 1.5), height=2.8)
    labels = [r["label"] for r in rows]
    wait = [r["wait_s"] for r in rows]
    compute = [r["compute_s"] for r in rows]
    ax.bar(labels, wait, color="#d62728", label="waiting for data")
    ax.bar(labels, compute, bottom=wait, color="#1f77b4", label="compute")
    for i, row in enumerate(rows):
        ax.annotate(f"AU {100 * row['au']:.0f}%", (i, row["wait_s"] + row["compute_s"]), ha="center", va="bottom")
    ax.set_xlabel(table["varied"])
    ax.set_ylabel("seconds per epoch")
    ax.set_title(TABLE_TITLES[table["key"]])
    ax.tick_params(axis="x", labelsize=7)
    ax.margins(y=0.12)  # room above the tallest bar for its AU label
    plots.legend_outside(ax, fontsize=7)
    return plots.png(fig)


def render(section: dict[str, Any]) -> list[Block]:
    plan = section["plan"]
    machine = section["machine"]
    sets = "; ".join(
        f"{key}: {d['samples']:,} samples of {d['sample_bytes']} B ({d['source']})"
        for key, d in section["datasets"].items()
    )
    blocks: list[Block] = [
        Para(
            "Seed 003 measured how reading, shuffling and batching shape training time. The same samples are "
            "written as one file per sample, as TFRecord shards and as one memory-mapped array, then read by "
            "tf.data-like stages (read buffer → CRC-checked records → shuffle buffer → batch → decode) with "
            "optional DataLoader workers and prefetch, and fed to a consumer: the real training step, or a "
            f"simulated compute time per batch ({plan['compute_ms']:g} ms, as DLIO does). Datasets — {sets}. "
            "Wait is the time the consumer blocked on the next batch; AU (accelerator utilisation) is compute ÷ wall. "
            f"Verdicts: input-bound when ≥ {100 * section['thresholds']['input_bound_wait']:.0f}% of the wall time "
            f"waits for data, compute-bound below {100 * section['thresholds']['compute_bound_wait']:.0f}%, "
            "balanced between. Read time and read calls are summed over all readers (workers included). "
            f"Each row is the median wall time of {plan['repeats']} interleaved run(s). Machine: {machine['cpus']} "
            f"CPUs, load average {machine['load_average'][0]:.1f} before the sweep and "
            f"{machine['load_after'][0]:.1f} after (above the CPU count, other work competed for the cores)."
        ),
        worded(findings(section), WORDS),
    ]
    for table in section["tables"]:
        blocks += [
            Para(f"{TABLE_TITLES[table['key']]}. {table_note(section, table)}"),
            Table(
                [table["varied"], *SHORT[1:]],
                [row_cells(r) for r in own_rows(table)],
                legend=LEGEND,
                optional=("MB/s", "MB", "read s", "comp s", "smp/s", "r:step"),
            ),
            Figure(
                f"pipeline_{table['key']}",
                partial(time_split_figure, table),
                f"{TABLE_TITLES[table['key']]}: where the wall time went",
            ),
        ]
        if table_pairs(table):
            blocks.append(
                Table(
                    [table["varied"], *ENGINE_COLUMNS],
                    [[label, *engine_cells(dl, tf)] for label, dl, tf in table_pairs(table)],
                    f"{TABLE_TITLES[table['key']]}: dlscope / tf.data — the same rows through "
                    "TFRecordDataset(buffer_size), interleave, shuffle, batch, parse_example and prefetch",
                    legend="1st batch: seconds until the first batch arrived (the pipeline's start-up)",
                )
            )
    return blocks


def ratio_text(reads_per_step: float | None) -> str:
    """Seed 003's read_times:train_times, e.g. 150:1 or 1:10."""
    if not reads_per_step:
        return "—"
    return f"{reads_per_step:.0f}:1" if reads_per_step >= 1 else f"1:{1 / reads_per_step:.0f}"


def cache_text(row: dict[str, Any]) -> str:
    if row["cache"] == "warm":
        return "warm"
    if row["cold_verified"] is None:
        return "cold (unverified)"
    disk_mb = (row["disk_bytes"] or 0) / 1e6
    return f"cold, {disk_mb:.1f} MB from disk" if row["cold_verified"] else f"NOT cold: {disk_mb:.1f} MB from disk"


COLUMNS = [
    "",
    "cache",
    "wall s",
    "wait s",
    "compute s",
    "read s",
    "read calls",
    "reads:steps",
    "MB read",
    "samples/s",
    "MB/s",
    "AU %",
    "verdict",
]
# the same columns with headers short enough for an 80-column terminal, explained by LEGEND
ABBREVIATED = {
    "compute s": "comp s",
    "read calls": "reads",
    "reads:steps": "r:step",
    "MB read": "MB",
    "samples/s": "smp/s",
}
SHORT = [ABBREVIATED.get(c, c) for c in COLUMNS]
LEGEND = (
    "wait: the consumer blocked on data; comp: compute; reads: read calls; r:step: read calls per "
    "training step (seed 003's read_times:train_times); smp/s: samples/s; AU: accelerator utilisation, "
    "compute ÷ wall."
)


def row_cells(row: dict[str, Any]) -> list[Any]:
    """One measured epoch as the cells of COLUMNS (numbers stay numbers)."""
    return [
        row["label"],
        cache_text(row),
        round(row["wall_s"], 3),
        round(row["wait_s"], 3),
        round(row["compute_s"], 3),
        round(row["read_s"], 3) if row["read_s"] is not None else "—",
        row["reads"],
        ratio_text(row["reads_per_step"]),
        round(row["bytes_read"] / 1e6, 2),
        round(row["samples_per_s"] or 0),
        round(row["mb_per_s"] or 0, 1),
        round(100 * row["au"]),
        row["verdict"],
    ]


# Where a comparison becomes a warning or a recommendation (ratios of wall or read time).
FILES_VS_SHARDS_WARN = 1.5  # small files this many times the shards' wall time, cold
READ_BUFFER_WARN = 1.1  # the smallest buffer's warm read time this many times the largest's
WORKERS_HELP = 0.95  # workers or prefetch help when the best wall time is below this share of neither
ENGINE_FASTER, ENGINE_SLOWER = 0.9, 1.1  # tf.data ÷ dlscope wall time
ENGINE_AU_POINTS = 0.1  # AU differences worth listing


def findings(section: dict[str, Any]) -> list[Finding]:
    """Verdicts and recommendations, each with the numbers it rests on (from the section alone)."""
    # the seed's findings read dlscope's own rows; tf.data's are compared with them (engine_findings)
    tables = {t["key"]: {**t, "rows": own_rows(t)} for t in section["tables"]}
    items: list[Finding] = []
    if "batch" in tables:
        items.append(_batch_finding(tables["batch"]["rows"]))
    if "shuffle" in tables:
        items.append(_shuffle_finding(tables["shuffle"]["rows"]))
    if "read_buffer" in tables:
        items.append(_read_buffer_finding(tables["read_buffer"]))
    if "layout" in tables:
        items.extend(_layout_findings(tables["layout"]["rows"]))
    if "workers" in tables:
        items.append(_workers_finding(tables["workers"]["rows"]))
    items.extend(engine_findings(section["tables"]))
    input_bound = [
        {
            "table": t["key"],
            "input_bound": sum(r["verdict"] == "input-bound" for r in t["rows"]),
            "rows": len(t["rows"]),
        }
        for t in section["tables"]
        if any(r["verdict"] == "input-bound" for r in t["rows"])
    ]
    if input_bound:
        wait = section["thresholds"]["input_bound_wait"]
        items.append(Finding("pipeline.input_bound", "warn", {"tables": input_bound, "input_bound_wait": wait}))
    if section["exactly_once"]:
        samples = sum(r["samples"] for t in section["tables"] for r in t["rows"])
        items.append(Finding("pipeline.exactly_once", "good", {"deliveries": samples}))
    else:
        bad = [
            {"table": t["key"], "row": r["label"]}
            for t in section["tables"]
            for r in t["rows"]
            if not r["exactly_once"]
        ]
        items.append(Finding("pipeline.not_exactly_once", "bad", {"rows": bad}))
    return items


def _by_value(rows: list[dict[str, Any]], key: str) -> list[dict[str, Any]]:
    return sorted(rows, key=lambda r: r[key])


def _pick(row: dict[str, Any], *keys: str) -> dict[str, Any]:
    return {k: row[k] for k in keys}


def _batch_finding(rows: list[dict[str, Any]]) -> Finding:
    rows = _by_value(rows, "batch_size")
    cited = [_pick(r, "batch_size", "compute_s", "samples", "steps", "samples_per_s", "reads_per_step") for r in rows]
    fastest = max(rows, key=lambda r: r["samples_per_s"] or 0)
    return Finding("pipeline.batch", "info", {"rows": cited, "fastest": fastest["batch_size"]})


def _batch_words(v: dict[str, Any]) -> str:
    rows = v["rows"]
    per_sample = ", ".join(f"{r['batch_size']:,}: {1e6 * r['compute_s'] / r['samples']:.0f} µs" for r in rows)
    per_step = ", ".join(f"{r['batch_size']:,}: {1e3 * r['compute_s'] / r['steps']:.1f} ms" for r in rows)
    fastest = next(r for r in rows if r["batch_size"] == v["fastest"])
    return (
        f"Training time per sample by batch size — {per_sample}; per step — {per_step}. Fastest: batch "
        f"{fastest['batch_size']:,} at {fastest['samples_per_s'] or 0:,.0f} samples/s. Every step pays a fixed "
        "cost (Python, operator dispatch, the optimizer over every parameter) that small batches pay more often "
        "(the seed: batch 32 took 4× as long as 500); very large batches lose again once activations leave the "
        "CPU caches. Reads per step: "
        + ", ".join(f"{r['batch_size']:,}: {ratio_text(r['reads_per_step'])}" for r in rows)
        + "."
    )


def _shuffle_finding(rows: list[dict[str, Any]]) -> Finding:
    rows = _by_value(rows, "shuffle_buffer")
    return Finding("pipeline.shuffle", "info", {"rows": [_pick(r, "shuffle_buffer", "wall_s") for r in rows]})


def _shuffle_words(v: dict[str, Any]) -> str:
    none, *rest = v["rows"]
    costs = ", ".join(f"{r['shuffle_buffer']:,}: {100 * (r['wall_s'] / none['wall_s'] - 1):+.0f}%" for r in rest)
    return (
        f"Shuffle buffers cost wall time against none ({none['wall_s']:.2f} s): {costs}. Only a buffer as large as "
        f"the dataset ({v['rows'][-1]['shuffle_buffer']:,}) shuffles globally; it also delays the first batch until "
        "it is full. The seed measured ×1.9 for its 500 and 50,000 buffers (graph time, TF 1.x)."
    )


def _read_buffer_finding(table: dict[str, Any]) -> Finding:
    rows = _by_value(table["rows"], "read_buffer")
    by = {(r["read_buffer"], r["cache"]): r for r in rows}
    small, big = rows[0]["read_buffer"], rows[-1]["read_buffer"]
    pairs = {}
    for cache in ("warm", "cold"):
        a, b = by.get((small, cache)), by.get((big, cache))
        if a and b:
            pairs[cache] = {"small": _pick(a, "reads", "read_s"), "big": _pick(b, "reads", "read_s")}
    warm = pairs.get("warm")
    slower = warm is not None and warm["small"]["read_s"] > READ_BUFFER_WARN * warm["big"]["read_s"]
    values = {
        "file_bytes": table["file_bytes"],
        "rows": [_pick(r, "read_buffer", "reads", "opens") for r in rows if r["cache"] == "warm"],
        "by_cache": pairs,
        "read_buffer_warn": READ_BUFFER_WARN,
    }
    return Finding("pipeline.read_buffer", "warn" if slower else "info", values)


def _read_buffer_words(v: dict[str, Any]) -> str:
    per_file = ", ".join(f"{r['read_buffer']:,} B: {r['reads'] / max(r['opens'], 1):.0f}" for r in v["rows"])
    text = (
        f"Read calls per {v['file_bytes']}-byte file — {per_file}: ceil(size / buffer) + 1, the last read "
        "finding the end of the file; beyond one file the buffer size changes nothing."
    )
    for cache, pair in v["by_cache"].items():
        a, b = pair["small"], pair["big"]
        text += (
            f" {cache.capitalize()}: {a['reads']:,} calls take {a['read_s']:.2f} s in open/read/close against "
            f"{b['reads']:,} in {b['read_s']:.2f} s ({100 * (a['read_s'] / max(b['read_s'], 1e-9) - 1):+.0f}%)."
        )
    return text + " The seed saw 150:1 against 100:1 and equal times: opening a file costs more than reading it."


LAYOUT_FIELDS = ("wall_s", "mb_per_s", "opens", "reads", "au", "disk_bytes", "bytes_read", "read_s")


def _layout_findings(rows: list[dict[str, Any]]) -> list[Finding]:
    by = {(r["fmt"], r["cache"]): r for r in rows}
    items = []
    files, shards = by.get(("files", "cold")), by.get(("tfrecord", "cold"))
    if files and shards:
        level = "warn" if files["wall_s"] > FILES_VS_SHARDS_WARN * shards["wall_s"] else "info"
        values = {"files": _pick(files, *LAYOUT_FIELDS), "shards": _pick(shards, *LAYOUT_FIELDS)}
        items.append(Finding("pipeline.files_vs_shards", level, {**values, "warn_ratio": FILES_VS_SHARDS_WARN}))
    warm = by.get(("files", "warm"))
    if files and warm:
        values = {"cold": _pick(files, "wall_s", "read_s"), "warm": _pick(warm, "wall_s", "read_s")}
        items.append(Finding("pipeline.page_cache", "info", values))
    array = by.get(("array", "cold"))
    if array and shards:
        values = {"array_wall_s": array["wall_s"], "shards_wall_s": shards["wall_s"]}
        items.append(Finding("pipeline.memory_mapped", "info", values))
    return items


def _files_vs_shards_words(v: dict[str, Any]) -> str:
    files, shards = v["files"], v["shards"]
    return (
        f"Cold, one file per sample takes {files['wall_s'] / shards['wall_s']:.1f}× the wall time of shards "
        f"({files['wall_s']:.2f} s against {shards['wall_s']:.2f} s; {files['mb_per_s'] or 0:.1f} against "
        f"{shards['mb_per_s'] or 0:.1f} MB/s; {files['opens']:,} opens and {files['reads']:,} reads against "
        f"{shards['opens']:,} and {shards['reads']:,}). AU {100 * files['au']:.0f}% against "
        f"{100 * shards['au']:.0f}%: pack small samples into shards. The disk delivered "
        f"{(files['disk_bytes'] or 0) / 1e6:.1f} MB for {files['bytes_read'] / 1e6:.1f} MB of small files "
        f"against {(shards['disk_bytes'] or 0) / 1e6:.1f} MB for {shards['bytes_read'] / 1e6:.1f} MB of "
        "shards: a file occupies at least one 4 KiB page."
    )


def _page_cache_words(v: dict[str, Any]) -> str:
    cold, warm = v["cold"], v["warm"]
    return (
        f"The page cache: small files read warm in {warm['wall_s']:.2f} s against {cold['wall_s']:.2f} s "
        f"cold ({cold['wall_s'] / warm['wall_s']:.1f}×); read time {warm['read_s']:.2f} s against "
        f"{cold['read_s']:.2f} s. Cold runs evict file data with posix_fadvise(DONTNEED), checked by the "
        "bytes the kernel fetched from the disk; directory entries and inodes stay cached, so a first-ever "
        "read is slower still (the seed's 120 µs directory look-ups)."
    )


def _workers_finding(rows: list[dict[str, Any]]) -> Finding:
    base = next((r for r in rows if r["workers"] == 0 and r["prefetch"] == 0), rows[0])
    best = min(rows, key=lambda r: r["wall_s"])
    values = {
        "rows": [_pick(r, "label", "au", "wall_s") for r in rows],
        "neither": _pick(base, "label", "wall_s", "wait_s"),
        "best": _pick(best, "label", "wall_s", "wait_s"),
        "helps_below": WORKERS_HELP,
    }
    if best is base or best["wall_s"] > WORKERS_HELP * base["wall_s"]:
        return Finding("pipeline.workers_no_help", "warn", values)
    return Finding("pipeline.workers_help", "good", values)


def _workers_listing(v: dict[str, Any]) -> str:
    listing = ", ".join(f"{r['label']}: {100 * r['au']:.0f}% ({r['wall_s']:.2f} s)" for r in v["rows"])
    return f"AU by workers / prefetch — {listing}. "


def _workers_help_words(v: dict[str, Any]) -> str:
    best, base = v["best"], v["neither"]
    return _workers_listing(v) + (
        f"Best: {best['label']}, {base['wall_s'] / best['wall_s']:.1f}× faster than neither (wait "
        f"{best['wait_s']:.2f} s against {base['wait_s']:.2f} s): prefetching makes a step cost max(read, compute) "
        "instead of their sum, and workers overlap the waits on the disk."
    )


def _input_bound_words(v: dict[str, Any]) -> str:
    listed = "; ".join(f"{TABLE_TITLES[t['table']].lower()} ({t['input_bound']} of {t['rows']})" for t in v["tables"])
    return (
        f"Input-bound (≥ {100 * v['input_bound_wait']:.0f}% of the wall time waiting for data) in {listed}. "
        "Remedies, in the order the tables support them: shards instead of small files, a warm cache, workers "
        "and prefetch."
    )


def _not_exactly_once_words(v: dict[str, Any]) -> str:
    listed = "; ".join(f"{TABLE_TITLES[r['table']]}: {r['row']}" for r in v["rows"])
    return f"Samples lost or duplicated in: {listed}."


def pipeline_prepare(section: dict[str, Any], options: Any) -> list[Block]:
    """`dlscope pipeline prepare`: what was written where, each format's size."""
    sizes = ", ".join(f"{fmt} ({size / 1e6:.1f} MB)" for fmt, size in section["format_bytes"].items())
    text = (
        f"{section['samples']:,} samples of {section['sample_bytes']} B into {section['out']}: {sizes}; "
        f"one file per sample is {section['record_file_bytes']} B"
    )
    return [Verdict("wrote", "good", text, wrap=True)]


def pipeline_run(row: dict[str, Any], options: Any) -> list[Block]:
    """`dlscope pipeline run`: one measured epoch of one configuration (its reader and manifest in it)."""
    reader, manifest = row["reader"], row["manifest"]
    cells = row_cells(row)
    rows = [[column, cell] for column, cell in zip(COLUMNS[1:], cells[1:], strict=True)]
    rows += [
        ["consumer", row["consumer"]],
        ["samples", f"{row['samples']:,} in {row['steps']:,} batches"],
        ["exactly once", "yes" if row["exactly_once"] else "NO"],
        ["order digest", row["order_digest"]],
    ]
    engine = "tf.data" if reader["engine"] == "tfdata" else "dlscope"
    caption = (
        f"{reader['fmt']} through {engine} · read buffer {reader['read_buffer']:,} B · "
        f"shuffle buffer {reader['shuffle_buffer']:,} · "
        f"batch {reader['batch_size']} · workers {reader['workers']} · prefetch {reader['prefetch']} · "
        f"{manifest['samples']:,} samples of {manifest['sample_bytes']} B"
    )
    return [Table(["measure", "value"], rows, caption)]


def base_label(row: dict[str, Any]) -> str:
    """The row's label without the engine the sweep adds when it runs two (parameter_sweep.engine_label)."""
    return row["label"].rsplit(" · ", 1)[0] if " · " in row["label"] else row["label"]


def own_rows(table: dict[str, Any]) -> list[dict[str, Any]]:
    """dlscope's rows of a table (the seed's tables); tf.data's are shown against them separately."""
    return [{**r, "label": base_label(r)} for r in table["rows"] if r.get("engine", "dlscope") == "dlscope"]


def table_pairs(table: dict[str, Any]) -> list[tuple[str, dict[str, Any] | None, dict[str, Any]]]:
    """(row label, dlscope's row or None, tf.data's row) for every row tf.data ran."""
    by_label = {(base_label(r), r.get("engine", "dlscope")): r for r in table["rows"]}
    return [
        (label, by_label.get((label, "dlscope")), row)
        for (label, engine), row in by_label.items()
        if engine == "tfdata"
    ]


ENGINE_COLUMNS = ["wall s", "1st batch s", "wait s", "read calls", "AU %"]


def engine_cells(dl: dict[str, Any] | None, tf: dict[str, Any]) -> list[str]:
    """dlscope / tf.data, one cell per ENGINE_COLUMNS."""

    def pair(fmt: str, key: str, scale: int = 1) -> str:
        left = format(dl[key] * scale, fmt) if dl is not None else "—"
        return f"{left} / {format(tf[key] * scale, fmt)}"

    return [
        pair(".2f", "wall_s"),
        pair(".2f", "first_batch_s"),
        pair(".2f", "wait_s"),
        pair(",", "reads"),
        pair(".0f", "au", 100),
    ]


def engine_findings(tables: list[dict[str, Any]]) -> list[Finding]:
    """Where tf.data and dlscope's own stages differ on the same rows, and why."""
    pairs = [
        (f"{TABLE_TITLES[t['key']].lower()}: {label}", dl, tf) for t in tables for label, dl, tf in table_pairs(t) if dl
    ]
    if not pairs:
        return []
    ratios = [(name, tf["wall_s"] / dl["wall_s"]) for name, dl, tf in pairs if dl["wall_s"]]
    start_share = sorted(tf["first_batch_s"] / tf["wall_s"] for _, _, tf in pairs if tf["wall_s"])
    same_reads = [name for name, dl, tf in pairs if dl["reads"] <= tf["reads"] <= dl["reads"] * 1.01 + 16]
    au = [{"row": name, "dlscope": dl["au"], "tfdata": tf["au"]} for name, dl, tf in pairs]
    speed = {
        "rows": len(ratios),
        "faster": [{"row": name, "ratio": r} for name, r in ratios if r < ENGINE_FASTER],
        "slower": [{"row": name, "ratio": r} for name, r in ratios if r > ENGINE_SLOWER],
        "faster_below": ENGINE_FASTER,
        "slower_above": ENGINE_SLOWER,
        "first_batch_s_dlscope": sorted(dl["first_batch_s"] for _, dl, _ in pairs)[len(pairs) // 2],
        "first_batch_s_tfdata": sorted(tf["first_batch_s"] for _, _, tf in pairs)[len(pairs) // 2],
        "first_batch_share_tfdata": start_share[len(start_share) // 2],
    }
    items = [
        Finding("pipeline.engine_speed", "info", speed),
        Finding("pipeline.engine_reads", "info", {"same": len(same_reads), "rows": len(pairs)}),
    ]
    differ = [a for a in au if abs(a["tfdata"] - a["dlscope"]) >= ENGINE_AU_POINTS]
    if differ:
        items.append(Finding("pipeline.engine_au", "info", {"rows": differ, "points": ENGINE_AU_POINTS}))
    return items


def _engine_speed_words(v: dict[str, Any]) -> str:
    faster = "; ".join(f"{r['row']} {r['ratio']:.2f}×" for r in v["faster"])
    slower = "; ".join(f"{r['row']} {r['ratio']:.2f}×" for r in v["slower"])
    return (
        f"tf.data against dlscope's stages on the same files, rows and consumer — wall time ratio "
        f"(tf.data ÷ dlscope) below {v['faster_below']:g} in {len(v['faster'])} of {v['rows']} rows"
        + (f" ({faster})" if faster else "")
        + f", above {v['slower_above']:g} in {len(v['slower'])}"
        + (f" ({slower})" if slower else "")
        + f". Start-up differs: the median first batch arrives after {v['first_batch_s_tfdata']:.2f} s with tf.data "
        f"against {v['first_batch_s_dlscope']:.2f} s with dlscope (tf.data builds its dataset graph and traces the "
        f"parse function for every new pipeline), {100 * v['first_batch_share_tfdata']:.0f}% of tf.data's median "
        "wall time here — short epochs pay it in full. Past the start, tf.data reads, parses "
        "(tf.io.parse_example on a whole batch) and batches in C++ threads that do not hold Python's GIL, "
        "while dlscope parses each tf.train.Example in Python; dlscope's workers are DataLoader processes "
        "started every epoch, tf.data's interleave runs threads in one process."
    )


def _engine_au_words(v: dict[str, Any]) -> str:
    listed = "; ".join(
        f"{r['row']} {100 * r['dlscope']:.0f}% (dlscope) against {100 * r['tfdata']:.0f}% (tf.data)" for r in v["rows"]
    )
    return f"AU differs by {100 * v['points']:.0f} points or more in: {listed}."


WORDS = {
    "pipeline.batch": _batch_words,
    "pipeline.shuffle": _shuffle_words,
    "pipeline.read_buffer": _read_buffer_words,
    "pipeline.files_vs_shards": _files_vs_shards_words,
    "pipeline.page_cache": _page_cache_words,
    "pipeline.memory_mapped": lambda v: (
        f"The memory-mapped array makes no read calls at all (page faults instead): {v['array_wall_s']:.2f} s "
        f"cold against {v['shards_wall_s']:.2f} s for shards, and it allows a true global shuffle by index."
    ),
    "pipeline.workers_help": _workers_help_words,
    "pipeline.workers_no_help": lambda v: (
        _workers_listing(v)
        + (
            "Neither helped here: readers of small files need CPU for every open and read, extra processes "
            "compete for the same cores (see the load average), and each worker's start-up (a few hundred ms, "
            "paid every epoch without persistent workers) is not repaid on an epoch this short."
        )
    ),
    "pipeline.input_bound": _input_bound_words,
    "pipeline.exactly_once": lambda v: (
        f"Every row delivered every sample exactly once ({v['deliveries']:,} deliveries checked by index)."
    ),
    "pipeline.not_exactly_once": _not_exactly_once_words,
    "pipeline.engine_speed": _engine_speed_words,
    "pipeline.engine_reads": lambda v: (
        f"Read calls agree in {v['same']} of {v['rows']} rows: both engines read a file in "
        "buffer-sized calls until one returns nothing, ceil(size / buffer) + 1 per file (tf.data with "
        "pread64, dlscope with read). tf.data's counts are the process's read calls during the epoch, so "
        "they include a few reads of its runtime's own (/proc, /sys) on top of the data reads."
    ),
    "pipeline.engine_au": _engine_au_words,
}
