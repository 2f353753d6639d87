"""Events → the tables: per phase, per file, top files, data-flow edges. One streaming pass;
memory grows with the number of distinct files and phases, never with the number of events."""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from dlscope.contract.ioevents import Event
from dlscope.contract.owncode import CODE_SUFFIXES, PACKAGE_DIRS

STARTUP = "startup"  # before the first marker: interpreter start-up and imports
OUTSIDE = "outside-phases"  # after a phase ended and before the next began
DIRECTORY = "directory"  # a path seen that holds other paths seen, not named by any rule below
OWN_RECORDS = "dlscope records"  # what `dlscope run` writes in the observed processes: not the job's I/O
# dlscope's own modules and extensions, which the observed processes import, and stat and read again
# when something walks a stack with dlscope's wrappers in it (torch.manual_seed does): not the job's
OWN_CODE = "dlscope code"
OWN = (OWN_RECORDS, OWN_CODE)  # counted apart, beside each phase
# many small files: one node each
GROUPED_IN_FLOW = ("python module", "shared library", "device", "config", *OWN)
MAPPED_FILES_LISTED = 10  # the data files mapped into memory, most mapped first
# in the section's file table however small, the CATEGORY_LISTED with most bytes of each (a
# dataset of a million small files is one category row and files.csv, not a million table rows)
ALWAYS_LISTED, CATEGORY_LISTED = ("dataset", "checkpoint", "tensorboard log"), 20
IO_FIELDS = ("rchar", "wchar", "syscr", "syscw", "read_bytes", "write_bytes")

CATEGORY_RULES: list[tuple[str, re.Pattern[str]]] = [
    ("phase marker", re.compile(r"^/dev/null/dlscope/")),
    # what `dlscope run` itself keeps in the observed processes (steps, live file, stacks, profiler
    # traces), and its calibration's scratch copies of them (injob/calibrate.py)
    (OWN_RECORDS, re.compile(r"(/processes/[^/]*\d[^/]*$|/dlscope-calibrate-[^/]*/)")),
    (
        OWN_CODE,
        re.compile(
            "^(" + "|".join(map(re.escape, PACKAGE_DIRS)) + ").*(" + "|".join(map(re.escape, CODE_SUFFIXES)) + ")$"
        ),
    ),
    ("dataset", re.compile(r"(idx\d-ubyte|/MNIST/|\.npy$|\.npz$|\.parquet$|\.tfrecord|/datasets?/)")),
    ("checkpoint", re.compile(r"(\.pt|\.pth|\.ckpt|\.safetensors)(\.\d+)?$")),
    ("tensorboard log", re.compile(r"events\.out\.tfevents")),
    # modules, bytecode, and the package directories the import system stats (no file extension)
    (
        "python module",
        re.compile(r"(\.(py|pyc|pyi|pth)$|__pycache__|/(site|dist)-packages(/[^.]*)?$|/lib/python3[^/]*/?$)"),
    ),
    ("trace/report", re.compile(r"(results\.json|report\.(html|md)|\.pt\.trace\.json|/profile/|/iotrace/|\.csv$)")),
    # with the C library's locale and charset tables, which it maps at start-up as it maps libraries
    (
        "shared library",
        re.compile(r"(\.so(\.\d+)*$|/ld\.so\.(cache|preload)$|/glibc-hwcaps/|^/usr/lib/locale/|/gconv/)"),
    ),
    ("device", re.compile(r"^(/dev/|/proc/|/sys/|<std|pipe:|socket:|anon_inode:)")),
    ("config", re.compile(r"(^/etc/|\.(cfg|ini|toml|ya?ml|conf|json)$)")),
]


def category(path: str) -> str:
    for name, rule in CATEGORY_RULES:
        if rule.search(path):
            return name
    return "other"


def size_bucket(n: int) -> str:
    """Read sizes by power of two: '≤4 KiB' holds 2,049–4,096 bytes."""
    limit = 1
    while limit < n:
        limit <<= 1
    return f"≤{limit >> 20} MiB" if limit >= 1 << 20 else (f"≤{limit >> 10} KiB" if limit >= 1024 else f"≤{limit} B")


@dataclass
class KindStats:
    count: int = 0
    errors: int = 0
    bytes: int = 0
    seconds: float = 0.0


@dataclass
class PhaseStats:
    name: str
    order: int
    seconds: float = 0.0
    kinds: dict[str, KindStats] = field(default_factory=lambda: defaultdict(KindStats))
    own: dict[str, KindStats] = field(default_factory=lambda: defaultdict(KindStats))  # dlscope's records
    io: dict[str, int] = field(default_factory=lambda: dict.fromkeys(IO_FIELDS, 0))
    io_samples: int = 0


def _moved(kinds: dict[str, KindStats]) -> dict[str, int]:
    """A phase's calls and bytes moved, from its table by kind of call."""
    return {
        "calls": sum(k.count for k in kinds.values()),
        "bytes_read": kinds["read"].bytes if "read" in kinds else 0,
        "bytes_written": kinds["write"].bytes if "write" in kinds else 0,
    }


@dataclass
class FileStats:
    path: str
    category: str
    opens: int = 0
    reads: int = 0
    writes: int = 0
    maps: int = 0  # mmap() of the file: what is read through the mapping is page faults, no system call
    other_calls: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    seconds: float = 0.0
    first_phase: str = ""
    last_phase: str = ""
    read_sizes: dict[str, int] = field(default_factory=lambda: defaultdict(int))


class Analysis:
    """Feed events in time order with `add`; read the tables with `summary`."""

    def __init__(self) -> None:
        self.phases: dict[str, PhaseStats] = {}
        self.files: dict[str, FileStats] = {}
        self.stack: list[str] = []
        self.seen_marker = False
        self.phase_started: dict[str, float] = {}
        self.edges: dict[tuple[str, str], int] = defaultdict(int)  # (from, to) → bytes
        self.opens_by_edge: dict[tuple[str, str], int] = defaultdict(int)
        self.maps_by_edge: dict[tuple[str, str], int] = defaultdict(int)  # (file, phase) → mmap() calls
        self.calls: dict[str, int] = defaultdict(int)
        self.events = 0
        self.first_ts: float | None = None
        self.last_ts: float | None = None
        self.last_io: dict[int, dict[str, int]] = {}

    @property
    def current(self) -> str:
        return self.stack[-1] if self.stack else (OUTSIDE if self.seen_marker else STARTUP)

    def phase(self, name: str) -> PhaseStats:
        stats = self.phases.get(name)
        if stats is None:
            stats = self.phases[name] = PhaseStats(name, len(self.phases))
        return stats

    def _switch(self, ts: float, new_stack: list[str]) -> None:
        before = self.current
        self.phase(before).seconds += ts - self.phase_started[before]
        self.seen_marker = True
        self.stack = new_stack
        self.phase_started[self.current] = ts
        self.phase(self.current)

    def add(self, event: Event) -> None:
        ts = event["ts"]
        if self.first_ts is None:
            self.first_ts = self.phase_started[STARTUP] = ts
            self.phase(STARTUP)
        self.last_ts = max(ts, self.last_ts or ts)
        call = event["call"]
        if call == "phase":
            name = event["name"]
            if event["edge"] == "begin":
                self._switch(ts, [*self.stack, name])
            elif name in self.stack:  # an end closes everything opened inside it, too
                self._switch(ts, self.stack[: len(self.stack) - 1 - self.stack[::-1].index(name)])
            return
        if call == "procio":
            self._add_io(event)
            return
        if call in ("fork", "exit"):
            return
        self.events += 1
        self.calls[call] += 1
        phase = self.current
        kind = event["kind"]
        path = event.get("path")
        f = None if path is None else self._file(path, phase)
        phase_stats = self.phase(phase)
        # dlscope's own records and code are not the job's I/O: counted apart, beside the phase
        stats = (phase_stats.own if f is not None and f.category in OWN else phase_stats.kinds)[kind]
        stats.count += 1
        stats.errors += event["err"] is not None
        stats.bytes += event["bytes"] or 0
        stats.seconds += event["dur"] or 0.0
        if path is None or f is None:
            return
        f.seconds += event["dur"] or 0.0
        moved = event["bytes"] or 0
        if kind == "open":
            f.opens += 1
            self.opens_by_edge[(path, phase)] += 1
        elif kind == "read":
            f.reads += 1
            f.bytes_read += moved
            if moved:
                f.read_sizes[size_bucket(moved)] += 1
                self.edges[(path, phase)] += moved
        elif kind == "write":
            f.writes += 1
            f.bytes_written += moved
            if moved:
                self.edges[(phase, path)] += moved
        elif kind == "mmap" and event["err"] is None:
            f.maps += 1
            self.maps_by_edge[(path, phase)] += 1
        else:
            f.other_calls += 1
        if kind == "rename" and event.get("target") and event["err"] is None:
            self._renamed(path, event["target"], phase)

    def _file(self, path: str, phase: str) -> FileStats:
        f = self.files.get(path)
        if f is None:
            f = self.files[path] = FileStats(path, category(path), first_phase=phase)
        f.last_phase = phase
        return f

    def _renamed(self, source: str, target: str, phase: str) -> None:
        """An atomic save writes a temp file and renames it: report it under its final name."""
        old = self.files.pop(source)
        new = self._file(target, phase)
        for name in ("opens", "reads", "writes", "maps", "other_calls", "bytes_read", "bytes_written", "seconds"):
            setattr(new, name, getattr(new, name) + getattr(old, name))
        for size, n in old.read_sizes.items():
            new.read_sizes[size] += n
        new.first_phase = old.first_phase if new.first_phase == phase else new.first_phase
        for table in (self.edges, self.opens_by_edge, self.maps_by_edge):
            for a, b in [key for key in table if source in key]:
                table[(target if a == source else a, target if b == source else b)] += table.pop((a, b))

    def _add_io(self, record: Event) -> None:
        io, pid = record.get("io") or {}, record["pid"]
        previous = self.last_io.get(pid)
        self.last_io[pid] = io
        if previous is None:
            return
        stats = self.phase(self.current)
        stats.io_samples += 1
        for key in IO_FIELDS:
            stats.io[key] += max(0, io.get(key, 0) - previous.get(key, 0))

    def finish(self) -> None:
        """Close the phase the trace ended in."""
        if self.last_ts is not None:
            current = self.current
            self.phase(current).seconds += self.last_ts - self.phase_started[current]
            self.phase_started[current] = self.last_ts

    def summary(self, top: int = 15, file_rows: int = 40) -> dict[str, Any]:
        """The JSON-able tables (files cut to the `file_rows` most important; CSV has all)."""
        phases = []
        for p in sorted(self.phases.values(), key=lambda p: p.order):
            row: dict[str, Any] = {
                "phase": p.name,
                "seconds": round(p.seconds, 6),
                **_moved(p.kinds),
                "errors": sum(k.errors for k in p.kinds.values()),
                "syscall_seconds": round(sum(k.seconds for k in p.kinds.values()), 6),
                "by_kind": {k: vars(v) for k, v in sorted(p.kinds.items())},
            }
            if p.io_samples:
                row["proc_io"] = dict(p.io)
            if p.own:
                row["own_records"] = _moved(p.own)
            phases.append(row)
        files = self.file_rows()
        by_bytes = sorted(files, key=lambda r: -(r["bytes_read"] + r["bytes_written"]))
        by_time = sorted(files, key=lambda r: -r["seconds"])
        important = {r["path"] for r in by_bytes[:file_rows]} | {r["path"] for r in by_time[:top]}
        mapped = sorted(
            (r for r in files if r["maps"] and r["category"] not in GROUPED_IN_FLOW), key=lambda r: -r["maps"]
        )
        cut = {}  # an always-listed category with more files than are listed: its number of files
        for category in ALWAYS_LISTED:
            rows = [r for r in by_bytes if r["category"] == category]
            important |= {r["path"] for r in rows[:CATEGORY_LISTED]}
            if len(rows) > CATEGORY_LISTED:
                cut[category] = len(rows)
        important |= {r["path"] for r in mapped[:MAPPED_FILES_LISTED]}
        categories: dict[str, dict[str, int]] = defaultdict(lambda: {"files": 0, "bytes_read": 0, "bytes_written": 0})
        for r in files:
            c = categories[r["category"]]
            c["files"] += 1
            c["bytes_read"] += r["bytes_read"]
            c["bytes_written"] += r["bytes_written"]
        return {
            "events": self.events,
            "duration_seconds": round((self.last_ts or 0) - (self.first_ts or 0), 6),
            "calls": dict(sorted(self.calls.items(), key=lambda kv: -kv[1])),
            "phases": phases,
            "files_total": len(files),
            "files": [r for r in by_bytes if r["path"] in important],
            "files_cut": cut,
            "top_by_bytes": [r["path"] for r in by_bytes[:top] if r["bytes_read"] + r["bytes_written"]],
            "top_by_time": [r["path"] for r in by_time[:top] if r["seconds"]],
            "mapped_files": [r["path"] for r in mapped[:MAPPED_FILES_LISTED]],
            "mapped_files_total": len(mapped),
            "categories": dict(sorted(categories.items())),
            "flow": self.flow_edges(),
        }

    def file_rows(self) -> list[dict[str, Any]]:
        """Every file seen, one row each (files.csv)."""
        directories = self._directories()
        return [self._file_row(f, directories) for f in self.files.values() if f.category != "phase marker"]

    def _directories(self) -> set[str]:
        """The paths seen that hold other paths seen: directories (the import system stats each
        directory on its path at every import; their name alone does not say what they are)."""
        parents: set[str] = set()
        for path in self.files:
            at = path.rfind("/")
            while at > 0 and path[:at] not in parents:  # a parent seen: its own parents are in already
                parents.add(path[:at])
                at = path.rfind("/", 0, at)
        return parents

    def _category(self, path: str, directories: set[str]) -> str:
        """The file's category, a directory named as one (the rules go by name alone)."""
        f = self.files.get(path)
        kind = f.category if f is not None else category(path)
        return DIRECTORY if kind == "other" and path in directories else kind

    def _file_row(self, f: FileStats, directories: set[str]) -> dict[str, Any]:
        row = {k: v for k, v in vars(f).items() if k != "read_sizes"}
        row["category"] = self._category(f.path, directories)
        row["seconds"] = round(f.seconds, 6)
        row["read_sizes"] = dict(sorted(f.read_sizes.items(), key=lambda kv: -kv[1]))
        return row

    def flow_edges(self, limit: int = 40) -> list[dict[str, Any]]:
        """files → phases (reads) and phases → files (writes), by bytes; edges without bytes
        (only opens: the proc backend) are weighted by open count instead. A data file mapped into
        memory in a phase has an edge of its own, its mmap() count said. The many small files
        of a kind (modules, libraries, devices, config) become one node per kind, "python module files",
        whose edges say how many files they stand for."""
        phase_names, directories = set(self.phases), self._directories()
        weights = {k: n for k, n in self.edges.items() if n > 0} or dict(self.opens_by_edge)
        by_bytes = any(n > 0 for n in self.edges.values())
        merged: dict[tuple[str, str], dict[str, Any]] = {}
        for (a, b), n in weights.items():
            path = a if b in phase_names else b
            kind = self._category(path, directories)
            if kind == "phase marker":
                continue
            node = f"{kind} files" if kind in GROUPED_IN_FLOW else path
            key = (node, b) if b in phase_names else (a, node)
            edge = merged.setdefault(key, {"from": key[0], "to": key[1], "bytes": 0, "opens": 0, "files": 0})
            edge["bytes"] += n if by_bytes else 0
            edge["opens"] += self.opens_by_edge.get((a, b), 0) if by_bytes else n
            edge["files"] += 1
        for (path, phase), n in self.maps_by_edge.items():  # read through a mapping: no bytes to weigh
            if self._category(path, directories) not in GROUPED_IN_FLOW:
                edge = merged.setdefault((path, phase), {"from": path, "to": phase, "bytes": 0, "opens": 0, "files": 1})
                edge["opens"] = self.opens_by_edge.get((path, phase), 0)
                edge["maps"] = n
        edges = sorted(merged.values(), key=lambda e: (-e["bytes"], -e.get("maps", 0), -e["opens"]))
        return edges[:limit]
