"""Section iotrace: the file data flow of a command through the operating system (`dlscope trace`,"""

from __future__ import annotations

from collections import Counter
from typing import Any

from dlscope.report.blocks import Block, Findings, Method, Para, Svg, Table
from dlscope.report.flowgraph import hook_chart_dot, render_svg, shorten
from dlscope.report.graphs import run_dot

TITLE = "File data flow through the OS"


def _kinds(by_kind: dict[str, Any]) -> str:
    ranked = sorted(by_kind.items(), key=lambda kv: (-kv[1]["count"], kv[0]))
    return ", ".join(f"{kind} {stats['count']:,}" for kind, stats in ranked[:4])


def _phases(f: dict[str, Any]) -> str:
    return f["first_phase"] if f["first_phase"] == f["last_phase"] else f"{f['first_phase']} → {f['last_phase']}"


PROC_BLIND_TO = (
    "individual read/write/lseek/close/stat/fsync calls and their latency (bytes per phase come "
    "from /proc/self/io instead)",
    "opens done in C code (extension modules, shared-library loading)",
    "processes that are not Python",
)


def findings(section: dict[str, Any]) -> list[tuple[str, str]]:
    items: list[tuple[str, str]] = []
    for s in section["skipped_backends"]:
        items.append(("warn", f"{s['backend']} backend unavailable: {s['why']}."))
    notes = section["notes"]
    if notes.get("missing_tracepoints"):
        missing = ", ".join(notes["missing_tracepoints"])
        items.append(("info", f"Not traced (no such system call or tracepoint on this kernel): {missing}."))
    if notes.get("lost_events"):
        items.append(("bad", f"{notes['lost_events']:,} events lost (perf buffer full): counts are lower bounds."))
    elif "lost_events" in notes:
        items.append(("good", "No events lost."))
    if notes.get("recovered_paths"):
        text = f"{notes['recovered_paths']:,} paths longer than bpftrace's limit were read from /proc/PID/fd."
        items.append(("info", text))
    if notes.get("truncated_paths"):
        cut = (
            f"{notes['truncated_paths']:,} paths cut at bpftrace's {notes['string_limit']}-byte limit (closed "
            "before they could be read from /proc/PID/fd): they appear under the cut name."
        )
        items.append(("warn", cut))
    if "python_processes" in notes:  # the proc backend
        items += [("warn", f"The proc backend cannot see {blind}.") for blind in PROC_BLIND_TO]
        if not notes["python_processes"]:
            items.append(("warn", "No Python process reported: the proc backend sees Python commands only."))
    mapped = section.get("mapped_files", [])
    if mapped:
        files = {f["path"]: f for f in section["files"]}
        named = ", ".join(f"{shorten(p, 40)} ({files[p]['maps']:,}× in {_phases(files[p])})" for p in mapped[:3])
        more = section["mapped_files_total"] - min(3, len(mapped))
        text = (
            f"Mapped into memory (mmap): {named}{f' and {more:,} more' if more else ''}. What is read through a "
            "mapping is page faults, which no system call shows: their bytes read leave it out."
        )
        items.append(("warn", text))
    if section["interrupted"]:
        by = section["interrupted"] if isinstance(section["interrupted"], str) else "Ctrl-C"
        text = f"Interrupted by {by}, which the command was sent too: the tables show what was seen until then."
        items.append(("warn", text))
    if section["exit_code"] != 0:
        items.append(("bad", f"The command exited with status {section['exit_code']}; the trace covers its run."))
    if "overhead" in section:
        o = section["overhead"]
        seconds = f"{sorted(o['traced_seconds'])} s traced vs {sorted(o['untraced_seconds'])} s untraced"
        median = f"median of {o['repeats']} interleaved runs: {seconds}"
        items.append(("info", f"Overhead of the {o['backend']} backend: {o['ratio']:.3f}× ({median})."))
    return items


def phase_table(section: dict[str, Any]) -> Table:
    if section["backend"] == "proc":
        rows = [
            [p["phase"], p["seconds"], p["calls"]]
            + [p.get("proc_io", {}).get(k) for k in ("rchar", "wchar", "syscr", "syscw", "read_bytes", "write_bytes")]
            for p in section["phases"]
        ]
        columns = ["phase", "s", "events seen", "rchar", "wchar", "syscr", "syscw", "read_bytes", "write_bytes"]
        return Table(
            columns, rows, "Per phase: opens etc. from the audit hook; bytes and syscall counts from /proc/self/io"
        )
    rows = [
        [
            p["phase"],
            p["seconds"],
            p["calls"],
            p["errors"],
            p["bytes_read"],
            p["bytes_written"],
            round(p["syscall_seconds"] * 1000, 2),
            _kinds(p["by_kind"]),
        ]
        for p in section["phases"]
    ]
    columns = ["phase", "s", "calls", "failed", "bytes read", "bytes written", "ms in syscalls", "by kind"]
    caption = "Per phase (startup: before the first marker — interpreter and imports)"
    own = [p["own_records"] for p in section["phases"] if "own_records" in p]
    legend = ""
    if own:
        calls, written = sum(o["calls"] for o in own), sum(o["bytes_written"] for o in own)
        read = sum(o["bytes_read"] for o in own)
        legend = (
            "Not counted above: dlscope's own records and code in the observed processes (steps, live "
            f"status, profiler traces; its modules): {calls:,} calls, {read:,} bytes read, {written:,} bytes written."
        )
    return Table(columns, rows, caption, legend=legend)


def rank_tables(section: dict[str, Any]) -> list[Block]:
    """A torchrun job's I/O rank by rank (section["ranks"]: dlscope.distributed.iorank)."""
    ranks = section.get("ranks") or []
    if not ranks:
        return []
    per_phase = [
        [r["rank"], p["phase"], p["calls"], p["bytes_read"], p["bytes_written"]] for r in ranks for p in r["phases"]
    ]

    def moved(r: dict[str, Any], category: str, key: str) -> int:
        return r["categories"].get(category, {}).get(key, 0)

    per_kind = [
        [
            r["rank"],
            len(r["pids"]),
            moved(r, "dataset", "bytes_read"),
            moved(r, "checkpoint", "bytes_written"),
            moved(r, "tensorboard log", "bytes_written"),
        ]
        for r in ranks
    ]
    return [
        Table(["rank", "phase", "calls", "read B", "written B"], per_phase, "Per rank and phase (torchrun workers)"),
        Table(
            ["rank", "procs", "dataset read B", "ckpt written B", "tb written B"],
            per_kind,
            "Per rank: its shard's source, the checkpoints and TensorBoard logs it wrote",
            legend="procs: worker processes of the rank (more than one after a torchrun restart)",
        ),
    ]


def file_table(section: dict[str, Any]) -> Table:
    rows = [
        [
            shorten(f["path"], 70),
            f["category"],
            f["opens"],
            f["reads"],
            f["writes"],
            f.get("maps", 0),  # (not in a trace written before dlscope counted them)
            f["bytes_read"],
            f["bytes_written"],
            round(f["seconds"] * 1000, 2),
            _phases(f),
            ", ".join(f"{size}: {n}" for size, n in list(f["read_sizes"].items())[:3]),
        ]
        for f in section["files"]
    ]
    columns = [
        "path",
        "category",
        "opens",
        "reads",
        "writes",
        "maps",
        "bytes read",
        "bytes written",
        "ms",
        "phases",
        "reads by size",
    ]
    caption = f"Per file: the {len(rows)} most important of {section['files_total']:,} (all in files.csv)"
    listed = Counter(f["category"] for f in section["files"])
    cut = [f"{listed[name]} of {total:,} {name} files" for name, total in section.get("files_cut", {}).items()]
    if cut:
        caption += f"; {', '.join(cut)}, most bytes first"
    legend = "maps: mmap() calls — what is read through a mapping is page faults, not in bytes read"
    # a narrow terminal keeps what says which file costs what: path, category, reads, bytes, ms
    optional = ("reads by size", "phases", "maps", "opens", "writes", "bytes written")
    return Table(columns, rows, caption, legend=legend, optional=optional, paths=("path",))


def hook_chart(rows: list[dict[str, Any]]) -> list[Block]:
    """The hook-point flow chart (graphviz only: without it, the table below says the same)."""
    svg = run_dot(hook_chart_dot(rows)) if rows else None
    caption = "Hook points: green where this kernel has them, dashed red where it does not."
    return [Svg("iotrace-hookpoints", svg, caption)] if svg is not None else []


def top_by_time(section: dict[str, Any]) -> Table:
    files = {f["path"]: f for f in section["files"]}
    rows = [
        [shorten(path, 70), files[path]["category"], round(files[path]["seconds"] * 1000, 2), _phases(files[path])]
        for path in section["top_by_time"]
    ]
    caption = "Top files by time spent in their syscalls"
    return Table(["path", "category", "ms in syscalls", "phases"], rows, caption, paths=("path",))


def method(section: dict[str, Any]) -> list[Block]:
    """How the phases are seen, and what this kernel lets a tracer attach to."""
    said = [
        "Phases come from dlscope.phase markers (a failing open of /dev/null/dlscope/phase/<name>/begin), which "
        "every backend sees."
    ]
    kernel = section["kernel"]
    if kernel.get("tracefs"):
        kprobes = "yes" if kernel["kprobes"] else "NO (kprobe_events missing)"
        tracepoints = "yes" if kernel["syscall_tracepoints"] else "NO"
        said.append(f"This kernel offers syscall tracepoints: {tracepoints}; kprobes: {kprobes}.")
    return [Method(" ".join(said))]


def render(section: dict[str, Any]) -> list[Block]:
    phases = [p["phase"] for p in section["phases"]]
    svg, engine = render_svg(section["flow"], phases)
    command, exports = " ".join(section["command"]), section["exports"]
    blocks: list[Block] = [
        Para(
            f"Traced `{command}` with the {section['backend']} backend: {section['events']:,} file-related "
            f"system calls over {section['duration_seconds']:.2f} s, touching {section['files_total']:,} paths."
        ),
        *([Findings(items)] if (items := findings(section)) else []),
        *method(section),
        phase_table(section),
        *rank_tables(section),
        file_table(section),
        top_by_time(section),
        Table(
            ["category", "files", "bytes read", "bytes written"],
            [[name, c["files"], c["bytes_read"], c["bytes_written"]] for name, c in section["categories"].items()],
            "By category",
        ),
        Svg(
            "iotrace-dataflow",
            svg,
            f"Data flow: files read → phase → files written, edges weighted by bytes (drawn by {engine}).",
        ),
        *hook_chart(section["hook_points"]),
        Table(
            ["syscall", "tracepoints", "here", "kprobe / kretprobe", "here"],
            [
                [h["syscall"], h["tracepoint"], h["tracepoint_available"], h["kprobe"], h["kprobe_available"]]
                for h in section["hook_points"]
            ],
            "Hook points for the syscalls seen: where an eBPF program could attach, and whether this kernel has it",
        ),
        Para(
            f"Exports: events as JSON Lines ({exports['events']}), a Perfetto/Chrome trace with a track per thread, "
            f"syscall slices and phase slices ({exports['perfetto_trace']}; open it at ui.perfetto.dev), and the "
            f"tables as CSV ({exports['phases_csv']}, {exports['files_csv']})."
        ),
    ]
    return blocks
