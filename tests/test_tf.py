"""With real TensorFlow (the tf extra; marked tf, skipped without it): TF parses dlscope's records,
TF rejects the bundle dlscope calls corrupt, the tf.data engine delivers what dlscope's stages
deliver, and the TensorFlow-backend seed 003 run. Plus the one-line error where TF is missing."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from dlscope.ckpt.inspect import inspect_checkpoint
from dlscope.cli import main
from dlscope.experiments.pipeline import (
    ReaderConfig,
    SimulatedCompute,
    measure_epoch,
    prepare_dataset,
    synthetic_samples,
)
from dlscope.experiments.pipeline.prepare import data_files
from dlscope.rundir import load_results

FIXTURES = Path(__file__).parent / "fixtures" / "tf"
N = 157
ENV = {
    **{k: v for k, v in os.environ.items() if k != "KERAS_BACKEND"},
    "TF_CPP_MIN_LOG_LEVEL": "2",
    "PYTHONPATH": str(Path(__file__).parents[1] / "src"),
}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    labels, samples = synthetic_samples(N, 60, seed=4)
    root = tmp_path_factory.mktemp("tfdata") / "d"
    return root, prepare_dataset(root, labels, samples, "synthetic", shards=3), labels, samples


@pytest.fixture(scope="module")
def tf():
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow

    return tensorflow


@pytest.mark.tf
@pytest.mark.parametrize("fmt", ["tfrecord", "files"])
def test_tensorflow_parses_dlscope_records(tf, dataset, fmt):
    root, manifest, labels, samples = dataset
    features = {
        "image": tf.io.FixedLenFeature([], tf.string),
        "label": tf.io.FixedLenFeature([], tf.int64),
        "index": tf.io.FixedLenFeature([], tf.int64),
    }
    files = [str(p) for p in data_files(root, manifest, fmt)]
    seen = []
    for record in tf.data.TFRecordDataset(files):
        example = tf.io.parse_single_example(record, features)
        i = int(example["index"])
        assert int(example["label"]) == labels[i]
        assert example["image"].numpy() == samples[i].tobytes()
        seen.append(i)
    assert seen == list(range(N))


@pytest.mark.tf
def test_tensorflow_also_rejects_the_tensor_dlscope_calls_corrupt(tf, tmp_path):
    shutil.copytree(FIXTURES / "bundle", tmp_path / "bundle")
    prefix = tmp_path / "bundle" / "ckpt-1"
    name = "optimizer/_variables/3/.ATTRIBUTES/VARIABLE_VALUE"
    entry = next(t for t in inspect_checkpoint(prefix).tensors if t.name == name)
    shard = tmp_path / "bundle" / "ckpt-1.data-00000-of-00001"
    data = bytearray(shard.read_bytes())
    data[entry.offset] ^= 0x01
    shard.write_bytes(bytes(data))
    assert inspect_checkpoint(prefix, stats=True).corrupt == [name]
    reader = tf.train.load_checkpoint(str(prefix))
    with pytest.raises((tf.errors.OpError, RuntimeError), match="Checksum does not match"):
        reader.get_tensor(name)


@pytest.mark.tf
def test_a_fresh_tensorflow_checkpoint_reads_back_value_for_value(tf, tmp_path):
    variables = {"w": tf.Variable(np.arange(12, dtype=np.float32).reshape(3, 4)), "n": tf.Variable(5, dtype=tf.int64)}
    prefix = tf.train.Checkpoint(**variables).write(str(tmp_path / "c" / "ckpt"))
    reader = tf.train.load_checkpoint(prefix)
    anatomy = inspect_checkpoint(prefix, stats=True)
    assert not anatomy.corrupt
    for t in anatomy.tensors:
        if t.read is not None:
            assert t.read().numpy().tolist() == reader.get_tensor(t.name).tolist()
    assert {r["object"] for r in anatomy.layout["variable_map"]} == {"w", "n"}


@pytest.mark.tf
@pytest.mark.parametrize(
    "config",
    [
        ReaderConfig("tfrecord", batch_size=16, engine="tfdata"),
        ReaderConfig("files", 64, shuffle_buffer=40, batch_size=10, workers=2, prefetch=2, engine="tfdata"),
        ReaderConfig("tfrecord", shuffle_buffer=N, batch_size=32, workers=-1, prefetch=-1, engine="tfdata"),
    ],
    ids=["shards", "files-shuffled-interleave", "autotune"],
)
def test_tfdata_engine_delivers_every_sample_once(dataset, config):
    root, manifest, _, _ = dataset
    tf_run = measure_epoch(root, manifest, config, SimulatedCompute(0), cold=False)
    assert tf_run.exactly_once and tf_run.samples == N and tf_run.engine == "tfdata"
    assert tf_run.steps == -(-N // config.batch_size)
    if config.workers == 0 and config.shuffle_buffer == 0:  # same order as dlscope's stages
        own = measure_epoch(root, manifest, replace(config, engine="dlscope"), SimulatedCompute(0), cold=False)
        assert tf_run.order_digest == own.order_digest


def traced(trace: str, root: Path) -> tuple[int, int]:
    """(read/pread64 calls on data files, the others) between the markers the script reads."""
    lines = trace.splitlines()
    start = next(i for i, line in enumerate(lines) if "dlscope-mark-start" in line)
    end = next(i for i, line in enumerate(lines) if "dlscope-mark-end" in line)
    data = re.compile(rf"\b(read|pread64)\(\d+<{re.escape(str(root))}/(files|shards)/")
    calls = re.compile(r"\b(read|pread64)\(\d+<")
    inside = [line for line in lines[start + 1 : end] if calls.search(line) and "/proc/self/io" not in line]
    data_reads = sum(1 for line in inside if data.search(line))
    return data_reads, len(inside) - data_reads


@pytest.mark.tf
@pytest.mark.slow
@pytest.mark.skipif(shutil.which("strace") is None, reason="strace is not installed (apt-get install strace)")
def test_tfdata_read_counts_match_strace(dataset, tmp_path):
    root, _, _, _ = dataset
    marks = tmp_path / "dlscope-mark-start", tmp_path / "dlscope-mark-end"
    for mark in marks:
        mark.write_text("x")
    script = (
        "import json\n"
        "from dlscope.experiments.pipeline import ReaderConfig, SimulatedCompute, load_manifest, measure_epoch\n"
        "from dlscope.experiments.pipeline.tfdata import import_tensorflow\n"
        f"root = {str(root)!r}\n"
        "config = ReaderConfig('files', read_buffer=40, workers=2, engine='tfdata')\n"
        "manifest = load_manifest(root)\n"
        "import_tensorflow()\n"
        f"open({str(marks[0])!r}).read()\n"
        "m = measure_epoch(root, manifest, config, SimulatedCompute(0), cold=False)\n"
        f"open({str(marks[1])!r}).read()\n"
        "print(json.dumps({'reads': m.reads}))\n"
    )
    log = tmp_path / "strace.log"
    strace = ["strace", "-f", "--seccomp-bpf", "-y", "-e", "trace=read,pread64", "-o", str(log)]
    result = subprocess.run([*strace, sys.executable, "-c", script], capture_output=True, text=True, env=ENV)
    if result.returncode != 0 and "ptrace" in result.stderr:
        pytest.skip(f"strace cannot trace here: {result.stderr.strip()}")
    assert result.returncode == 0, result.stderr[-2000:]
    counted = json.loads(result.stdout.strip().splitlines()[-1])["reads"]
    data_reads, other_reads = traced(log.read_text(), root.resolve())
    file_bytes = (root / "files" / "000" / "000000.rec").stat().st_size
    assert data_reads == N * (-(-file_bytes // 40) + 1)  # every file: ceil(size / buffer) reads, then end of file
    # the process's counters: every data read, and at most the TF runtime's few others
    assert data_reads <= counted <= data_reads + other_reads and other_reads <= 50


@pytest.mark.tf
@pytest.mark.slow
def test_pipeline_run_and_sweep_with_tfdata_end_to_end(dataset, tmp_path):
    root, _, _, _ = dataset
    run = [sys.executable, "-m", "dlscope.cli", "pipeline", "run", str(root), "--engine", "tfdata", "--warm"]
    result = subprocess.run([*run, "--batch-size", "50"], capture_output=True, text=True, env=ENV)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "through tf.data" in result.stdout and re.search(r"exactly once\s+yes", result.stdout)
    sweep = [sys.executable, "-m", "dlscope.cli", "pipeline", "sweep", "--engines", "dlscope,tfdata"]
    small = ["--samples", "200", "--small-files", "100", "--repeats", "1", "--no-progress", "--compute-ms", "0"]
    result = subprocess.run([*sweep, *small, "--out", str(tmp_path / "run")], capture_output=True, text=True, env=ENV)
    assert result.returncode == 0, result.stderr[-2000:]
    section = load_results(tmp_path / "run")["sections"]["pipeline"]
    engines = {(t["key"], r["engine"]) for t in section["tables"] for r in t["rows"]}
    assert {("layout", "tfdata"), ("workers", "tfdata"), ("batch", "tfdata")} <= engines
    assert section["exactly_once"]
    assert "dlscope / tf.data" in result.stdout


@pytest.mark.tf
@pytest.mark.slow
def test_seed003_on_the_tensorflow_backend(tmp_path):
    cmd = [sys.executable, "-m", "dlscope.cli", "ckpt", "seed003", "--backend", "tensorflow", "--epochs", "1"]
    cmd += ["--train-subset", "1024", "--out", str(tmp_path / "run")]
    result = subprocess.run(cmd, capture_output=True, text=True, env=ENV)
    assert result.returncode == 0, result.stderr[-2000:]
    keras = load_results(tmp_path / "run")["sections"]["ckpt_anatomy"]["keras"]
    assert keras["training"]["backend"] == "tensorflow" and keras["training"]["optimizer"] == "rmsprop"
    assert {"h5", "keras", "tf_bundle"} <= set(keras)
    bundle = keras["tf_bundle"]
    assert not bundle["corrupt"]
    slots = {(r["layer"], r["variable"], r["slot"]) for r in bundle["layout"]["variable_map"] if r["slot"]}
    assert len(slots) == 4 and {s for _, _, s in slots} == {"velocity"}  # RMSprop: one slot per variable
    top = keras["training"]["profile"]["top"]
    assert keras["training"]["profile"]["profiler"].startswith("tf.profiler")
    assert any("MatMul" in r["name"] for r in top) and all(r["calls"] > 0 for r in top)


def test_missing_tensorflow_is_one_line_with_the_install_command(dataset, monkeypatch, capsys):
    root, _, _, _ = dataset
    monkeypatch.setitem(sys.modules, "tensorflow", None)  # `import tensorflow` now fails as if absent
    monkeypatch.setenv("KERAS_BACKEND", os.environ.get("KERAS_BACKEND", "torch"))  # seed003 sets it: restore
    assert main(["pipeline", "run", str(root), "--engine", "tfdata"]) == 2
    assert main(["pipeline", "sweep", "--engines", "dlscope,tfdata", "--out", str(root.parent / "no")]) == 2
    assert main(["ckpt", "seed003", "--backend", "tensorflow", "--out", str(root.parent / "no")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all("pip install -e '.[tf]'" in line for line in err)
    assert not (root.parent / "no").exists()
