"""The batch x-ray of `dlscope run` (injob/batches.py, batchflow.py): scripts that read
real files through a DataLoader, with a known slow sample, a known large file or known busy-waits;
dlscope must name the step, the batch, the worker, the sample and the file, and the shares."""

from __future__ import annotations

import csv
import json
import sys
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from dlscope.analysis import batchflow
from dlscope.cli import main
from dlscope.contract.owncode import is_dlscope_code
from dlscope.injob import batches as batches_module
from dlscope.report.blocks import Table
from dlscope.report.sections import anatomy as anatomy_report
from dlscope.report.sections import batches as batches_report
from dlscope.rundir import load_results
from dlscope.supervise.iotrace import strace

SCRIPT = Path(__file__).parent / "scripts" / "batch_files.py"
NO_PROFILE = ["--profile-steps", "0"]
CHUNK = 65536  # the script's read size


BIG = 150  # the large file's size in the others': its reads under strace outlast a loaded machine's stalls


def make_files(directory: Path, count: int, size: int, big: int | None = None) -> list[Path]:
    directory.mkdir()
    paths = []
    for i in range(count):
        path = directory / f"{i:03d}.bin"
        path.write_bytes(bytes([i % 251]) * (size * BIG if i == big else size))
        paths.append(path)
    return paths


def observe(tmp_path: Path, *args: str, options: tuple[str, ...] = ()) -> tuple[dict, dict, Path]:
    out, truth = tmp_path / "run", tmp_path / "truth.json"
    argv = [sys.executable, str(SCRIPT), str(truth), str(tmp_path / "data"), *args]
    assert main(["run", "--out", str(out), *NO_PROFILE, *options, "--", *argv]) == 0
    return load_results(out)["sections"], json.loads(truth.read_text()), out


def built_indices(processes: Path) -> dict[tuple[int, int, int], list[int]]:
    """(pid, generation, batch idx) -> the sample indices that process recorded for that batch."""
    return {
        (int(path.stem), generation, idx): indices.tolist()
        for path in processes.glob("*.batches")
        for generation, idx, indices in batchflow.sample_indices(path)
    }


def indices_of(recorded: dict, row: dict[str, str]) -> list[int]:
    """The recorded sample indices of a batches.csv row."""
    return recorded[int(row["worker_pid"]), int(row["generation"]), int(row["batch"])]


def csv_rows(out: Path, batches: dict) -> list[dict[str, str]]:
    with open(out / batches["file"], newline="") as f:
        return list(csv.DictReader(f))


def test_a_sample_slow_at_one_fetch_only_is_told_from_a_slow_sample(tmp_path):
    """Sample 9 sleeps at its first fetch only (three epochs): the outlier is named with its other
    two fetches, fast, so the report calls that fetch slow, not the sample."""
    make_files(tmp_path / "data", 24, 4096)
    options = ("--workers", "2", "--sleep-index", "9", "--sleep-ms", "200", "--sleep-once", "--epochs", "3")
    sections, _, out = observe(tmp_path, *options)
    # (a busy machine may hold up another fetch of it past the outliers' bar: not as slow as this one)
    outlier = max((s for s in sections["batches"]["samples"]["outliers"] if s["sample"] == 9), key=lambda s: s["ms"])
    assert (outlier["pass"], outlier["other_fetches"], outlier["other_slow"]) == (0, 2, 0)
    assert outlier["ms"] >= 200 and outlier["other_median_ms"] < 200
    report = " ".join((out / "report.md").read_text().split())
    assert "its 2 other fetches took" in report and "that fetch was slow, not the sample" in report
    assert "(non-persistent workers start at every epoch)" in report  # these start at every epoch


def test_a_slow_sample_named_with_its_step_batch_and_worker_across_spawned_persistent_epochs(tmp_path):
    make_files(tmp_path / "data", 24, 4096)
    options = ("--workers", "2", "--sleep-index", "9", "--sleep-ms", "300", "--persistent", "--epochs", "2")
    sections, truth, out = observe(tmp_path, *options, "--start-method", "spawn", "--pin-memory")
    batches = sections["batches"]
    assert batches["batches_taken"] == batches["batches_built"] == batches["joined"] == truth["steps"] == 12
    steady = batches["longest_steady_wait"]
    # index 9 is in batch 2 (batch size 4), which DataLoader sends to worker 0 (round robin)
    assert (steady["batch"], steady["worker"], steady["slowest_sample"]) == (2, 0, 9)
    assert steady["waited_ms"] > 150 and steady["fetch_ms"] >= 300 and steady["slowest_sample_ms"] >= 300
    outliers = batches["samples"]["outliers"][:2]  # the slowest first (a loaded machine may add others)
    assert [(s["sample"], s["batch"], s["worker"]) for s in outliers] == [(9, 2, 0), (9, 2, 0)]
    assert sorted(s["pass"] for s in outliers) == [0, 1]  # persistent workers: the same batch each epoch
    # each fetch of it was slow: the sample's own cost, said so
    assert all((s["other_fetches"], s["other_slow"]) == (1, 1) for s in outliers)
    report = " ".join((out / "report.md").read_text().split())
    assert "the sample itself is slow" in report
    # the epochs' first waits are not said to be the workers' start: these workers stay up
    assert "persistent workers stay up, but prefetch nothing across an epoch's end" in report
    assert "non-persistent" not in report
    assert [(w["worker"], w["processes"], w["batches"]) for w in batches["workers"]] == [(0, 1, 6), (1, 1, 6)]
    assert steady["pin_ms"] is None  # pin_memory without an accelerator: torch warns and pins nothing
    assert not steady["ready_before_asked"] and "not its building" not in batches_report.wait_sentence(steady)
    with open(out / batches["file"], newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 12 and {r["step"] for r in rows} == {str(k) for k in range(12)}
    timeline = json.loads((out / "timeline.json").read_text())["traceEvents"]
    starts = [e for e in timeline if e["ph"] == "s" and e["cat"] == "batch"]
    ends = [e for e in timeline if e["ph"] == "f" and e["cat"] == "batch"]
    assert len(starts) == len(ends) == 12 and {e["pid"] for e in starts} == {w["pid"] for w in batches["workers"]}
    assert {e["pid"] for e in ends} == {sections["steps"]["main_pid"]}


@pytest.mark.skipif(strace.available() is not None, reason="strace not installed (scripts/install-tracers)")
def test_a_large_file_is_named_with_its_read_calls_and_bytes_under_strace(tmp_path):
    # 32 reads per file, 4,800 for the large one: under strace its batch waits 300+ ms, far above
    # what a busy machine's scheduling adds to another batch's wait (up to ~30 ms seen in CI)
    size = 32 * CHUNK
    # file 33 is in batch 8, sent to worker 0: after the prefetch has filled, so the loop (faster
    # than its two workers) waits for it
    paths = make_files(tmp_path / "data", 40, size, big=33)
    # each worker also reads another file in a thread of its own all along: the batch's reads are
    # its fetching thread's, the others' are counted apart
    noise = tmp_path / "noise.bin"
    noise.write_bytes(b"n" * 4096)
    args = ("--workers", "2", "--noise-thread", str(noise))
    sections, truth, _ = observe(tmp_path, *args, options=("--trace-io", "--trace-backend", "strace"))
    batches = sections["batches"]
    assert batches["joined"] == truth["steps"] == 10
    steady = batches["longest_steady_wait"]
    assert (steady["step"], steady["batch"], steady["worker"], steady["slowest_sample"]) == (8, 8, 0, 33)
    assert steady["slowest_sample_file"] == str(paths[33])
    # os.read of CHUNK bytes until it returns nothing: size / CHUNK reads with data, one empty
    assert steady["slowest_sample_reads"] == BIG * size // CHUNK + 1
    assert steady["slowest_sample_bytes"] == BIG * size
    assert str(noise) not in steady["files"] and steady["other_threads_reads"] > 0
    assert steady["reads"] == 4 * (size // CHUNK + 1) + (BIG - 1) * size // CHUNK  # its 4 files' reads, no more
    files = batches["files"]["outliers"]
    assert files[0]["path"] == str(paths[33]) and files[0]["bytes"] == BIG * size
    assert all(f["bytes"] == size for f in files[1:])  # any other file named is named for its time


@pytest.mark.timing
def test_known_fetch_collate_and_wait_shares_in_the_main_process(tmp_path):
    # 48 batches (~1.4 s): a stall of 20 ms on a loaded machine moves the wait share by ~1 point
    make_files(tmp_path / "data", 192, 4096)
    args = ("--workers", "0", "--busy-ms", "3", "--collate-ms", "3", "--step-ms", "15")
    sections, truth, _ = observe(tmp_path, *args)
    batches = sections["batches"]
    assert batches["joined"] == batches["in_steps"] == truth["steps"] == 48
    shares = batches["shares"]
    # per batch: 4 samples × 3 ms fetch + 3 ms collate, then a 15 ms step body; on a loaded
    # machine a busy-wait runs longer, so the truth is what the script timed itself
    fetch_pct = 100.0 * truth["fetch_s"] / (truth["fetch_s"] + truth["collate_s"])
    assert shares["fetch_pct_of_build"] == pytest.approx(fetch_pct, abs=3.0)
    assert shares["wait_pct"] == pytest.approx(100.0 * truth["waited_s"] / truth["loop_s"], abs=3.0)
    assert [w["worker"] for w in batches["workers"]] == [None]  # the main process built them
    # and timed each batch, never a sample one by one (3 ms each): the report says so
    assert batches["built_in_main_untimed"] == 48 and batches["samples"]["count"] == 0
    assert "slowest sample not known" in batches_report.wait_sentence(batches["longest_steady_wait"])
    cost = batches["own_cost"]  # measured as the script exited, at its loader's batch size
    assert cost["samples"] == 4 and cost["per_batch_us"] >= cost["batch_us"] >= 0 and cost["pct_of_build"] is not None


def test_iterable_dataset_batches_are_joined_to_their_forkserver_workers(tmp_path):
    make_files(tmp_path / "data", 16, 4096)
    sections, truth, _ = observe(tmp_path, "--workers", "2", "--iterable", "--start-method", "forkserver")
    batches = sections["batches"]
    assert batches["batches_taken"] == batches["joined"] == truth["steps"] == 4
    assert sorted(w["batches"] for w in batches["workers"]) == [2, 2]
    assert batches["samples"]["count"] == 16  # each worker's stream positions, 8 each


def test_pin_memory_times_the_outermost_call_of_a_batch(tmp_path):
    """pin_memory recurses through its module's own name: only the batch's outermost call is
    timed, and the time is found again by the pinned batch (what the loop then takes)."""
    recorder = batches_module.BatchRecorder(str(tmp_path))
    calls = []

    def pin(data, device=None):
        calls.append(data)
        if isinstance(data, list):
            return [wrapped(x) for x in data]
        return ("pinned", data)

    def wrapped(data, device=None):
        return recorder.pin(pin, data, device)

    batch = wrapped([1, 2, 3])
    assert batch == [("pinned", 1), ("pinned", 2), ("pinned", 3)] and len(calls) == 4
    assert list(recorder.pins) == [id(batch)] and recorder.pins[id(batch)] >= 0.0


def test_batch_records_cut_short_by_a_kill_are_left_out(tmp_path):
    recorder = batches_module.BatchRecorder(str(tmp_path))
    for idx in range(3):
        indices, ends = [idx * 2, idx * 2 + 1], [1.2 + idx, 1.5 + idx]
        built = batches_module.Built(batches_module.SAMPLE_TIMES, 1.0 + idx, 1.5 + idx, 1.6 + idx, indices, ends)
        recorder.write_built(built, 0, idx, 1.7 + idx)
    recorder.file.flush()
    path = tmp_path / f"{recorder.pid}.batches"
    path.write_bytes(path.read_bytes()[:-5])  # the last record cut short
    built, taken, samples, _ = batchflow.read_all(tmp_path)
    assert built["idx"].tolist() == [0, 1] and len(taken) == 0
    # batch 1's samples 2 and 3 took 0.2 s and 0.3 s: the second its slowest
    assert built["slowest_sample"][1] == 3 and built["slowest_end"][1] - built["slowest_begin"][1] == pytest.approx(0.3)
    assert samples.count == 4 and sorted(samples.values()) == pytest.approx([0.2, 0.2, 0.3, 0.3])


def write_batches(directory: Path, pid: int, worker_id: int, batches: list[tuple[int, list[float]]]) -> None:
    """`<pid>.batches` of a worker that built `batches` (idx, its samples' seconds), one every 10 ms
    from t=1000 s, with the real writer; sample i of batch idx is 100 * idx + i."""
    scratch = directory / f"scratch-{pid}"
    scratch.mkdir()
    recorder = batches_module.BatchRecorder(str(scratch))
    recorder.worker_id = worker_id
    for idx, seconds in batches:
        start = 1000.0 + idx * 0.01
        ends = (start + np.cumsum(seconds)).tolist()
        indices = [100 * idx + i for i in range(len(seconds))]
        built = batches_module.Built(batches_module.SAMPLE_TIMES, start, ends[-1], ends[-1] + 1e-4, indices, ends)
        recorder.write_built(built, 0, idx, built.collated)
    recorder.file.flush()
    (scratch / f"{recorder.pid}.batches").rename(directory / f"{pid}.batches")
    scratch.rmdir()


def test_synthetic_records_analysed_in_bounded_chunks(tmp_path, monkeypatch):
    # few samples kept and few CSV rows at a time: the reservoir and the chunked CSV both used
    monkeypatch.setattr(batchflow, "SAMPLES_KEPT", 64)
    monkeypatch.setattr(batchflow, "CSV_ROWS", 7)
    processes = tmp_path / "processes"
    processes.mkdir()
    seconds = {idx: [0.002] * 4 for idx in range(40)}
    seconds[13][2] = 0.2  # the slow sample: 1302, in batch 13 (worker 1)
    write_batches(processes, 501, 0, [(i, s) for i, s in seconds.items() if i % 2 == 0])
    write_batches(processes, 502, 1, [(i, s) for i, s in seconds.items() if i % 2 == 1])
    main_dir = tmp_path / "main"
    main_dir.mkdir()
    taker = batches_module.BatchRecorder(str(main_dir))
    for idx in range(41):  # batch 40 was never recorded as built (its worker was killed)
        asked = 1000.0 + idx * 0.01 + 0.009
        wait = 0.2 if idx == 13 else 0.0005
        taken = (idx % 2, 501 + idx % 2, 0, idx, asked + wait, float("nan"))
        taker.delivered(SimpleNamespace(_dlscope_taken=taken), asked, asked + wait)
    taker.file.flush()
    (main_dir / f"{taker.pid}.batches").rename(processes / "500.batches")
    steps = np.zeros(41, dtype=[("i", "<u8"), ("start", "<f8"), ("seconds", "<f4")])
    steps["i"] = np.arange(41) + 1
    steps["start"] = 1000.0 + np.arange(41) * 0.01 + 0.0085
    steps["seconds"] = 0.0099
    flow = batchflow.read_flow(processes, 500, steps, [])
    section = batchflow.section(flow, steps, tmp_path / "batches.csv", False)
    assert (section["batches_taken"], section["batches_built"], section["joined"], section["in_steps"]) == (
        41,
        40,
        40,
        41,
    )
    samples = section["samples"]
    assert samples["count"] == 160 and samples["estimated_from"] == 64
    assert samples["median_ms"] == pytest.approx(2.0) and samples["max_ms"] == pytest.approx(200.0)
    assert [(s["sample"], s["batch"], s["worker"]) for s in samples["outliers"]] == [(1302, 13, 1)]
    samples["outliers_total"] = 3  # as the reservoir could scale it: the report says it is an estimate
    said = [text for level, text in batches_report.findings(section) if level == "info" and "About" in text]
    assert said == [
        "About 3 of 160 samples (estimated from 64 drawn uniformly) took ≥ 20 ms (10× the median, "
        "1 ms at least); see the CSV."
    ]
    assert section["longest_waits"][0]["step"] == 14 and section["longest_waits"][0]["slowest_sample"] == 1302
    assert [(w["worker"], w["pid"], w["batches"]) for w in section["workers"]] == [(0, 501, 20), (1, 502, 20)]
    assert section["keeping_ahead"]["batches"] == 40
    with open(tmp_path / "batches.csv", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert [r["batch"] for r in rows] == [str(i) for i in range(41)] and [r["step"] for r in rows][:3] == [
        "1",
        "2",
        "3",
    ]
    assert rows[13]["slowest_sample"] == "1302" and rows[40]["fetch_ms"] == "" and rows[39]["samples"] == "4"


def test_repeated_and_skipped_indices_through_a_subset_are_the_ones_fetched(tmp_path):
    """A batch sampler that repeats indices and skips others, over torch's random_split (a Subset,
    whose __getitems__ maps the indices: fetched here sample by sample all the same), in a loader
    made inside a function; then a second loader whose dataset fetches batches whole with its own
    __getitems__, outside any step."""
    make_files(tmp_path / "data", 24, 4096)
    fetched = tmp_path / "fetched"
    fetched.mkdir()
    options = ("--workers", "2", "--subset", "--sampler", "repeat", "--sleep-index", "7", "--sleep-ms", "200")
    sections, truth, out = observe(tmp_path, *options, "--whole-loader", "--fetched-log", str(fetched))
    batches, subset = sections["batches"], truth["subset"]
    rows = csv_rows(out, batches)
    training = [r for r in rows if r["loader"] == "0"]
    assert batches["joined"] == batches["batches_taken"] == len(rows) == 12 and len(training) == truth["steps"] == 6
    recorded = built_indices(out / "processes")
    for r in training:  # the sampler's indices as fetched, repeats included, in its order
        assert indices_of(recorded, r) == truth["batches"][int(r["batch"])]
    for pid in {int(r["worker_pid"]) for r in training}:  # and the files each worker really read
        read = Counter(int(line) for line in (fetched / str(pid)).read_text().split())
        mine = [i for r in training if int(r["worker_pid"]) == pid for i in truth["batches"][int(r["batch"])]]
        assert read == Counter(subset[i] for i in mine)
    must = subset.index(7)  # twice in batch 2, and only there: both its samples timed one by one
    outliers = batches["samples"]["outliers"][:2]
    assert [(s["sample"], s["batch"], s["loader"]) for s in outliers] == [(must, 2, 0)] * 2
    assert all(s["ms"] >= 200 for s in outliers)
    steady = batches["longest_steady_wait"]
    assert (steady["batch"], steady["slowest_sample"], steady["loader"]) == (2, must, 0)
    loaders = batches["loaders"]
    assert [(lo["dataset"], lo["num_workers"], lo["batches_taken"], lo["in_steps"]) for lo in loaders] == [
        ("Subset", 2, 6, 6),
        ("WholeFiles", 0, 6, 0),
    ]
    assert loaders[0]["sampler"] == "RepeatSkip"
    # the batched fetch: indices recorded in order, timed whole, said so
    whole = [r for r in rows if r["loader"] == "1"]
    assert [indices_of(recorded, r) for r in whole] == [list(range(4 * b, 4 * b + 4)) for b in range(6)]
    assert batches["fetched_whole"] == 6
    assert all(r["fetch_ms"] and not r["slowest_sample"] and not r["step"] for r in whole)


def test_the_labs_own_loader_a_new_dataloader_every_epoch(tmp_path):
    """dlscope's own DataLoader path (`dlscope train --loader torch`), run as a library from a
    script: each epoch's batches hold the epoch's order as the lab computes it."""
    make_files(tmp_path / "data", 1, 16)
    sections, truth, out = observe(tmp_path, "--lab-loader", "--workers", "2", "--epochs", "2", "--batch-size", "8")
    batches = sections["batches"]
    assert batches["joined"] == batches["in_steps"] == truth["steps"] == 12
    # a new loader each epoch, alike: one row of the loaders table whatever the epochs
    assert [
        (lo["loader"], lo["last_loader"], lo["loaders"], lo["dataset"], lo["passes"], lo["batches_taken"])
        for lo in batches["loaders"]
    ] == [(0, 1, 2, "dlscope.data.loaders.MnistSamples", 2, 12)]
    recorded = built_indices(out / "processes")
    for r in csv_rows(out, batches):
        b, order = int(r["batch"]), truth["orders"][int(r["loader"])]
        assert indices_of(recorded, r) == order[8 * b : 8 * b + 8]


def test_a_batch_has_its_threads_system_calls_or_its_process_when_the_trace_has_no_thread_ids():
    built = np.zeros(1, dtype=batchflow.BUILT_ROW)
    built["pid"], built["tid"], built["start"], built["collated"], built["slowest_at"] = 7, 8, 10.0, 11.0, -1

    def read(tid: int | None, path: str, n: int) -> dict:
        event = {"ts": 10.5, "pid": 7, "call": "read", "kind": "read", "path": path, "bytes": n, "dur": 1e-4}
        return event if tid is None else {**event, "tid": tid}

    # the building thread read a.bin; another thread of the worker read b.bin and a pipe meanwhile
    io = batchflow.attach_io(built, [read(8, "/a.bin", 10), read(9, "/b.bin", 20), read(9, "pipe:[1]", 4)], float)[0]
    assert (io["reads"], io["bytes_read"], [f["path"] for f in io["files"]]) == (1, 10, ["/a.bin"])
    assert io["others"] == {"reads": 1, "bytes_read": 20} and io["per_thread"]
    row: dict = {}
    batchflow._io_cells(row, io)
    assert (row["other_threads_reads"], row["other_threads_bytes"]) == (1, 20) and "io_of_process" not in row
    io = batchflow.attach_io(built, [read(None, "/a.bin", 10), read(None, "/b.bin", 20)], float)[0]
    assert (io["reads"], io["bytes_read"], io["per_thread"]) == (2, 30, False)
    batchflow._io_cells(row, io)
    assert row["io_of_process"] and "no thread ids" in batches_report.wait_sentence(
        {"step": 0, "batch": 0, "worker": 0, "waited_ms": 1, "fetch_ms": 1, "collate_ms": 0, "queued_ms": 0, **row}
    )


def test_a_worker_times_samples_one_by_one_where_slow_enough_else_one_batch_in_sample_every(tmp_path):
    """A worker's rule, driven by the recorder's threshold (not by the machine's speed): under it a
    batch is timed whole, and its samples one batch in SAMPLE_EVERY; over it, every batch's. Each
    batch is written as the worker puts it on its data queue."""
    recorder = batches_module.BatchRecorder(str(tmp_path))
    recorder.worker_id, recorder.time_samples = 0, True  # as worker_loop sets them
    fetch = recorder.map_fetcher(lambda fetcher, index: None)
    fetcher = SimpleNamespace(dataset=list(range(100)), auto_collation=True, collate_fn=list, drop_last=False)
    queue = batches_module.data_queue(SimpleNamespace(put=lambda item: None), recorder)
    every = batches_module.SAMPLE_EVERY
    idx = 0
    for threshold, count in ((3600.0, every + 1), (0.0, 3)):  # samples never an hour; always ≥ 0 s
        recorder.sample_min_s = threshold
        for b in range(count):
            queue.put((idx, fetch(fetcher, [b, b + 1, b + 1])))
            idx += 1
    recorder.file.flush()
    built, _, samples, _ = batchflow.read_all(tmp_path)
    timed = (built["flags"] & batches_module.SAMPLE_TIMES != 0).tolist()
    # the first batch, then one in SAMPLE_EVERY; then over the threshold all, from the batch after
    # the first one fetched over it
    assert timed == [True] + [False] * (every - 1) + [True] + [False, True, True]
    assert built["idx"].tolist() == list(range(every + 4)) and (built["worker_id"] == 0).all()
    assert samples.count == 3 * 4 and built["slowest_sample"][0] in (0, 1)


def test_the_training_process_times_batches_never_samples_one_by_one(tmp_path, monkeypatch):
    """num_workers=0: the fetchers read the clock three times a batch (its start, the collate's
    start and end) whatever its size, map-style or iterable, slow samples or not; the loader
    hook's `delivered` writes each batch built and taken at once, with the pin time of the batch
    pinned in that thread."""
    reads = []
    monkeypatch.setattr(batches_module.time, "time", lambda: reads.append(1) or 10.0 + len(reads))
    recorder = batches_module.BatchRecorder(str(tmp_path))
    recorder.sample_min_s = 0.0  # a worker would time every sample
    fetch = recorder.map_fetcher(lambda fetcher, index: None)
    fetcher = SimpleNamespace(dataset=list(range(100)), auto_collation=True, collate_fn=list, drop_last=False)
    iterator = SimpleNamespace(_dlscope_pass=(0, 0))
    every = batches_module.SAMPLE_EVERY
    for b in range(every + 2):
        reads.clear()
        assert fetch(fetcher, list(range(b, 2 * b + 1))) == list(range(b, 2 * b + 1))
        assert len(reads) == 3  # for 1 to every + 2 samples
        if b == 1:
            recorder.pin(lambda data: data, [b])  # pinned by the single-process path, in this thread
        recorder.delivered(iterator, 10.0 + b, 10.5 + b)
    iterable = recorder.iterable_fetcher(lambda fetcher, index: None)
    fetcher = SimpleNamespace(dataset_iter=iter("abcdefghij"), ended=False, auto_collation=True, drop_last=False)
    fetcher.collate_fn = "".join
    drawn = []
    with pytest.raises(StopIteration):
        while True:
            reads.clear()
            drawn.append(iterable(fetcher, range(4)))
            assert len(reads) == 3
            recorder.delivered(iterator, 1.0, 2.0)
    recorder.file.flush()
    built, taken, samples, _ = batchflow.read_all(tmp_path)
    assert drawn == ["abcd", "efgh", "ij"] and len(built) == len(taken) == every + 5
    assert (built["flags"] & batches_module.SAMPLE_TIMES == 0).all() and samples.count == 0
    assert built["idx"].tolist() == taken["idx"].tolist() == list(range(every + 5))
    assert (taken["worker_id"] == -1).all() and (taken["loader"] == 0).all()
    assert taken["next_start"][3] == 13.0 and taken["next_end"][3] == built["ready"][3] == 13.5
    pinned = ~np.isnan(taken["pin"])
    assert pinned.tolist() == [False, True] + [False] * (every + 3)
    indices = [i.tolist() for _, _, i in batchflow.sample_indices(tmp_path / f"{recorder.pid}.batches")]
    assert indices[-3:] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]  # the iterable's stream positions


def test_a_workers_iterable_batch_timed_whole_keeps_its_stream_positions(tmp_path):
    recorder = batches_module.BatchRecorder(str(tmp_path))
    recorder.worker_id, recorder.time_samples = 0, True  # as worker_loop sets them
    recorder.sample_min_s = 3600.0  # after the first batch, none of its samples timed one by one
    fetch = recorder.iterable_fetcher(lambda fetcher, index: None)
    fetcher = SimpleNamespace(dataset_iter=iter("abcdefghij"), ended=False, auto_collation=True, drop_last=False)
    fetcher.collate_fn = "".join
    queue = batches_module.data_queue(SimpleNamespace(put=lambda item: None), recorder)
    drawn = []
    with pytest.raises(StopIteration):
        while True:
            drawn.append(fetch(fetcher, range(4)))
            queue.put((len(drawn) - 1, drawn[-1]))
    recorder.file.flush()
    built, _, samples, _ = batchflow.read_all(tmp_path)
    assert drawn == ["abcd", "efgh", "ij"] and len(built) == 3
    assert (built["flags"] & batches_module.ITERABLE != 0).all() and samples.count == 4
    assert (built["flags"] & batches_module.SAMPLE_TIMES != 0).tolist() == [True, False, False]
    indices = [i.tolist() for _, _, i in batchflow.sample_indices(tmp_path / f"{recorder.pid}.batches")]
    assert indices == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


def test_workers_terminated_at_exit_leave_their_batches_recorded(tmp_path):
    # the loop stops with its iterator alive (an endless loader's loop does): torch leaves the
    # workers running at exit and multiprocessing terminates them (SIGTERM); each still writes
    # the batches it built, so every batch taken is joined to its worker
    make_files(tmp_path / "data", 32, 4096)
    options = ("--workers", "2", "--batch-size", "1", "--stop-after", "20", "--step-ms", "30")
    sections, truth, out = observe(tmp_path, *options)
    batches = sections["batches"]
    assert truth["steps"] == batches["batches_taken"] == batches["joined"] == 20
    assert all(row["fetch_ms"] for row in csv_rows(out, batches))
    # the workers keep ahead of 30 ms steps: a wait for a batch already built is not its building
    steady = batches["longest_steady_wait"]
    assert steady["ready_before_asked"] and "not its building" in batches_report.wait_sentence(steady)
    assert sections["anatomy"]["verdict"]["batches_ready_pct"] == batches["keeping_ahead"]["ready_pct"] >= 90


@pytest.mark.parametrize("ready_pct", [99.7, 40.0, None])
def test_an_input_bound_verdict_says_when_the_workers_had_the_batches_built(ready_pct):
    verdict = {
        "key": "input_bound",
        "level": "moderately",
        "data_pct": 9.2,
        "data_ms": 5.2,
        "step_ms": 56.7,
        "steps": 292,
        "thresholds_pct": {"highly": 20.0, "moderately": 5.0},
        "batches_ready_pct": ready_pct,
    }
    _, text = anatomy_report.verdict(verdict)
    assert text.startswith("Your program is MODERATELY input-bound")
    # built before asked, the wait is the hand-over or a busy core: more workers would not help
    assert ("more workers would not shorten it" in text) == (ready_pct == 99.7)


def test_a_hiccup_beside_a_slow_fetch_does_not_make_the_sample_slow():
    """A sample fetched three times: 200 ms once, and 1.5 ms once on a busy core (past the 1 ms
    bar): that fetch was slow, not the sample; fetched at 150 ms again, the sample is slow."""
    once = batchflow._other_fetches(np.array([0.2, 0.0015, 0.00002]), 0.2, 0.001)
    assert (once["other_fetches"], once["other_slow"]) == (2, 0)
    again = batchflow._other_fetches(np.array([0.2, 0.15, 0.00002]), 0.2, 0.001)
    assert again["other_slow"] == 1


def test_many_outliers_are_one_finding_each_kind_and_a_row_each_in_their_tables():
    """Nine samples slow at one fetch only and two slow every time, three slow files: the report
    warns of each slow sample, says the slow-once ones in one finding naming the first three, the
    files in one, and lists them all in two tables."""
    slow_once = [
        {"sample": 100 + k, "ms": 30.0 - k, "times_median": 100.0, "batch": k, "pass": 0, "loader": 0, "worker": 0,
         "file": f"/d/{100 + k}.npy", "other_fetches": 2, "other_slow": 0, "other_median_ms": 0.3}
        for k in range(9)
    ]  # fmt: skip
    again = {"other_slow": 2, "other_median_ms": 38.0}
    slow = [{**slow_once[0], **again, "sample": 7 + k, "ms": 40.0 + k} for k in range(2)]
    files = [{"path": f"/d/{k}.npy", "reads": 9, "bytes": 19968, "ms": 9.0 - k, "batches": 3} for k in range(3)]
    section = {
        "batches_taken": 40, "batches_built": 40, "joined": 40, "in_steps": 40, "file": "batches.csv",
        "longest_steady_wait": None, "first_batches": {"count": 0}, "shares": {}, "keeping_ahead": None,
        "samples": {"outliers": slow + slow_once, "median_ms": 0.3},
        "files": {"outliers": files, "median_bytes": 19968, "median_ms": 0.04},
        "longest_waits": [], "slowest_batches": [], "workers": [], "loaders": [],
    }  # fmt: skip
    said = batches_report.findings(section)
    assert sum("the sample itself is slow" in text for _, text in said) == 2
    [once] = [text for _, text in said if "slow at one fetch only" in text]
    assert once.startswith("9 samples") and "sample 100," in once and "sample 102," in once
    assert "sample 103," not in once and once.endswith("and 6 more in the table below.")
    [named] = [text for level, text in said if level == "warn" and "files far past" in text]
    assert named.startswith("3 files") and all(f"/d/{k}.npy" in named for k in range(3))
    tables = {b.caption.split(" (")[0]: b for b in batches_report.render(section) if isinstance(b, Table)}
    assert [row[0] for row in tables["Samples far past the median"].rows] == [7, 8, *range(100, 109)]
    assert len(tables["Files far past the median"].rows) == 3


def test_each_record_file_of_a_run_is_decoded_once(tmp_path, monkeypatch):
    """After the job, every record file is decoded once and handed to every analyser: each
    process's JSON records and step rows, the --trace-io events (the timeline and the batch x-ray
    both read them), the batch records — these once more only where a sample is named far past the
    median (its every fetch, read back in a second pass rather than every sample's kept)."""
    from dlscope.analysis import observed, stepfile, steptable

    decoded: Counter[Path] = Counter()

    def count(module: object, name: str, path_of) -> None:
        original = getattr(module, name)

        def counted(*args, **kwargs):
            decoded[Path(path_of(*args)).resolve()] += 1
            return original(*args, **kwargs)

        monkeypatch.setattr(module, name, counted)

    count(stepfile, "_lines", lambda path: path)
    count(steptable, "open_stream", lambda steps: steps.path)
    count(batchflow, "_records", lambda path: path)
    count(observed, "read_events", lambda path: path)
    make_files(tmp_path / "data", 24, 4096)
    out, truth = tmp_path / "run", tmp_path / "truth.json"
    argv = [sys.executable, str(SCRIPT), str(truth), str(tmp_path / "data"), "--workers", "2"]
    options = ["--trace-io", "--trace-backend", "strace", "--profile-steps", "2"]
    assert main(["run", "--out", str(out), *options, "--", *argv]) == 0
    sections = load_results(out)["sections"]
    assert sections["batches"]["joined"] == json.loads(truth.read_text())["steps"]
    assert sections["top10"]["windows"]  # the profiler's trace was read into the timeline too
    processes = [p.resolve() for p in (out / "processes").iterdir() if p.stat().st_size]
    records = [p for p in processes if p.suffix in (".jsonl", ".steps")]
    records.append((out / sections["iotrace"]["exports"]["events"]).resolve())
    assert {p.suffix for p in records} == {".jsonl", ".steps"}
    assert {path: decoded[path] for path in records} == dict.fromkeys(records, 1)
    refetched = 1 if sections["batches"]["samples"].get("outliers") else 0
    batch_files = [p for p in processes if p.suffix == ".batches"]
    assert len(batch_files) == 3  # the training process's and its two workers'
    assert {path: decoded[path] for path in batch_files} == dict.fromkeys(batch_files, 1 + refetched)


def paths_in(value: Any) -> list[str]:
    """Every absolute path among a section's strings, however deep."""
    if isinstance(value, dict):
        return [p for v in value.values() for p in paths_in(v)]
    if isinstance(value, list):
        return [p for v in value for p in paths_in(v)]
    return [value] if isinstance(value, str) and value.startswith("/") else []


@pytest.mark.skipif(strace.available() is not None, reason="strace not installed (scripts/install-tracers)")
def test_dlscopes_own_files_are_never_a_batchs_or_a_samples_file(tmp_path):
    """Samples seeded with torch.manual_seed (which formats the stack: a stat() of each frame's
    file, dlscope's wrappers included) read no file: no file of dlscope's is named anywhere in the
    batch x-ray (before, its hooks.py was the slowest sample's file), the slow sample reads no file,
    and the syscall tables file dlscope's modules as its own code, not as the job's modules."""
    out, truth_path = tmp_path / "run", tmp_path / "truth.json"
    script = Path(__file__).parent / "scripts" / "seeded_samples.py"
    options = ["--trace-io", "--trace-backend", "strace", *NO_PROFILE]
    assert main(["run", "--out", str(out), *options, "--", sys.executable, str(script), str(truth_path)]) == 0
    sections, truth = load_results(out)["sections"], json.loads(truth_path.read_text())
    batches = sections["batches"]
    assert batches["joined"] == truth["steps"] == 6
    named = paths_in(batches)
    assert named and not [p for p in named if is_dlscope_code(p)]  # the paths torch's stack walk stat()ed: named
    slow = [r for r in batches["slowest_batches"] if r.get("slowest_sample") == truth["slow_sample"]]
    assert slow and all(r.get("slowest_sample_file") is None for r in slow)  # it read no file
    assert all(r.get("top_file") is None or r["top_file_reads"] for r in batches["slowest_batches"])
    with open(out / sections["iotrace"]["exports"]["files_csv"], newline="") as f:
        ours = {row["category"] for row in csv.DictReader(f) if is_dlscope_code(row["path"])}
    listed = {f["category"] for f in sections["iotrace"]["files"] if is_dlscope_code(f["path"])}
    assert ours == {"dlscope code"} and listed <= ours
