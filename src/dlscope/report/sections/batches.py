"""Section batches (`dlscope run`): the data flow batch by batch — which worker built the batch a
step waited for, from which samples and files, and where its time went — worded here from the
facts analysis/batchflow.py measured."""

from __future__ import annotations

from typing import Any

from dlscope.findings import Finding
from dlscope.report.blocks import Block, Findings, Method, Para, Table

TITLE = "Batches: the data flow, batch by batch"
READY_PCT = 90.0  # % of batches built before the loop asked: the workers keep ahead


def worker_name(worker: int | None) -> str:
    return "main process" if worker is None else f"worker {worker}"


def _bytes(n: int) -> str:
    return f"{n:,} bytes"


def _cost_text(value: float, unit: str, floor: float) -> str:
    """A small measured cost: "< floor" where it rounds to nothing (in isolation the x-ray's part
    a batch can), not "0"."""
    return f"< {floor:g}{unit}" if value < floor else f"{value:.3g}{unit}"


def _ms(value: float) -> str:
    """3 significant digits, and whole milliseconds from a second up (never 2.06e+03)."""
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}"


def where(r: dict[str, Any]) -> str:
    """ "batch 3", "batch 3 of loader 1, pass 2": the first loader and its first pass go unsaid."""
    text = f"batch {r['batch']}"
    if r.get("loader"):
        text += f" of loader {r['loader']}"
    if r.get("pass"):
        text += f", pass {r['pass']}"
    return text


def wait_sentence(r: dict[str, Any]) -> str:
    """ "step S waited W ms for batch b (worker k): fetch F ms (slowest sample i, X ms, file /path,
    R reads, B bytes), collate C ms, queued Q ms"."""
    text = f"step {r['step']} waited {_ms(r['waited_ms'])} ms for {where(r)} ({worker_name(r['worker'])})"
    if "fetch_ms" not in r:
        return text + "; its worker's record was not found."
    sample = ""
    if r.get("slowest_sample") is not None:
        sample = f"slowest sample {r['slowest_sample']}, {_ms(r['slowest_sample_ms'])} ms"
        if r.get("slowest_sample_file"):
            sample += (
                f", file {r['slowest_sample_file']}, {r['slowest_sample_reads']} reads, "
                f"{_bytes(r['slowest_sample_bytes'])}"
            )
        sample = f" ({sample})"
    elif r.get("fetched_whole"):
        sample = " (fetched whole by the dataset's __getitems__)"
    elif r["worker"] is None:
        sample = " (slowest sample not known: the main process times batches, not samples)"
    text += (
        f": fetch {_ms(r['fetch_ms'])} ms{sample}, collate {_ms(r['collate_ms'])} ms, queued {_ms(r['queued_ms'])} ms"
    )
    if r.get("pin_ms") is not None:
        text += f", pin memory {_ms(r['pin_ms'])} ms"
    if r.get("reads") is not None:
        calls = f"{r['reads']} reads ({_bytes(r['bytes_read'])}) in {_ms(r['syscall_ms'])} ms of system calls"
        if r.get("io_of_process"):
            text += f"; its process made {calls} while building it (all its threads: the trace has no thread ids)"
        else:
            text += f"; the thread that built it made {calls}"
        if r.get("top_file") and r.get("top_file") != r.get("slowest_sample_file"):
            text += f", most from {r['top_file']} ({r['top_file_reads']} reads, {_bytes(r['top_file_bytes'])})"
        if r.get("other_threads_reads"):
            text += (
                f"; its process's other threads read files meanwhile ({r['other_threads_reads']} reads, "
                f"{_bytes(r['other_threads_bytes'])}), not counted in the batch"
            )
    if r.get("ready_before_asked") and r["worker"] is not None:
        text += (
            f"; it was ready {_ms(max(r['queued_ms'] - r['waited_ms'], 0.0))} ms before the loop asked for it, "
            "so the wait was not its building: it went to handing the batch over (the worker's queue "
            "thread pickling it, this process receiving it) or to waiting for a core"
        )
    return text + "."


def first_waits(section: dict[str, Any]) -> str:
    """What an epoch's first batches wait for, by the loaders' kind of workers."""
    persistent = {bool(d.get("persistent_workers")) for d in section.get("loaders", []) if d.get("num_workers")}
    if persistent == {True}:
        return (
            "those waits hold the workers' start, then each epoch's first fetches (persistent workers stay up, "
            "but prefetch nothing across an epoch's end: the next epoch's indices are sent as it starts)"
        )
    if persistent == {False}:
        return "those waits hold the workers' start (non-persistent workers start at every epoch)"
    return (
        "those waits hold the workers' start (non-persistent workers start at every epoch; persistent ones "
        "prefetch nothing across an epoch's end)"
    )


def findings(section: dict[str, Any]) -> list[tuple[str, str]]:
    items: list[tuple[str, str]] = []
    steady = section["longest_steady_wait"]
    if steady is not None:
        items.append(("warn", "The longest wait: " + wait_sentence(steady)))
    first = section["first_batches"]
    if first["count"]:
        text = (
            f"Each worker's first batch of an epoch ({first['count']} batch{'es' * (first['count'] != 1)}) "
            "kept the loop waiting "
            f"{first['waited_ms']:.4g} ms in all (at most {first['max_ms']:.4g} ms): {first_waits(section)}; "
            "the longest wait above is the longest of the others."
        )
        items.append(("info", text))
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
        level = "good" if ahead["ready_pct"] >= READY_PCT else "warn"
        tenths = " ".join(f"{p:.0f}" for p in ahead["ready_pct_by_tenth"])
        text = (
            f"The workers had the batch ready before the loop asked for {ahead['ready_pct']:.1f}% of "
            f"{ahead['batches']} batches (% per tenth of the run: {tenths})."
        )
        items.append((level, text))
    samples = section["samples"]
    outliers = samples.get("outliers", [])
    # slow at one fetch and fast at the others: that fetch's moment, said once for all of them
    once = [s for s in outliers if s.get("other_fetches") and not s["other_slow"]]
    for s in outliers:
        if len(once) > 1 and s in once:
            continue
        file = f", file {s['file']}" if s.get("file") else ""
        text = (
            f"Sample {s['sample']} took {_ms(s['ms'])} ms to fetch, {s['times_median']:,.0f}× the median "
            f"{samples['median_ms']:.3g} ms ({where(s)}, {worker_name(s['worker'])}{file})"
        )
        items.append(outlier_finding(s, text))
    if len(once) > 1:
        text = (
            f"{len(once)} samples were slow at one fetch only, fast at their others (the median sample: "
            f"{samples['median_ms']:.3g} ms), so each time that fetch was slow, not the sample (a worker waiting "
            f"for a core, a cold cache): {_first_named([_slow_once(s) for s in once])}."
        )
        items.append(("info", text))
    whole = section.get("fetched_whole", 0)
    if whole:
        text = (
            f"{whole} batch{'es' * (whole != 1)} were fetched whole by their dataset's own __getitems__ "
            "(a batched fetch): their fetch time is known, not each sample's."
        )
        items.append(("info", text))
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
    slow_files = files.get("outliers", [])
    if slow_files:
        each = [
            f"{f['path']}: {f['reads']} reads, {_bytes(f['bytes'])}, {_ms(f['ms'])} ms of system calls over "
            f"{f['batches']} batch{'es' * (f['batches'] != 1)}"
            for f in slow_files
        ]
        median = f"the median file: {_bytes(files['median_bytes'])}, {files['median_ms']:.3g} ms"
        rule = "named at ≥ 10× its bytes or time, time ≥ 1 ms"
        if len(slow_files) == 1:
            text = f"File {each[0]}; {median} ({rule})."
        else:
            text = f"{len(slow_files)} files far past the median file ({median}; {rule}): {_first_named(each)}."
        items.append(("warn", text))
    return items


def method(section: dict[str, Any]) -> list[Block]:
    """What the x-ray does not time, and its own cost: how it measured, not what the job did."""
    blocks: list[Block] = []
    untimed = section.get("built_in_main_untimed", 0)
    if untimed:
        blocks.append(
            Method(
                f"{untimed} batch{'es were' if untimed != 1 else ' was'} built in the main process "
                "(num_workers=0), where dlscope times each batch's fetch and collate but not its samples one by "
                "one (that would cost the loop a clock read per sample): their slowest sample is not known. With "
                "num_workers ≥ 1 each worker times its samples."
            )
        )
    cost = section.get("own_cost")
    if cost and cost.get("per_batch_us") is not None:
        pct, build_ms = cost.get("pct_of_build"), _ms(cost["build_us"] / 1e3)
        share = (
            f"{_cost_text(pct, '%', 0.01)} of the {build_ms} ms a batch took to build here; " if pct is not None else ""
        )
        batch, per_batch = _cost_text(cost["batch_us"], " µs", 0.1), _cost_text(cost["per_batch_us"], " µs", 0.1)
        text = (
            "The x-ray's own cost, measured in the training process as it exited, in isolation (its caches "
            f"warm): {batch} a batch of {cost['samples']} samples plus {cost['sample_ns']:.3g} ns a sample timed "
            f"one by one, so {per_batch} a batch of this run ({share}CPU time). Inside the loop it costs more: "
            "the dataset's work between two batches evicts its code and data from the caches (on dlscope's "
            "benchmark, a batch of 64 tensors sliced from memory: < 0.1 µs so measured, 3–5 µs in the loop). "
            "With num_workers=0 the training process pays it inside the steps' data time; with workers the "
            "workers pay the building side."
        )
        blocks.append(Method(text))
    elif cost and cost.get("error"):
        blocks.append(Method(f"The x-ray's own cost could not be measured: {cost['error']}."))
    return blocks


def summary_findings(section: dict[str, Any], sections: dict[str, Any]) -> list[Finding]:
    """The data itself slow: a sample slow at every fetch, a file far past the median file."""
    found = [
        Finding("batches.slow_sample", "warn", {"median_ms": section["samples"]["median_ms"]} | s)
        for s in section["samples"].get("outliers", [])
        if s.get("other_slow")
    ]
    files = section.get("files") or {}
    median = {"median_bytes": files.get("median_bytes"), "median_ms": files.get("median_ms")}
    found += [Finding("batches.slow_file", "warn", median | f) for f in files.get("outliers", [])]
    return found


HEADLINES = {  # the summary's words for the warnings it shows
    "batches.slow_sample": lambda v: (
        f"Sample {v['sample']} is slow at every fetch: {_ms(v['ms'])} ms, {v['times_median']:,.0f}× the median sample"
        + (f" (file {v['file']})." if v.get("file") else ".")
    ),
    "batches.slow_file": lambda v: (
        f"File {v['path']}: {_bytes(v['bytes'])} in {_ms(v['ms'])} ms of system calls, against "
        f"{_bytes(v['median_bytes'])} and {v['median_ms']:.3g} ms for the median file."
    ),
}


def cells(rows: list[dict[str, Any]], keys: tuple[str, ...]) -> list[list[Any]]:
    """Table cells of batch rows; the training process's own batches are built by "main"."""
    return [
        [("main" if r["worker"] is None else r["worker"]) if k == "worker" else r.get(k) for k in keys] for r in rows
    ]


def batch_table(
    section: dict[str, Any], rows: list[dict[str, Any]], columns: list[tuple[str, str]], *text: str, **kw: Any
) -> Table:
    """A table of batch rows, (header, key) per column; the loader column only when there are
    several loaders, the pass column only when a row is past a loader's first pass."""
    if len(section.get("loaders") or []) <= 1:
        columns = [c for c in columns if c[1] != "loader"]
    if not any(r.get("pass") for r in rows):
        columns = [c for c in columns if c[1] != "pass"]
    return Table([h for h, _ in columns], cells(rows, tuple(k for _, k in columns)), *text, **kw)


NAMED_IN_FINDING = 3  # of a list of outliers, the first named in its finding; the table below has them all


def _first_named(each: list[str]) -> str:
    """The first NAMED_IN_FINDING of `each`, and how many more the table below lists."""
    named = "; ".join(each[:NAMED_IN_FINDING])
    more = len(each) - NAMED_IN_FINDING
    return named + (f"; and {more} more in the table below" if more > 0 else "")


def _slow_once(s: dict[str, Any]) -> str:
    """An outlier sample fast at its other fetches, in a list of them."""
    others = f"its {s['other_fetches']} other fetch{'es' * (s['other_fetches'] != 1)}"
    return (
        f"sample {s['sample']}, {_ms(s['ms'])} ms ({s['times_median']:,.0f}×; {where(s)}, {worker_name(s['worker'])}), "
        f"{others} took {_ms(s['other_median_ms'])} ms"
    )


def outlier_tables(section: dict[str, Any]) -> list[Block]:
    """The samples and the files far past their medians, each one a row (the findings name the first)."""
    blocks: list[Block] = []
    samples = section["samples"]
    outliers = samples.get("outliers", [])
    if len(outliers) > 1:
        rows = [
            [
                s["sample"],
                s["ms"],
                round(s["times_median"]),
                s.get("pass"),
                s["batch"],
                worker_name(s["worker"]),
                "—" if not s.get("other_fetches") else f"{s['other_slow']} of {s['other_fetches']}",
                s.get("other_median_ms"),
                s.get("file") or "",
            ]
            for s in outliers
        ]
        blocks.append(
            Table(
                ["sample", "ms", "× median", "pass", "batch", "worker", "again", "others ms", "file"],
                rows,
                f"Samples far past the median ({samples['median_ms']:.3g} ms), the slowest first",
                "again: its other fetches in the run as slow (of how many; —: fetched once), the sample's own "
                "cost; others ms: their median, where fast that one fetch was slow, not the sample.",
                optional=("pass", "× median"),
                paths=("file",),
            )
        )
    files = section.get("files") or {}
    slow_files = files.get("outliers", [])
    if len(slow_files) > 1:
        blocks.append(
            Table(
                ["path", "reads", "bytes", "ms", "batches"],
                [[f["path"], f["reads"], f["bytes"], f["ms"], f["batches"]] for f in slow_files],
                f"Files far past the median ({_bytes(files['median_bytes'])}, {files['median_ms']:.3g} ms)",
                "ms: of the batch's thread's system calls on the file; batches: the batches that read it.",
                paths=("path",),
            )
        )
    return blocks


def outlier_finding(s: dict[str, Any], text: str) -> tuple[str, str]:
    """An outlier sample, with what its other fetches in the run say: slow again (the sample's own
    cost: a warning), fast (that fetch's moment: information), or none to compare."""
    others = s.get("other_fetches")
    if others is None:  # an iterable dataset's position: no sample to fetch again
        return "warn", f"{text}."
    if not others:
        return (
            "warn",
            f"{text}; fetched once in the run: no other fetch to compare it with.",
        )
    fetches = f"{others} other fetch{'es' * (others != 1)}"
    if s["other_slow"]:
        return "warn", (
            f"{text}, and {s['other_slow']} of its {fetches} were as slow (median {_ms(s['other_median_ms'])} ms): "
            "the sample itself is slow."
        )
    return "info", (
        f"{text}; its {fetches} took {_ms(s['other_median_ms'])} ms (median): that fetch was slow, not the "
        "sample (a worker waiting for a core, a cold cache)."
    )


def loader_numbers(row: dict[str, Any]) -> str:
    """A loaders-table row's loaders: "3", or "1–13 (4)" for loaders alike."""
    if row["loader"] is None:
        return "?"
    count = row.get("loaders", 1)
    return str(row["loader"]) if count == 1 else f"{row['loader']}–{row['last_loader']} ({count:,})"


def short_type(name: str) -> str:
    """A class's dotted name, shortened past 30 characters to its own name and its package:
    "ArrayDataset (keras)", not keras.src.trainers.data_adapters.…<locals>.ArrayDataset."""
    if len(name) <= 30:
        return name
    return f"{name.rsplit('.', 1)[-1]} ({name.split('.', 1)[0]})"


def render(section: dict[str, Any]) -> list[Block]:
    elsewhere = section.get("taken_elsewhere", 0)
    blocks: list[Block] = [
        Para(
            f"{section['batches_taken']} batches taken by the training process, {section['batches_built']} built "
            f"({section['joined']} joined to the worker that built them by DataLoader's own batch number, "
            f"{section['in_steps']} to the step that used them). Every batch is a row of {section['file']}."
            + (
                f" {elsewhere} were taken by a thread other than the one running the steps (a prefetching "
                "thread's): no step waited inside DataLoader for those, so they are joined to no step and "
                "count in no wait below."
                if elsewhere
                else ""
            )
        )
    ]
    items = findings(section)
    if items:
        blocks.append(Findings(items))
    loaders = section.get("loaders") or []
    if len(loaders) > 1 or any(lo["loader"] is None for lo in loaders):
        blocks.append(
            Table(
                ["loader", "dataset", "batch", "workers", "passes", "batches", "in steps"],
                [
                    [
                        loader_numbers(lo),
                        short_type(lo.get("dataset", "?")),
                        lo.get("batch_size"),
                        lo.get("num_workers"),
                        lo["passes"],
                        lo["batches_taken"],
                        lo["in_steps"],
                    ]
                    for lo in loaders
                ],
                "The DataLoaders, in the order the process first iterated them",
                "passes: iter() of the loader (an epoch of a training loader); in steps: batches drawn inside a "
                "training step (the others fed an evaluation or were drawn outside any step); ?: a loader "
                "iterated without DataLoader.__iter__."
                + (
                    " 1–13 (4): four loaders alike, numbered 1 to 13 (a new DataLoader each epoch)."
                    if any(lo.get("loaders", 1) > 1 for lo in loaders)
                    else ""
                ),
            )
        )
    waits = section["longest_waits"]
    if waits:
        columns = [
            ("step", "step"),
            ("loader", "loader"),
            ("pass", "pass"),
            ("batch", "batch"),
            ("worker", "worker"),
            ("wait ms", "waited_ms"),
            ("fetch ms", "fetch_ms"),
            ("collate ms", "collate_ms"),
            ("queued ms", "queued_ms"),
            ("slowest", "slowest_sample"),
            ("its ms", "slowest_sample_ms"),
        ]
        blocks.append(
            batch_table(
                section,
                waits,
                columns,
                "The steps that waited longest for their batch",
                "wait: inside DataLoader.__next__; queued: from ready in the worker to taken by the loop; "
                "slowest: the batch's slowest sample (its index); pass: the loader's iter() it was drawn in.",
                optional=("loader", "pass", "queued ms", "collate ms"),
            )
        )
    slowest = section["slowest_batches"]
    if slowest:
        columns = [
            ("loader", "loader"),
            ("pass", "pass"),
            ("batch", "batch"),
            ("worker", "worker"),
            ("samples", "samples"),
            ("fetch ms", "fetch_ms"),
            ("collate ms", "collate_ms"),
            ("step", "step"),
            ("wait ms", "waited_ms"),
        ]
        blocks.append(
            batch_table(section, slowest, columns, "The slowest batches to build", optional=("loader", "pass"))
        )
    blocks.extend(outlier_tables(section))
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
    return blocks + method(section)
