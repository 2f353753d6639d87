"""Input pipelines: TFRecord framing and its errors, read-call arithmetic (checked against the
kernel), exactly-once delivery across workers × shuffle × batch, reproducible shuffling, cold
runs that really are cold, and the `dlscope pipeline` commands end to end."""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from dlscope.cli import main
from dlscope.errors import ConfigError, DatasetError
from dlscope.experiments.pipeline import (
    Manifest,
    PipelineDataset,
    ReaderConfig,
    SimulatedCompute,
    TFRecordError,
    TrainingCompute,
    frame,
    iterate_batches,
    masked_crc,
    measure_epoch,
    prepare_dataset,
    read_records,
    shuffle,
    synthetic_samples,
)
from dlscope.experiments.pipeline.example import parse_example
from dlscope.experiments.pipeline.prepare import data_files, sample_file
from dlscope.experiments.pipeline.readers import prefetch_thread
from dlscope.experiments.pipeline.tfrecord import IOCounters
from dlscope.report.sections.pipeline import WORDS, findings
from dlscope.report.wording import worded

N = 203  # not a multiple of any batch size or shard count used here


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory) -> tuple[Path, Manifest, np.ndarray]:
    labels, samples = synthetic_samples(N, 472, seed=3)  # 550-byte record files
    root = tmp_path_factory.mktemp("pipeline") / "synthetic"
    return root, prepare_dataset(root, labels, samples, "synthetic", shards=3), samples


def indices_of(root: Path, manifest: Manifest, config: ReaderConfig, epoch: int = 0) -> list[int]:
    batches = iterate_batches(PipelineDataset(root, manifest, config, epoch))
    return [i for batch in batches for i in batch.index.tolist()]


# --- TFRecord framing -------------------------------------------------------------------------


def test_crc32c_and_tensorflow_mask():
    from crc32c import crc32c

    assert crc32c(b"123456789") == 0xE3069283  # the CRC-32C check value (RFC 3720)
    crc = crc32c(b"dlscope")
    assert masked_crc(b"dlscope") == ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def test_frame_layout_and_round_trip(tmp_path):
    payloads = [b"", b"x", os.urandom(1000)]
    path = tmp_path / "r.tfrecord"
    path.write_bytes(b"".join(frame(p) for p in payloads))
    record = frame(b"abc")
    assert len(record) == 8 + 4 + 3 + 4
    assert record[:8] == (3).to_bytes(8, "little")
    assert record[8:12] == masked_crc(record[:8]).to_bytes(4, "little")
    assert record[15:] == masked_crc(b"abc").to_bytes(4, "little")
    for read_buffer in (1, 7, 1 << 18):
        assert list(read_records(path, read_buffer, IOCounters())) == payloads


def shard_with_three_records(tmp_path) -> tuple[Path, list[int]]:
    payloads = [bytes([i]) * 100 for i in range(3)]
    path = tmp_path / "shard.tfrecord"
    path.write_bytes(b"".join(frame(p) for p in payloads))
    return path, [0, 116, 232]  # record offsets: 16 bytes of framing + 100 of data each


def test_data_crc_mismatch_names_file_and_offset(tmp_path):
    path, offsets = shard_with_three_records(tmp_path)
    data = bytearray(path.read_bytes())
    data[offsets[1] + 12 + 50] ^= 0x01  # one bit in the second record's data
    path.write_bytes(data)
    with pytest.raises(TFRecordError, match=rf"^{re.escape(str(path))}: data CRC32C mismatch .* offset 116$"):
        list(read_records(path, 4096, IOCounters()))


def test_length_crc_mismatch_names_offset(tmp_path):
    path, offsets = shard_with_three_records(tmp_path)
    data = bytearray(path.read_bytes())
    data[offsets[2]] ^= 0x80
    path.write_bytes(data)
    with pytest.raises(TFRecordError, match="length CRC32C mismatch in the record header at offset 232"):
        list(read_records(path, 4096, IOCounters()))


@pytest.mark.parametrize(("cut", "what"), [(232 + 5, "5 of the 12 header bytes"), (232 + 60, "56 bytes short")])
def test_truncated_record_names_offset(tmp_path, cut, what):
    path, _ = shard_with_three_records(tmp_path)
    path.write_bytes(path.read_bytes()[:cut])
    records = read_records(path, 64, IOCounters())
    assert next(records) == bytes([0]) * 100  # the intact records still come out first
    with pytest.raises(TFRecordError, match=rf"truncated record at offset 232: .*{what}"):
        list(records)


@pytest.mark.slow
def test_corrupt_shard_through_cli_is_one_line_naming_file_and_offset(tmp_path, capfd):
    labels, samples = synthetic_samples(40, 64, seed=0)
    root = tmp_path / "d"
    prepare_dataset(root, labels, samples, "synthetic", shards=2, formats=("tfrecord",))
    manifest = Manifest(40, 64, "synthetic", ("tfrecord",), 2)
    shard, record = data_files(root, manifest, "tfrecord")[1], manifest.record_file_bytes
    data = bytearray(shard.read_bytes())
    data[3 * record + 30] ^= 0xFF  # inside the fourth record's payload
    shard.write_bytes(data)
    for workers in ("0", "2"):
        result = run_cli(capfd, "pipeline", "run", str(root), "--workers", workers, "--warm")
        assert result.returncode == 2, result.stderr
        assert result.stderr.count("\n") == 1 and result.stderr.startswith(f"dlscope: error: {shard}: ")
        assert "CRC32C mismatch" in result.stderr and f"offset {3 * record}\n" in result.stderr  # the bad record's


def test_missing_files_and_a_damaged_array_are_named(tmp_path):
    labels, samples = synthetic_samples(30, 16, seed=0)
    root = tmp_path / "d"
    manifest = prepare_dataset(root, labels, samples, "synthetic", shards=2)
    sample_file(root, 7).unlink()
    with pytest.raises(DatasetError, match=r"000007\.rec: missing, and 0 more of the 30 'files' data files$"):
        measure_epoch(root, manifest, ReaderConfig("files"), SimulatedCompute(0), cold=False)
    (root / "array.npy").write_bytes((root / "array.npy").read_bytes()[:100])
    with pytest.raises(DatasetError, match=r"array\.npy: not a readable \.npy array"):
        measure_epoch(root, manifest, ReaderConfig("array"), SimulatedCompute(0), cold=False)


# --- read-call arithmetic ---------------------------------------------------------------------


@pytest.mark.parametrize("read_buffer", [1, 264, 549, 550, 551, 4096, 262_144])
def test_read_calls_follow_the_read_buffer_arithmetic(synthetic, read_buffer):
    root, manifest, _ = synthetic
    assert manifest.record_file_bytes == 550  # seed 003's file size
    per_file = -(-550 // read_buffer) + 1  # reads that return data, then the one that finds the end
    files = measure_epoch(root, manifest, ReaderConfig("files", read_buffer), SimulatedCompute(0), cold=False)
    assert (files.reads, files.opens, files.bytes_read) == (N * per_file, N, N * 550)
    shard_sizes = [p.stat().st_size for p in data_files(root, manifest, "tfrecord")]
    shards = measure_epoch(root, manifest, ReaderConfig("tfrecord", read_buffer), SimulatedCompute(0), cold=False)
    assert shards.reads == sum(-(-size // read_buffer) + 1 for size in shard_sizes)
    assert shards.bytes_read == sum(shard_sizes)


def test_seed_read_buffers_on_550_byte_files(synthetic):
    """Seed 003: 275 B → 3 reads per file (150:1 at batch 500 with 10 records a file), 550 B → 2."""
    root, manifest, _ = synthetic
    reads = {
        b: measure_epoch(root, manifest, ReaderConfig("files", b), SimulatedCompute(0), cold=False).reads // N
        for b in (275, 550, 262_144)
    }
    assert reads == {275: 3, 550: 2, 262_144: 2}


def count_traced_reads(trace: str, root: Path) -> int:
    """read/pread64 lines of `strace -y` whose descriptor is a data file under root (not the manifest)."""
    pattern = re.compile(rf"\b(read|pread64)\(\d+<{re.escape(str(root))}/(files|shards)/")
    return sum(1 for line in trace.splitlines() if pattern.search(line))


@pytest.mark.skipif(shutil.which("strace") is None, reason="strace is not installed (apt-get install strace)")
@pytest.mark.slow
@pytest.mark.parametrize(("fmt", "workers"), [("tfrecord", 0), ("files", 2)])
def test_read_counts_match_the_kernel_strace(synthetic, tmp_path, fmt, workers):
    root, _, _ = synthetic
    log = tmp_path / "strace.log"
    script = (
        "import json, sys\n"
        "from dlscope.experiments.pipeline import ReaderConfig, SimulatedCompute, load_manifest, measure_epoch\n"
        f"m = measure_epoch({str(root)!r}, load_manifest({str(root)!r}), "
        f"ReaderConfig({fmt!r}, read_buffer=264, workers={workers}), SimulatedCompute(0), cold=False)\n"
        "print(json.dumps({'reads': m.reads}))\n"
    )
    result = subprocess.run(
        [
            "strace",
            "-f",
            "--seccomp-bpf",
            "-y",
            "-e",
            "trace=read,pread64",
            "-o",
            str(log),
            sys.executable,
            "-c",
            script,
        ],
        capture_output=True,
        text=True,
    )
    if result.returncode != 0 and "ptrace" in result.stderr:
        pytest.skip(f"strace cannot trace here: {result.stderr.strip()}")
    assert result.returncode == 0, result.stderr
    counted = json.loads(result.stdout.strip().splitlines()[-1])["reads"]
    assert counted == count_traced_reads(log.read_text(), root.resolve()) > 0


def test_proc_io_syscr_covers_the_counted_reads(synthetic):
    root, manifest, _ = synthetic
    io = Path("/proc/self/io")
    if not io.exists():
        pytest.skip("no /proc/self/io")

    def syscr() -> int:
        return int(next(line for line in io.read_text().splitlines() if line.startswith("syscr")).split()[1])

    before = syscr()
    m = measure_epoch(root, manifest, ReaderConfig("files", 100), SimulatedCompute(0), cold=False)
    # the kernel counts every read of this process; ours are the data reads among them
    assert m.reads == N * 7 <= syscr() - before < m.reads + 200  # 550-byte files, 100-byte reads


# --- delivery: exactly once, reproducible order ------------------------------------------------


@pytest.mark.parametrize("fmt", ["files", "tfrecord", "array"])
@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("shuffle_buffer", [0, 7, 1000])
@pytest.mark.parametrize("batch_size", [1, 16, 500])
def test_every_sample_exactly_once(synthetic, fmt, workers, shuffle_buffer, batch_size):
    root, manifest, _ = synthetic
    config = ReaderConfig(fmt, 4096, shuffle_buffer, batch_size, workers, prefetch=2, seed=5)
    m = measure_epoch(root, manifest, config, SimulatedCompute(0), cold=False)
    assert m.exactly_once, (m.missing, m.duplicated)
    assert m.samples == N
    assert m.steps >= -(-N // batch_size)


@pytest.mark.parametrize("fmt", ["files", "tfrecord", "array"])
def test_batches_carry_the_samples_that_were_written(synthetic, fmt):
    root, manifest, samples = synthetic
    for batch in iterate_batches(PipelineDataset(root, manifest, ReaderConfig(fmt, shuffle_buffer=50, batch_size=32))):
        assert batch.x.dtype == torch.uint8 and batch.x.is_contiguous()
        assert np.array_equal(batch.x.numpy(), samples[batch.index.numpy()])


def test_shuffle_is_seeded_and_reproducible(synthetic):
    root, manifest, _ = synthetic
    config = ReaderConfig("files", shuffle_buffer=64, batch_size=10, seed=11)
    first = indices_of(root, manifest, config, epoch=0)
    assert first == indices_of(root, manifest, config, epoch=0)
    assert first != indices_of(root, manifest, config, epoch=1)
    assert first != indices_of(root, manifest, ReaderConfig("files", shuffle_buffer=64, batch_size=10, seed=12))
    assert sorted(first) == list(range(N))
    assert indices_of(root, manifest, ReaderConfig("tfrecord", shuffle_buffer=0)) == list(range(N))
    with_workers = ReaderConfig("files", shuffle_buffer=64, batch_size=10, workers=2, seed=11)
    assert indices_of(root, manifest, with_workers) == indices_of(root, manifest, with_workers)


def test_shuffle_buffer_has_tf_data_semantics():
    records = list(range(1000))
    out = list(shuffle(iter(records), 10, random.Random(0)))
    assert sorted(out) == records
    assert out != records
    # a record can only leave the buffer after it entered it: output p holds one of the first p + 10 inputs
    assert all(value < p + 10 for p, value in enumerate(out))
    assert list(shuffle(iter(records), 1, random.Random(0))) == records
    full = list(shuffle(iter(records), 1000, random.Random(0)))
    assert sorted(full) == records and max(full[:10]) > 100  # a full buffer draws from everywhere
    firsts = [next(shuffle(iter(range(20)), 20, random.Random(seed))) for seed in range(2000)]
    assert min(np.bincount(firsts, minlength=20)) > 50  # uniform draw: each ~100 times


def test_prefetch_thread_stops_early_and_passes_errors_on():
    def numbers():
        yield from range(1000)

    stream = prefetch_thread(numbers(), depth=2)
    assert next(stream) == 0
    stream.close()  # the producer must not hang on a full queue

    def failing():
        yield 1
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        list(prefetch_thread(failing(), depth=2))


def test_bad_configurations_are_refused(synthetic):
    with pytest.raises(ConfigError, match="prefetch"):
        ReaderConfig("files", workers=2, prefetch=0)
    with pytest.raises(ConfigError, match="format"):
        ReaderConfig("parquet")
    with pytest.raises(ConfigError, match="28×28"):
        TrainingCompute("mlp", "cpu", sample_bytes=472)


# --- cache state, consumers -------------------------------------------------------------------


def filesystem_type(path: Path) -> str:
    best = ("", "")
    for line in Path("/proc/mounts").read_text().splitlines():
        mount, fstype = line.split()[1:3]
        if str(path.resolve()).startswith(mount) and len(mount) > len(best[0]):
            best = (mount, fstype)
    return best[1]


def test_cold_runs_are_cold_and_warm_runs_warm(synthetic):
    root, manifest, _ = synthetic
    if not Path("/proc/self/io").exists():
        pytest.skip("no /proc/self/io to check the page cache by")
    if filesystem_type(root) in ("tmpfs", "ramfs"):
        pytest.skip("files in memory: there is no page cache to evict")
    config = ReaderConfig("tfrecord")
    cold = measure_epoch(root, manifest, config, SimulatedCompute(0), cold=True)
    warm = measure_epoch(root, manifest, config, SimulatedCompute(0), cold=False)
    assert (cold.cache, warm.cache) == ("cold", "warm")
    assert cold.cold_verified is True
    assert cold.disk_bytes >= manifest.data_bytes("tfrecord")
    assert warm.disk_bytes == 0 and warm.cold_verified is None


def test_training_consumer_learns_from_the_pipeline(mnist, tmp_path):
    n = 1000
    root = tmp_path / "mnist"
    labels = mnist.train_labels[:n].numpy().astype(np.uint8)
    manifest = prepare_dataset(root, labels, mnist.train_images[:n].reshape(n, -1).numpy(), "mnist", shards=2)
    consumer = TrainingCompute("mlp", "cpu", manifest.sample_bytes, seed=0, threads=1)
    before = [p.detach().clone() for p in consumer.model.parameters()]
    m = measure_epoch(root, manifest, ReaderConfig("tfrecord", shuffle_buffer=200, batch_size=100), consumer, False)
    assert m.exactly_once and m.steps == 10
    assert 0 < m.compute_s <= m.wall_s and 0 <= m.wait_s <= m.wall_s
    assert all(not torch.equal(a, b) for a, b in zip(before, consumer.model.parameters(), strict=True))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_training_consumer_on_cuda_with_pinned_batches(mnist, tmp_path):
    n = 500
    root = tmp_path / "mnist"
    labels = mnist.train_labels[:n].numpy().astype(np.uint8)
    manifest = prepare_dataset(root, labels, mnist.train_images[:n].reshape(n, -1).numpy(), "mnist", shards=2)
    consumer = TrainingCompute("cnn", "cuda", manifest.sample_bytes)
    assert consumer.pin_memory
    m = measure_epoch(root, manifest, ReaderConfig("tfrecord", workers=2, batch_size=100), consumer, False)
    assert m.exactly_once and m.compute_s > 0


def test_simulated_compute_sets_accelerator_utilisation(synthetic):
    root, manifest, _ = synthetic
    m = measure_epoch(root, manifest, ReaderConfig("tfrecord", batch_size=50), SimulatedCompute(0.05), cold=False)
    assert m.steps == 5
    assert m.compute_s == pytest.approx(0.25, abs=0.05)
    assert m.au == pytest.approx(m.compute_s / m.wall_s)
    assert m.to_dict()["verdict"] in ("compute-bound", "balanced")


# --- prepare and the commands -----------------------------------------------------------------


def test_prepare_refuses_an_existing_directory_and_leaves_nothing_half_written(tmp_path):
    labels, samples = synthetic_samples(10, 8, seed=0)
    prepare_dataset(tmp_path / "d", labels, samples, "synthetic", shards=2)
    with pytest.raises(ConfigError, match="already exists"):
        prepare_dataset(tmp_path / "d", labels, samples, "synthetic")
    with pytest.raises(ConfigError, match="shards"):
        prepare_dataset(tmp_path / "e", labels, samples, "synthetic", shards=11)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"]
    record = read_records(sample_file(tmp_path / "d", 9), 4096, IOCounters())
    assert parse_example(next(record)) == (9, labels[9], samples[9].tobytes())


def run_cli(capfd: pytest.CaptureFixture, *args: str) -> subprocess.CompletedProcess:
    """The CLI in this process (no interpreter and torch start-up per command); what it wrote, at the
    file-descriptor level (its DataLoader workers' too)."""
    capfd.readouterr()
    code = main(list(args))
    out, err = capfd.readouterr()
    return subprocess.CompletedProcess(["dlscope", *args], code, out, err)


@pytest.mark.slow
def test_prepare_and_run_commands(tmp_path, capfd):
    data = tmp_path / "d"
    result = run_cli(capfd, "pipeline", "prepare", "--out", str(data), "--samples", "300", "--shards", "4")
    assert result.returncode == 0, result.stderr
    assert "300 samples of 784 B" in result.stdout
    result = run_cli(
        capfd, "pipeline", "run", str(data), "--format", "files", "--read-buffer", "402", "--compute-ms", "0"
    )
    assert result.returncode == 0, result.stderr
    assert re.search(r"read calls\s+1,200\b", result.stdout)  # 805-byte files: 4 reads each
    assert re.search(r"exactly once\s+yes", result.stdout)
    missing = run_cli(capfd, "pipeline", "run", str(tmp_path / "nothing"))
    assert missing.returncode == 2 and "no manifest.json" in missing.stderr


@pytest.mark.slow
def test_sweep_command_writes_tables_verdicts_and_report(tmp_path, capfd):
    out = tmp_path / "run"
    result = run_cli(
        capfd,
        "pipeline",
        "sweep",
        "--samples",
        "600",
        "--small-files",
        "1500",
        "--repeats",
        "1",
        "--out",
        str(out),
        "--no-progress",
    )
    assert result.returncode == 0, result.stderr
    section = json.loads((out / "results.json").read_text())["sections"]["pipeline"]
    assert [t["key"] for t in section["tables"]] == ["batch", "shuffle", "read_buffer", "layout", "workers"]
    assert section["exactly_once"]
    found = {f.key: f for f in findings(section)}  # worded into the report below
    assert {"pipeline.batch", "pipeline.shuffle", "pipeline.read_buffer", "pipeline.files_vs_shards"} <= set(found)
    assert found["pipeline.exactly_once"].values["deliveries"] == sum(
        r["samples"] for t in section["tables"] for r in t["rows"]
    )
    read_buffer = {r["read_buffer"]: r for r in section["tables"][2]["rows"]}
    assert {b: r["reads"] // r["opens"] for b, r in read_buffer.items()} == {275: 3, 550: 2, 262_144: 2}
    for row in (r for t in section["tables"] for r in t["rows"]):
        assert row["verdict"] in ("input-bound", "balanced", "compute-bound")
        assert 0 < row["au"] <= 1
    kept = section["data_kept"]["small"]  # the prepared data stays for `dlscope pipeline run`
    rerun = run_cli(capfd, "pipeline", "run", kept, "--format", "files", "--read-buffer", "275", "--compute-ms", "0")
    assert re.search(r"read calls\s+4,500\b", rerun.stdout), rerun.stdout + rerun.stderr
    report = (out / "report.md").read_text()
    assert "## Input pipeline" in report and "Read buffer on small files" in report and "exactly once" in report
    assert (out / "figures" / "pipeline_layout.png").is_file()


def _workers_row(label: str, workers: int, prefetch: int, wall_s: float) -> dict:
    return {
        "label": label,
        "workers": workers,
        "prefetch": prefetch,
        "wall_s": wall_s,
        "wait_s": wall_s / 2,
        "au": 0.5,
        "verdict": "balanced",
        "samples": 100,
        "exactly_once": True,
    }


@pytest.mark.parametrize(
    ("best_wall_s", "key", "level"), [(0.5, "workers_help", "good"), (0.97, "workers_no_help", "warn")]
)
def test_workers_finding_says_whether_workers_beat_neither(best_wall_s, key, level):
    rows = [_workers_row("neither", 0, 0, 1.0), _workers_row("2 workers", 2, 2, best_wall_s)]
    section = {"tables": [{"key": "workers", "rows": rows}], "thresholds": {}, "exactly_once": True}
    found = {f.key: f for f in findings(section)}
    workers = found[f"pipeline.{key}"]
    assert workers.level == level and workers.values["best"]["label"] == "2 workers"
    assert workers.values["neither"]["wall_s"] == 1.0
    assert worded(found.values(), WORDS).items  # every key has its words
