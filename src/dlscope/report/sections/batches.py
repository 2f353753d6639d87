"""Section batches (`dlscope run`): the data flow batch by batch — which worker built the batch a
step waited for, from which samples and files, and where its time went — worded here from the
facts observe/script/batchflow.py measured."""

from __future__ import annotations

from typing import Any

from dlscope.report.blocks import Block, Findings, Para, Table

TITLE = "Batches: the data flow, batch by batch"


def worker_name(worker: int | None) -> str:
    return "main process" if worker is None else f"worker {worker}"


def _bytes(n: int) -> str:
    return f"{n:,} bytes"


def wait_sentence(r: dict[str, Any]) -> str:
    """ "step S waited W ms for batch b (worker k): fetch F ms (slowest sample i, X ms, file /path,
    R reads, B bytes), collate C ms, queued Q ms"."""
    epoch = f", epoch {r['epoch']}" if r.get("epoch") else ""
    text = f"step {r['step']} waited {r['waited_ms']:.3g} ms for batch {r['batch']}{epoch} ({worker_name(r['worker'])})"
    if "fetch_ms" not in r:
        return text + "; its worker's record was not found."
    sample = ""
    if r.get("slowest_sample") is not None:
        sample = f"slowest sample {r['slowest_sample']}, {r['slowest_sample_ms']:.3g} ms"
        if r.get("slowest_sample_file"):
            sample += (
                f", file {r['slowest_sample_file']}, {r['slowest_sample_reads']} reads, "
                f"{_bytes(r['slowest_sample_bytes'])}"
            )
        sample = f" ({sample})"
    text += f": fetch {r['fetch_ms']:.3g} ms{sample}, collate {r['collate_ms']:.3g} ms, queued {r['queued_ms']:.3g} ms"
    if r.get("pin_ms") is not None:
        text += f", pin memory {r['pin_ms']:.3g} ms"
    if r.get("reads") is not None:
        calls = f"{r['reads']} reads ({_bytes(r['bytes_read'])}) in {r['syscall_ms']:.3g} ms of system calls"
        text += f"; its worker made {calls} while building it"
        if r.get("top_file") and r.get("top_file") != r.get("slowest_sample_file"):
            text += f", most from {r['top_file']} ({r['top_file_reads']} reads, {_bytes(r['top_file_bytes'])})"
    return text + "."


def findings(section: dict[str, Any]) -> list[tuple[str, str]]:
    items: list[tuple[str, str]] = []
    steady = section["longest_steady_wait"]
    if steady is not None:
        items.append(("warn", "The longest wait: " + wait_sentence(steady)))
    first = section["first_batches"]
    if first["count"]:
        items.append(
            (
                "info",
                f"Each worker's first batch of an epoch ({first['count']} batch{'es' * (first['count'] != 1)}) "
                "kept the loop waiting "
                f"{first['waited_ms']:.4g} ms in all (at most {first['max_ms']:.4g} ms): those waits hold the "
                "workers' start (non-persistent workers start at every epoch); the longest wait above is "
                "the longest of the others.",
            )
        )
    shares = section["shares"]
    if shares.get("wait_pct") is not None:
        text = (
            f"Over the {shares['steps']} steps that drew a batch, {shares['wait_pct']:.1f}% of the step time "
            f"({shares['waited_s']:.3g} s of {shares['step_s']:.3g} s) was spent waiting for one."
        )
        if shares.get("fetch_pct_of_build") is not None:
            text += (
                f" Building those batches was {shares['fetch_pct_of_build']:.1f}% fetch (the dataset's samples) "
                f"and {shares['collate_pct_of_build']:.1f}% collate."
            )
        items.append(("info", text))
    ahead = section["keeping_ahead"]
    if ahead:
        level = "good" if ahead["ready_pct"] >= 90 else "warn"
        tenths = " ".join(f"{p:.0f}" for p in ahead["ready_pct_by_tenth"])
        items.append(
            (
                level,
                f"The workers had the batch ready before the loop asked for {ahead['ready_pct']:.1f}% of "
                f"{ahead['batches']} batches (% per tenth of the run: {tenths}).",
            )
        )
    samples = section["samples"]
    for s in samples.get("outliers", []):
        where = (
            f"batch {s['batch']}" + (f", epoch {s['epoch']}" if s["epoch"] else "") + f", {worker_name(s['worker'])}"
        )
        file = f", file {s['file']}" if s.get("file") else ""
        items.append(
            (
                "warn",
                f"Sample {s['sample']} took {s['ms']:.3g} ms to fetch, {s['times_median']:,.0f}× the median "
                f"{samples['median_ms']:.3g} ms ({where}{file}).",
            )
        )
    if samples.get("outliers_total", 0) > len(samples.get("outliers", [])):
        bar = f"≥ {samples['outlier_ms']:.3g} ms (10× the median, 1 ms at least)"
        count = f"{samples['outliers_total']} samples in all"
        if samples.get("estimated_from"):  # past SAMPLES_KEPT: the median and the count from a reservoir
            count = (
                f"About {samples['outliers_total']} of {samples['count']} samples (estimated from "
                f"{samples['estimated_from']} drawn uniformly)"
            )
        items.append(("info", f"{count} took {bar}; see the CSV."))
    files = section.get("files") or {}
    for f in files.get("outliers", []):
        items.append(
            (
                "warn",
                f"File {f['path']}: {f['reads']} reads, {_bytes(f['bytes'])}, {f['ms']:.3g} ms of system calls "
                f"over {f['batches']} batch(es); the median file: {_bytes(files['median_bytes'])}, "
                f"{files['median_ms']:.3g} ms (named at ≥ 10× either, time ≥ 1 ms).",
            )
        )
    return items


def cells(rows: list[dict[str, Any]], keys: tuple[str, ...]) -> list[list[Any]]:
    """Table cells of batch rows; the training process's own batches are built by "main"."""
    return [
        [("main" if r["worker"] is None else r["worker"]) if k == "worker" else r.get(k) for k in keys] for r in rows
    ]


def render(section: dict[str, Any]) -> list[Block]:
    blocks: list[Block] = [
        Para(
            f"{section['batches_taken']} batches taken by the training loop, {section['batches_built']} built "
            f"({section['joined']} joined to the worker that built them by DataLoader's own batch number, "
            f"{section['in_steps']} to the step that used them). Every batch is a row of {section['file']}."
        )
    ]
    items = findings(section)
    if items:
        blocks.append(Findings(items))
    waits = section["longest_waits"]
    if waits:
        keys = ("step", "batch", "worker", "waited_ms", "fetch_ms", "collate_ms", "queued_ms", "slowest_sample")
        blocks.append(
            Table(
                ["step", "batch", "worker", "wait ms", "fetch ms", "collate ms", "queued ms", "slowest", "its ms"],
                cells(waits, (*keys, "slowest_sample_ms")),
                "The steps that waited longest for their batch",
                "wait: inside DataLoader.__next__; queued: from ready in the worker to taken by the loop; "
                "slowest: the batch's slowest sample (its index).",
                optional=("queued ms", "collate ms"),
            )
        )
    slowest = section["slowest_batches"]
    if slowest:
        keys = ("batch", "epoch", "worker", "samples", "fetch_ms", "collate_ms", "step", "waited_ms")
        blocks.append(
            Table(
                ["batch", "epoch", "worker", "samples", "fetch ms", "collate ms", "step", "wait ms"],
                cells(slowest, keys),
                "The slowest batches to build",
                optional=("epoch",),
            )
        )
    workers = section["workers"]
    if workers:
        rows = [
            [worker_name(w["worker"]), w["processes"], w["batches"], w["busy_pct"], w["mean_build_ms"], w["waited_ms"]]
            for w in workers
        ]
        blocks.append(
            Table(
                ["worker", "processes", "batches", "busy %", "build ms", "loop waited ms"],
                rows,
                "Per worker: busy building batches, idle otherwise",
                "processes: one per epoch unless the workers are persistent; busy %: of the time from each "
                "process's first batch's start to its last batch's hand-off; build ms: mean per batch; loop "
                "waited ms: the training loop's total wait for this worker's batches.",
            )
        )
    return blocks
