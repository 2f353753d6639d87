"""dlscope trace: phase markers, the strace parser, fd resolution, the analysis, and every
backend available here on a controlled workload (a known file read in known chunks, a
checkpoint written atomically) — the backends must agree to the byte."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

import pytest

import dlscope
from dlscope.analysis.syscalls import CATEGORY_LISTED, Analysis, category
from dlscope.cli import main
from dlscope.contract.ioevents import KINDS, TRACED_SYSCALLS, FdTables, make_event
from dlscope.phases import MARKER_PREFIX, parse_marker
from dlscope.report.flowgraph import fallback_svg, render_svg
from dlscope.report.sections.iotrace import file_table, findings, phase_table
from dlscope.supervise.iotrace import ebpf, strace
from dlscope.supervise.iotrace import tracer as tracer_module
from dlscope.supervise.iotrace.tracer import EbpfReader, TraceSink, availability, collect_ebpf, trace_command

AVAILABLE = availability()
BACKENDS = [
    pytest.param(name, marks=pytest.mark.skipif(why is not None, reason=f"{name}: {why}"))
    for name, why in AVAILABLE.items()
]
CHUNK, CHUNKS, TAIL = 65536, 4, 1000  # the known file: 4 full chunks and a short one
CKPT_WRITES, CKPT_WRITE = 10, 10000

WORKLOAD = textwrap.dedent(
    f"""
    import os, sys
    import dlscope
    src, ckpt = sys.argv[1], sys.argv[2]
    with dlscope.phase("data_load"):
        fd = os.open(src, os.O_RDONLY)
        copy = os.dup(fd)               # fd resolution must follow the dup
        os.close(fd)
        with os.fdopen(copy, "rb", buffering=0) as f:
            while f.read({CHUNK}):
                pass
    with dlscope.phase("checkpoint_save"):
        with open(ckpt + ".tmp", "wb", buffering=0) as out:
            for _ in range({CKPT_WRITES}):
                out.write(b"x" * {CKPT_WRITE})
            os.fsync(out.fileno())
        os.replace(ckpt + ".tmp", ckpt)  # an atomic save: reported under the final name
    sys.exit(int(sys.argv[3]) if len(sys.argv) > 3 else 0)
    """
)


def make_workload(directory: Path) -> tuple[list[str], Path, Path]:
    script = directory / "workload.py"
    script.write_text(WORKLOAD)
    known = directory / "known.bin"
    known.write_bytes(os.urandom(CHUNK * CHUNKS + TAIL))
    ckpt = directory / "model.pt"
    return [sys.executable, str(script), str(known), str(ckpt)], known, ckpt


@pytest.fixture
def workload(tmp_path: Path) -> tuple[list[str], Path, Path]:
    return make_workload(tmp_path)


@pytest.fixture(scope="module")
def traced(tmp_path_factory) -> dict:
    """The workload traced once per available backend (bpftrace takes seconds to start)."""
    directory = tmp_path_factory.mktemp("workload")
    argv, known, ckpt = make_workload(directory)
    outcomes = {
        backend: trace_command(argv, backend, directory / backend, say=lambda _: None)
        for backend, why in AVAILABLE.items()
        if why is None
    }
    return {"outcomes": outcomes, "known": known, "ckpt": ckpt, "dir": directory}


def by_path(section: dict, path: Path) -> dict:
    return next(f for f in section["files"] if f["path"] == str(path))


def calls_on(trace_dir: Path, path: Path) -> int:
    """The events of a trace's events.jsonl on `path`."""
    with open(trace_dir / "events.jsonl") as f:
        return sum(1 for event in map(json.loads, f) if event.get("path") == str(path))


def by_phase(section: dict, name: str) -> dict:
    return next(p for p in section["phases"] if p["phase"] == name)


# --- phase markers -------------------------------------------------------------------------


def test_phase_marker_is_a_failing_open_and_parses_back():
    with dlscope.phase("checkpoint_save"):
        pass
    with pytest.raises(NotADirectoryError):
        os.open(f"{MARKER_PREFIX}x/begin", os.O_RDONLY)
    assert parse_marker(f"{MARKER_PREFIX}checkpoint_save/begin") == ("checkpoint_save", "begin")
    assert parse_marker("/dev/null") is None
    with pytest.raises(ValueError):
        dlscope.phase("no/slashes").__enter__()


def test_import_dlscope_stays_light():
    code = "import sys, dlscope; dlscope.phase; print('torch' in sys.modules, 'numpy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


# --- strace parsing, fd tables, analysis ----------------------------------------------------

STRACE_LINES = r"""
100 1.000000 openat(AT_FDCWD</w>, "data/x", O_RDONLY|O_CLOEXEC) = 3</w/data/x> <0.000010>
100 1.000100 read(3</w/data/x>, ""..., 4096) = 4096 <0.000020>
101 1.000150 read(3</w/data/x>,  <unfinished ...>
100 1.000160 --- SIGCHLD {si_signo=SIGCHLD, si_code=CLD_EXITED} ---
101 1.000300 <... read resumed>""..., 4096) = 100 <0.000150>
100 1.000400 openat(AT_FDCWD</w>, "/nope", O_RDONLY) = -1 ENOENT (No such file or directory) <0.000005>
100 1.000500 openat(AT_FDCWD</w>, "caf\303\251 \"q\".bin", O_WRONLY|O_CREAT) = 4</w/caf\303\251 "q".bin> <0.000009>
100 1.000510 openat(AT_FDCWD</w>, "raw\377.bin", O_RDONLY) = -1 ENOENT (No such file or directory) <0.000004>
100 1.000600 clone3({flags=CLONE_VM|CLONE_FS|CLONE_FILES|CLONE_THREAD, exit_signal=0}, 88) = 102 <0.000030>
102 1.000700 write(4</w/caf\303\251 "q".bin>, ""..., 10) = 10 <0.000011>
100 1.000800 openat(AT_FDCWD</w>, "/dev/null/dlscope/phase/save/begin", O_RDONLY) = -1 ENOTDIR (Not a dir) <0.000003>
100 1.000900 rename("/w/a.tmp", "/w/a.pt") = 0 <0.000020>
100 1.001000 exit_group(0) = ?
100 1.001100 +++ exited with 0 +++
"""


def test_strace_parser_joins_unfinished_lines_and_decodes_paths():
    parser = strace.StraceParser()
    events = [e for line in STRACE_LINES.strip().splitlines() if (e := parser.feed(line)) is not None]
    calls = [e["call"] for e in events]
    assert calls == ["openat", "read", "read", "openat", "openat", "openat", "write", "phase", "rename"]
    resumed = events[2]
    assert (resumed["tid"], resumed["ts"], resumed["bytes"], resumed["dur"]) == (101, 1.00015, 100, 0.00015)
    assert events[3]["err"] == "ENOENT" and events[3]["ret"] < 0
    assert events[4]["path"] == '/w/café "q".bin'
    assert os.fsencode(events[5]["path"]) == b"/w/raw\xff.bin"  # not UTF-8: the exact bytes (surrogateescape)
    assert (events[6]["pid"], events[6]["tid"]) == (100, 102)  # a thread maps to its process
    assert events[7] == {"ts": 1.0008, "pid": 100, "tid": 100, "call": "phase", "name": "save", "edge": "begin"}
    assert events[8]["target"] == "/w/a.pt"


def test_fd_tables_follow_dup_fcntl_and_fork():
    fds = FdTables()

    def ev(call, ret, pid=1, fd=None, path=None):
        return make_event(0.0, pid, pid, call, ret, path=path, fd=fd)

    fds.resolve(ev("openat", 5, path="/data/a"))
    for event, arg in ((ev("dup", 6, fd=5), None), (ev("dup2", 9, fd=5), None), (ev("fcntl", 10, fd=5), 1030)):
        fds.resolve(event, arg)
    fds.resolve(ev("fcntl", 0, fd=5), 2)  # F_SETFD: no new descriptor
    fds.fork(1, 2)
    fds.resolve(ev("close", 0, fd=5))
    child_read = ev("read", 10, pid=2, fd=5)
    fds.resolve(child_read)
    assert child_read["path"] == "/data/a"  # the child inherited fd 5 before the parent closed it
    for fd in (6, 9, 10):
        read = ev("read", 1, fd=fd)
        fds.resolve(read)
        assert read["path"] == "/data/a"
    gone = ev("read", 1, fd=5)
    fds.resolve(gone)
    assert gone["path"] == "<fd 5>"
    fds.resolve(ev("openat", 7, path="/data"))
    at = ev("newfstatat", 0, path="b")
    at["dirfd"] = 7  # newfstatat(7, "b"): relative to the directory descriptor
    fds.resolve(at)
    assert at["path"] == "/data/b"


def test_a_late_close_of_a_descriptors_previous_holder_leaves_the_file_named():
    """Another thread closed fd 5 (a socket) just before this open took the number; its close is
    delivered after the first reads: the reads after it are still of the dataset file."""
    fds = FdTables()
    fds.resolve(make_event(1.0, 1, 1, "openat", 5, path="/data/train-images-idx3-ubyte.gz"))
    first = make_event(1.1, 1, 1, "read", 65536, fd=5)
    late_close = make_event(0.9, 1, 2, "close", 0, fd=5)
    second = make_event(1.2, 1, 1, "read", 65536, fd=5)
    for event in (first, late_close, second):
        fds.resolve(event)
    assert first["path"] == second["path"] == "/data/train-images-idx3-ubyte.gz"
    closed = make_event(1.3, 1, 1, "close", 0, fd=5)
    after = make_event(1.4, 1, 1, "read", 1, fd=5)
    fds.resolve(closed)
    fds.resolve(after)
    assert after["path"] == "<fd 5>"  # its own close does unname it


def test_analysis_nests_phases_and_follows_renames():
    a = Analysis()

    def add(ts, call, ret=0, path=None, **extra):
        event = make_event(ts, 1, 1, call, ret, 0.001, path=path, target=extra.get("target"))
        a.add(event)

    add(0.0, "openat", 3, "/lib/python3.11/os.py")
    add(0.1, "read", 50, "/lib/python3.11/os.py")
    add(1.0, "openat", -20, f"{MARKER_PREFIX}checkpoint/begin")
    add(1.5, "openat", -20, f"{MARKER_PREFIX}checkpoint_save/begin")
    add(1.6, "write", 100, "/run/.tmp-final.pt")
    add(1.7, "rename", 0, "/run/.tmp-final.pt", target="/run/final.pt")
    add(2.0, "openat", -20, f"{MARKER_PREFIX}checkpoint_save/end")
    add(2.5, "read", 100, "/run/final.pt")
    add(3.0, "openat", -20, f"{MARKER_PREFIX}checkpoint/end")
    a.finish()
    summary = a.summary()
    seconds = {p["phase"]: p["seconds"] for p in summary["phases"]}
    assert seconds == pytest.approx({"startup": 1.0, "checkpoint": 1.5, "checkpoint_save": 0.5, "outside-phases": 0})
    final = next(f for f in summary["files"] if f["path"] == "/run/final.pt")
    assert (final["bytes_written"], final["bytes_read"], final["first_phase"]) == (100, 100, "checkpoint_save")
    assert not any(f["path"] == "/run/.tmp-final.pt" for f in summary["files"])
    assert {"from": "checkpoint_save", "to": "/run/final.pt", "bytes": 100, "opens": 0, "files": 1} in summary["flow"]
    assert {"from": "python module files", "to": "startup", "bytes": 50, "opens": 1, "files": 1} in summary["flow"]
    assert category("/x/MNIST/raw/train-images-idx3-ubyte.gz") == "dataset"
    assert category("/v/lib/python3.11/site-packages/torch/__init__.py") == "python module"
    assert category("/usr/lib/x86_64-linux-gnu/libc.so.6") == "shared library"
    assert category("/r/tensorboard/events.out.tfevents.1.host") == "tensorboard log"
    # `dlscope run --trace-io`: what dlscope keeps in the job's processes is not the job's data
    for own in ("live-41.bin", "41.steps", "profile-41.json", "stacks-41.txt"):
        assert category(f"/r/run/processes/{own}") == "dlscope records"
    assert category("/tmp/dlscope-calibrate-x1y2/live-41.bin") == "dlscope records"


def test_dlscope_own_records_are_kept_out_of_the_phases_totals_and_said_beside_them():
    """Under `dlscope run --trace-io` the profiler's trace is written in the job's train phase: a
    megabyte the job never wrote; and a stack walk in the job (torch.manual_seed's) reads dlscope's
    own modules, its wrappers being in the stack. The phase counts the job's bytes; dlscope's
    records and code are said apart, and its code is filed as such, not as the job's modules."""
    hooks = os.path.join(os.path.dirname(dlscope.__file__), "injob", "hooks.py")
    assert category(hooks) == "dlscope code" and category(os.path.realpath(hooks)) == "dlscope code"
    a = Analysis()
    marker = f"{MARKER_PREFIX}train_steps/begin"
    for event in (
        make_event(1.0, 1, 1, "openat", 3, path=marker),
        make_event(1.1, 1, 1, "write", 100, path="/r/out/ckpt.pt"),
        make_event(1.2, 1, 1, "write", 1_000_000, path="/r/run/processes/profile-41.json"),
        make_event(1.3, 1, 1, "write", 58, path="/r/run/processes/41.jsonl"),
        make_event(1.4, 1, 1, "read", 4096, path=hooks),
    ):
        a.add(event)
    a.finish()
    summary = a.summary()
    [train] = [p for p in summary["phases"] if p["phase"] == "train_steps"]
    assert (train["bytes_written"], train["bytes_read"], train["calls"]) == (100, 0, 1)
    assert train["own_records"] == {"calls": 3, "bytes_read": 4096, "bytes_written": 1_000_058}
    assert summary["categories"]["dlscope records"]["bytes_written"] == 1_000_058  # still in the file tables
    assert summary["categories"]["dlscope code"]["bytes_read"] == 4096 and "python module" not in summary["categories"]
    section = {**summary, "backend": "ebpf"}
    legend = phase_table(section).legend
    assert "3 calls, 4,096 bytes read, 1,000,058 bytes written" in legend


def test_a_path_that_holds_other_paths_seen_is_a_directory_not_other():
    """The import system stats the script's directory and the venv's at every import: tens of ms
    in the top files by time, which "other" would leave unexplained."""
    a = Analysis()
    for event in (
        make_event(1.0, 1, 1, "newfstatat", 0, path="/w/proj"),
        make_event(1.1, 1, 1, "openat", 3, path="/w/proj/data/0.bin"),
        make_event(1.2, 1, 1, "read", 4096, path="/w/proj/data/0.bin"),
        make_event(1.3, 1, 1, "newfstatat", 0, path="/w/proj/.venv/lib/python3.11/site-packages"),
        make_event(1.4, 1, 1, "newfstatat", -2, path="/w/other"),
    ):
        a.add(event)
    a.finish()
    rows = {r["path"]: r["category"] for r in a.file_rows()}
    assert rows == {
        "/w/proj": "directory",
        "/w/proj/data/0.bin": "other",
        "/w/proj/.venv/lib/python3.11/site-packages": "python module",  # a rule names it first
        "/w/other": "other",  # nothing seen inside it: not known to be a directory
    }
    assert a.summary()["categories"]["directory"]["files"] == 1


def test_a_dataset_of_many_small_files_is_listed_by_its_largest_and_counted_whole():
    """A dataset is always in the file table however small its files, but a dataset of a million
    small files (an image folder) must not put a million rows in results.json and the terminal:
    its largest are listed, the caption says how many of how many, files.csv keeps them all."""
    a = Analysis()
    n = 3 * CATEGORY_LISTED
    for i in range(n):
        path = f"/data/imgs/{i:05d}.npy"
        a.add(make_event(1.0 + i * 1e-3, 1, 1, "openat", 3, 1e-6, path=path))
        a.add(make_event(1.0 + i * 1e-3, 1, 1, "read", 1000 + i, 1e-6, path=path))
    for i in range(3):
        a.add(make_event(2.0 + i, 1, 1, "write", 10, 1e-6, path=f"/run/ckpt-{i}.pt"))
    a.finish()
    summary = a.summary()
    listed = [f["path"] for f in summary["files"] if f["category"] == "dataset"]
    largest = [f"/data/imgs/{i:05d}.npy" for i in range(n - 1, n - 1 - CATEGORY_LISTED, -1)]
    assert set(largest) <= set(listed) and len(listed) < n
    assert summary["files_cut"] == {"dataset": n}
    assert sum(f["category"] == "checkpoint" for f in summary["files"]) == 3  # few: all of them
    assert len(a.file_rows()) == n + 3  # files.csv
    caption = file_table({**summary, "files_total": n + 3}).caption
    assert f"{len(listed)} of {n} dataset files" in caption


def test_flow_graph_svg_with_and_without_graphviz():
    edges = [
        {"from": "/d/train.gz", "to": "data_load", "bytes": 9_000_000, "opens": 1},
        {"from": "checkpoint_save", "to": "/r/final.pt", "bytes": 370_000, "opens": 1},
    ]
    root = ET.fromstring(fallback_svg(edges, ["data_load", "checkpoint_save"]))
    assert root.tag.endswith("svg")
    texts = "".join(root.itertext())
    assert "/d/train.gz" in texts and "checkpoint_save" in texts
    svg, engine = render_svg(edges, ["data_load", "checkpoint_save"])
    assert "<svg" in svg and "data_load" in svg and engine in ("graphviz", "built-in")


# --- backends on a controlled workload ------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_backend_sees_exact_bytes_of_a_controlled_workload(backend, traced):
    outcome, known, ckpt = traced["outcomes"][backend], traced["known"], traced["ckpt"]
    s = outcome.section
    assert (outcome.backend, outcome.exit_code) == (backend, 0)
    size = known.stat().st_size
    written = CKPT_WRITES * CKPT_WRITE
    if backend == "proc":  # no per-call events: bytes per phase from /proc/self/io
        assert by_phase(s, "data_load")["proc_io"]["rchar"] == size
        assert by_phase(s, "checkpoint_save")["proc_io"]["wchar"] == written
        assert by_path(s, known)["opens"] == 1 and by_path(s, ckpt)["first_phase"] == "checkpoint_save"
    else:
        src, out = by_path(s, known), by_path(s, ckpt)
        assert (src["reads"], src["bytes_read"]) == (CHUNKS + 2, size)  # + the short chunk + EOF
        assert src["read_sizes"] == {"≤64 KiB": CHUNKS, "≤1 KiB": 1}
        assert (out["writes"], out["bytes_written"]) == (CKPT_WRITES, written)
        assert (src["first_phase"], out["first_phase"]) == ("data_load", "checkpoint_save")
        assert by_phase(s, "data_load")["bytes_read"] == size
        assert by_phase(s, "checkpoint_save")["bytes_written"] == written
        assert by_phase(s, "checkpoint_save")["by_kind"]["sync"]["count"] == 1
    exports = traced["dir"] / backend
    trace = json.loads((exports / "trace.json").read_text())
    phases = [e for e in trace["traceEvents"] if e.get("cat") == "phase"]
    assert [(e["name"], e["ph"]) for e in phases] == [
        ("data_load", "B"),
        ("data_load", "E"),
        ("checkpoint_save", "B"),
        ("checkpoint_save", "E"),
    ]
    with open(exports / "events.jsonl") as f:
        assert sum(1 for _ in f) >= s["events"]
    assert (exports / "files.csv").read_text().startswith("path,category,")


MAPS = 5
MAPPED = textwrap.dedent(
    f"""
    import mmap, sys
    import dlscope
    with dlscope.phase("train_steps"), open(sys.argv[1], "rb") as f:
        for _ in range({MAPS}):  # as numpy.memmap does for every batch of nanoGPT's get_batch
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
                sum(m[i] for i in range(0, len(m), 4096))
    """
)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_memory_mapped_data_file_is_named_with_its_maps_not_as_unread(backend, tmp_path):
    script, data = tmp_path / "mapped.py", tmp_path / "tokens.bin"
    script.write_text(MAPPED)
    data.write_bytes(os.urandom(1 << 20))
    s = trace_command([sys.executable, str(script), str(data)], backend, tmp_path / "out", say=lambda _: None).section
    f = by_path(s, data)
    assert (f["opens"], f["maps"], f["bytes_read"]) == (1, MAPS, 0)
    assert s["mapped_files"] == [str(data)]  # not the C library's locale tables, mapped at start-up
    [edge] = [e for e in s["flow"] if e["from"] == str(data)]
    assert (edge["to"], edge["maps"]) == ("train_steps", MAPS)
    [text] = [t for _, t in findings(s) if t.startswith("Mapped into memory")]
    assert f"tokens.bin ({MAPS}× in train_steps)" in text and "page faults" in text


@pytest.mark.skipif(AVAILABLE["ebpf"] is not None or AVAILABLE["strace"] is not None, reason="needs ebpf and strace")
def test_ebpf_and_strace_agree_exactly(traced):
    def counts(backend):
        s = traced["outcomes"][backend].section
        files = (by_path(s, traced["known"]), by_path(s, traced["ckpt"]))
        return [(f["opens"], f["reads"], f["bytes_read"], f["writes"], f["bytes_written"]) for f in files]

    assert counts("ebpf") == counts("strace")


EVERY_CALL = textwrap.dedent(
    """
    import mmap, os, sys
    d = sys.argv[1]
    path = os.path.join(d, "f.bin")
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    os.pwrite(fd, b"a" * 300, 0)
    os.writev(fd, [b"b" * 20, b"c" * 30])
    os.lseek(fd, 0, os.SEEK_SET)
    os.pread(fd, 100, 10)
    os.readv(fd, [bytearray(7), bytearray(8)])
    os.fdatasync(fd)
    os.fstat(fd)
    mmap.mmap(fd, 0).close()
    two = os.dup2(fd, 50)
    three = os.dup(fd)
    os.close(two), os.close(three)
    os.close(fd)
    os.stat(path), os.lstat(path)
    os.mkdir(os.path.join(d, "sub"))
    os.listdir(d)
    os.rename(path, path + ".2")
    os.unlink(path + ".2")
    """
)


@pytest.mark.skipif(AVAILABLE["ebpf"] is not None or AVAILABLE["strace"] is not None, reason="needs ebpf and strace")
def test_ebpf_sees_every_call_family_as_strace_does(tmp_path):
    """ebpf picks calls by number out of two raw_syscalls tracepoints: each call on the file and
    its folder, with its bytes, must be exactly what strace (one name per call) sees."""
    script = tmp_path / "every_call.py"
    script.write_text(EVERY_CALL)

    def calls(backend):
        work = tmp_path / backend
        work.mkdir()
        outcome = trace_command([sys.executable, str(script), str(work)], backend, tmp_path / f"t-{backend}", say=print)
        assert outcome.exit_code == 0
        mine = {str(work / "f.bin"), str(work / "f.bin.2"), str(work / "sub"), str(work)}
        seen, kinds = Counter(), set()
        with open(tmp_path / f"t-{backend}" / "events.jsonl") as f:
            for event in map(json.loads, f):
                if event.get("path") in mine:
                    seen[(event["call"], event["path"].removeprefix(str(work)), event.get("bytes"))] += 1
                    kinds.add(event["kind"])
        return outcome, seen, kinds

    ebpf_outcome, by_ebpf, kinds = calls("ebpf")
    _, by_strace, _ = calls("strace")
    assert by_ebpf == by_strace
    assert kinds == {"open", "close", "read", "write", "seek", "sync", "rename", "unlink", "mkdir", "stat"} | {
        "getdents",
        "mmap",
        "dup",
    }
    # two raw_syscalls probes (+ process tracking), not one pair per call: start-up stays short
    assert ebpf_outcome.section["notes"]["attached_probes"] < len(TRACED_SYSCALLS) / 4


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_file_named_relative_and_absolute_is_one_file(backend, tmp_path, monkeypatch):
    """A script that changes directory, writes a file by a relative name, reads it by its absolute
    one and renames it by relative names: one file of the table on every backend, under its last
    name, with both opens (the proc backend once kept relative names, and strace's rename() had no
    directory to join them to: two files, one of them a bare `rel.bin`)."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(tmp_path)  # the command starts here, then moves to work/
    script = (
        "import os\nos.chdir('work')\n"
        "with open('rel.bin', 'wb') as f:\n    f.write(b'x' * 100)\n"
        f"open({str(work / 'rel.bin')!r}, 'rb').read()\n"
        "os.rename('rel.bin', 'moved.bin')\n"
    )
    outcome = trace_command([sys.executable, "-c", script], backend, tmp_path / "t", say=print)
    outcome.settle()
    names = {f["path"] for f in outcome.section["files"]}
    assert all(name.startswith("/") for name in names), names
    assert by_path(outcome.section, work / "moved.bin")["opens"] == 2
    with open(tmp_path / "t" / "events.jsonl") as f:
        [rename] = [e for e in map(json.loads, f) if e["call"] in KINDS["rename"]]
    assert (rename["path"], rename["target"]) == (str(work / "rel.bin"), str(work / "moved.bin"))


@pytest.mark.skipif(AVAILABLE["ebpf"] is not None, reason=f"ebpf: {AVAILABLE['ebpf']}")
def test_ebpf_keeps_the_backlog_of_a_command_that_ends_in_a_burst_of_calls(tmp_path, monkeypatch):
    """A command that ends right after 20,000 stats leaves bpftrace behind: stopped when the command
    ends, it kept ~5,000 of them here, the rest dropped uncounted; drained until the mark made on each
    CPU after the command ended has come through, it keeps every one — with no wait for a silence
    (the fallback where a thread cannot be moved between CPUs). 20,000 records fit the 8 MiB per-CPU
    buffer, so none may be lost in the kernel either (at 40,000 a fast host overflows it: lost, but
    counted — a different matter)."""

    def no_silence(self, *args):
        raise AssertionError("drained by waiting for a silence, not by the marks")

    monkeypatch.setattr(EbpfReader, "wait_quiet", no_silence)
    target = tmp_path / "polled"
    target.touch()
    script = f"import os\nfor _ in range(20_000):\n    os.stat({str(target)!r})\n"
    outcome = trace_command([sys.executable, "-c", script], "ebpf", tmp_path / "t", say=print)
    assert outcome.exit_code == 0
    assert outcome.section["notes"]["lost_events"] == 0
    assert calls_on(tmp_path / "t", target) == 20_000


@pytest.mark.skipif(AVAILABLE["ebpf"] is not None, reason=f"ebpf: {AVAILABLE['ebpf']}")
def test_ebpf_reads_every_event_when_bpftrace_is_held_off_the_cpu_as_the_command_ends(tmp_path):
    """On a loaded machine bpftrace can wait for a core longer than any silence dlscope might wait
    for. Here it is stopped (SIGSTOP) while the command makes 20,000 stats, and let go a second after
    the command has ended: a drain that trusted a silence would end before bpftrace had printed one
    of them; the marks made on each CPU after the command ended come through only behind them."""
    target = tmp_path / "polled"
    target.touch()
    script = (
        "import os, signal, subprocess, sys\n"
        "tracer = int(subprocess.run(['pgrep', '-P', str(os.getppid()), '-x', 'bpftrace'],"
        " capture_output=True, text=True).stdout.split()[0])\n"
        "os.kill(tracer, signal.SIGSTOP)\n"
        f"for _ in range(20_000):\n    os.stat({str(target)!r})\n"
        "subprocess.Popen(['sh', '-c', f'sleep 1; kill -CONT {tracer}'], start_new_session=True)\n"
    )
    outcome = trace_command([sys.executable, "-c", script], "ebpf", tmp_path / "t", say=print)
    outcome.settle()
    assert outcome.exit_code == 0
    assert outcome.section["notes"]["lost_events"] == 0
    assert calls_on(tmp_path / "t", target) == 20_000


@pytest.mark.skipif(AVAILABLE["ebpf"] is not None, reason=f"ebpf: {AVAILABLE['ebpf']}")
def test_ebpf_drain_whose_marks_never_come_ends_on_bpftraces_silence(tmp_path, monkeypatch):
    """Where bpftrace cannot see dlscope's marks (another PID namespace), the drain ends once its
    output has been silent, not after its 2-minute limit (here: no limit at all), with the events."""
    monkeypatch.setattr(tracer_module, "mark_each_cpu", lambda: sorted(os.sched_getaffinity(0)))  # no calls
    monkeypatch.setattr(tracer_module, "MARKS_SILENCE_S", 0.5)
    monkeypatch.setattr(tracer_module, "DRAIN_LIMIT_S", float("inf"))
    target = tmp_path / "read"
    target.write_bytes(b"x" * 100)
    done: list = []
    tracing = threading.Thread(
        target=lambda: done.append(
            trace_command([sys.executable, "-c", f"open({str(target)!r}).read()"], "ebpf", tmp_path / "t", print)
        ),
        daemon=True,
    )
    tracing.start()
    tracing.join(120)  # a liveness bound: the drain would otherwise never end
    assert done, "the drain waited for marks that never came"
    done[0].settle()
    assert done[0].exit_code == 0 and by_path(done[0].section, target)["opens"] == 1


@pytest.mark.skipif(AVAILABLE["ebpf"] is not None, reason=f"ebpf: {AVAILABLE['ebpf']}")
def test_ebpf_events_are_analysed_while_the_command_runs(tmp_path):
    """The ebpf reader hands each event to the analysis and the exports as bpftrace prints it, so
    nothing but the last moment's events is left for after the command (before: all of them,
    5.4 s after a Ctrl-C on a loaded 2-core machine). The command opens a marker file, keeps making
    calls for a second (the reorder window, 0.5 s, passes the open on), then blocks until the
    test, having seen the open in the analysis, lets it go."""
    marker, gate = tmp_path / "marker", tmp_path / "gate"
    os.mkfifo(gate)
    script = (
        "import os, time\n"
        f"open({str(marker)!r}, 'w').close()\n"
        "end = time.monotonic() + 1.0\n"
        "while time.monotonic() < end:\n    os.stat('/')\n    time.sleep(0.01)\n"
        f"open({str(gate)!r}).read()\n"
    )
    seen = threading.Event()

    class Watched(TraceSink):
        def _ordered(self, event: dict) -> None:
            super()._ordered(event)
            if event.get("path") == str(marker) and event["call"] in KINDS["open"]:
                seen.set()

    out = tmp_path / "t"
    out.mkdir()
    sink = Watched(out, os.getcwd())
    done: list = []
    tracing = threading.Thread(
        target=lambda: done.append(collect_ebpf([sys.executable, "-c", script], out, None, sink))
    )
    tracing.start()
    try:
        assert seen.wait(120), "the marker's open reached the analysis only after the command"
        assert not done, "the command ended before the test let it go"
    finally:
        with open(gate, "w") as f:  # lets the command end
            f.write("go")
        tracing.join(120)
    sink.close()
    assert done and done[0].returncode == 0
    assert by_path(sink.analysis.summary(), marker)["opens"] == 1


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_exit_status_passes_through_and_a_killed_command_still_reports(backend, workload, tmp_path):
    argv, known, _ = workload
    failed = trace_command([*argv, "3"], backend, tmp_path / "a", say=lambda _: None)
    assert failed.exit_code == 3
    killer = tmp_path / "killed.py"
    killer.write_text(
        "import os, signal, sys\nimport dlscope\n"
        "with dlscope.phase('data_load'):\n    open(sys.argv[1], 'rb').read()\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    outcome = trace_command([sys.executable, str(killer), str(known)], backend, tmp_path / "b", say=lambda _: None)
    assert outcome.exit_code == 128 + signal.SIGKILL
    assert any(p["phase"] == "data_load" for p in outcome.section["phases"])
    assert by_path(outcome.section, known)["opens"] == 1
    failed.settle()
    outcome.settle()  # bpftrace's probes detach beside the analysis; settle() returns once it is gone
    children = subprocess.run(["ps", "--ppid", str(os.getpid()), "-o", "comm="], capture_output=True, text=True)
    assert not {"strace", "bpftrace"} & set(children.stdout.split()), "a tracer outlived the run"


@pytest.mark.slow
@pytest.mark.parametrize("backend", [b for b in BACKENDS if b.values[0] != "ebpf"])
def test_ctrl_c_stops_cleanly_with_a_report(backend, tmp_path):
    script = tmp_path / "slow.py"
    script.write_text("import time\nimport dlscope\nwith dlscope.phase('waiting'):\n    time.sleep(60)\n")
    run = tmp_path / "run"
    argv = [sys.executable, "-m", "dlscope.cli", "trace", "--backend", backend, "--out", str(run)]
    # a terminal's Ctrl-C: SIGINT to the whole foreground process group
    child = subprocess.Popen([*argv, "--", sys.executable, str(script)], start_new_session=True)
    deadline = time.monotonic() + 60
    while not (run / "iotrace").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(2)  # let the command reach its phase
    os.killpg(child.pid, signal.SIGINT)
    assert child.wait(timeout=60) == 128 + signal.SIGINT
    section = json.loads((run / "results.json").read_text())["sections"]["iotrace"]
    assert section["interrupted"] and any(p["phase"] == "waiting" for p in section["phases"])
    assert (run / "report.html").exists()


def test_unavailable_backend_says_why_and_falls_back(workload, tmp_path, monkeypatch):
    argv, _, _ = workload
    monkeypatch.setattr(ebpf, "available", lambda: "eBPF needs root or CAP_BPF+CAP_PERFMON")
    monkeypatch.setattr(strace, "available", lambda: "strace is not installed")
    said = []
    outcome = trace_command(argv, "ebpf", tmp_path / "t", say=said.append)
    assert outcome.backend == "proc"
    assert [s["backend"] for s in outcome.section["skipped_backends"]] == ["ebpf", "strace"]
    assert len(said) == 2 and "CAP_BPF" in said[0]
    assert outcome.section["notes"]["python_processes"] >= 1  # the report lists what proc cannot see
    assert any("proc backend" in text for _, text in findings(outcome.section))


# --- the command line -----------------------------------------------------------------------


def test_trace_cli_bad_input_is_one_line_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["trace", "--out", str(out), "--", "no-such-command-xyz"]) == 2
    assert main(["trace", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "no-such-command-xyz: command not found" in err[0] and "no command" in err[1]
    assert not out.exists()


def test_trace_cli_writes_a_report_and_passes_the_exit_code(workload, tmp_path):
    argv, known, _ = workload
    run = tmp_path / "run"
    args = ["trace", "--backend", "proc", "--measure-overhead", "--repeats", "2", "--out", str(run)]
    assert main([*args, "--", *argv, "5"]) == 5
    section = json.loads((run / "results.json").read_text())["sections"]["iotrace"]
    assert section["exit_code"] == 5
    overhead = section["overhead"]
    assert len(overhead["untraced_seconds"]) == len(overhead["traced_seconds"]) == 2 and overhead["ratio"] > 0
    html = (run / "report.html").read_text()
    assert "File data flow through the OS" in html and "<svg" in html and str(known) in html


@pytest.mark.slow
def test_traced_lab_shows_mnist_under_data_load_and_the_checkpoint(tmp_path):
    run = tmp_path / "lab"
    args = ["lab", "--trace-io", "--train-subset", "512", "--test-subset", "500", "--epochs", "1"]
    args += ["--steps", "dataset,model,train,profile,checkpoint"]
    args += ["--no-tensorboard", "--no-progress", "--profile-steps", "1", "--target-acc", "1", "--out", str(run)]
    done = subprocess.run([sys.executable, "-m", "dlscope.cli", *args], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    results = json.loads((run / "results.json").read_text())
    assert results["run"]["status"] == "ok"
    # one writer: the traced child recorded the lab's steps, the parent added the trace once
    assert results["steps"] == ["dataset", "model", "train", "profile", "checkpoint", "iotrace"]
    assert results["run"]["argv"][:2] == ["lab", "--trace-io"]
    s = results["sections"]["iotrace"]
    # the four files opened (the loader also stats the uncompressed names it looks for first)
    mnist = [f for f in s["files"] if f["category"] == "dataset" and "ubyte" in f["path"] and f["opens"]]
    assert len(mnist) == 4
    for f in mnist:
        assert f["last_phase"] == "data_load"
        if s["backend"] != "proc":
            assert f["bytes_read"] == Path(f["path"]).stat().st_size
    final = next(f for f in s["files"] if f["path"].endswith("checkpoints/final.pt"))
    assert final["first_phase"] == "checkpoint_save"
    phases = {p["phase"] for p in s["phases"]}
    assert {"startup", "data_load", "preprocess", "model_build", "train-epoch-1", "evaluate-epoch-1"} <= phases
    assert {"profile", "checkpoint_save", "checkpoint_load", "verify"} <= phases
    if s["backend"] != "proc":
        assert by_phase(s, "checkpoint_load")["bytes_read"] >= final["bytes_written"] > 0
    md = (run / "report.md").read_text()
    assert "## File data flow through the OS" in md and (run / "figures" / "iotrace-dataflow.svg").exists()


def test_backends_whose_tools_are_missing_are_said_once_each_and_proc_traces(tmp_path):
    """With neither bpftrace nor strace on PATH, `dlscope trace` says why for each, as plain text (it
    once printed its own markup, `[warn]ebpf[/]`), and traces with the proc backend."""
    empty = tmp_path / "bin"
    empty.mkdir()
    env = {**os.environ, "PATH": str(empty), "COLUMNS": "200"}
    argv = [sys.executable, "-m", "dlscope.cli", "trace", "--backend", "ebpf", "--out", str(tmp_path / "run")]
    proc = subprocess.run(
        [*argv, "--", sys.executable, "-c", "open('/etc/hostname').read()"],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    said = proc.stdout + proc.stderr
    assert "[warn]" not in said and "[/]" not in said
    assert said.count("ebpf unavailable:") == 1 and said.count("strace unavailable: strace is not installed") == 1
    assert "with the proc backend" in said
