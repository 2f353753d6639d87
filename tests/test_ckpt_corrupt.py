"""Corrupted checkpoints give one clean CheckpointError — never another exception, a hang or a
huge allocation. Hypothesis truncates files and flips bytes; hand-made files hit each named fault."""

from __future__ import annotations

import contextlib
import io
import json
import os
import struct
import subprocess
import sys
import threading
import tracemalloc

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dlscope.ckpt.inspect import inspect_checkpoint
from dlscope.errors import CheckpointError

FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def small_state() -> dict:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(5, 4)).sum().backward()
    optimizer.step()
    return {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": 2}


def torch_zip_bytes() -> bytes:
    buffer = io.BytesIO()
    torch.save(small_state(), buffer)
    return buffer.getvalue()


def legacy_bytes() -> bytes:
    buffer = io.BytesIO()
    torch.save(small_state(), buffer, _use_new_zipfile_serialization=False)
    return buffer.getvalue()


def safetensors_bytes(header: dict | None = None, data: bytes | None = None, length: int | None = None) -> bytes:
    if header is None:
        header = {
            "a": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
            "b": {"dtype": "I64", "shape": [1], "data_offsets": [16, 24]},
            "__metadata__": {"format": "pt"},
        }
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    data = data if data is not None else bytes(range(24))
    return struct.pack("<Q", len(raw) if length is None else length) + raw + data


def h5_bytes() -> bytes:
    h5py = pytest.importorskip("h5py")
    buffer = io.BytesIO()
    with h5py.File(buffer, "w") as f:
        f.attrs["model_config"] = json.dumps({"class_name": "Sequential", "config": {"layers": []}})
        f.create_dataset("model_weights/dense/kernel", data=torch.randn(8, 4).numpy())
        f.create_dataset("optimizer_weights/adam/iteration", data=3)
    return buffer.getvalue()


SAMPLES = {"torch-zip": torch_zip_bytes(), "legacy": legacy_bytes(), "safetensors": safetensors_bytes()}


def outcome(path) -> str:
    """Inspecting (with stats, so tensor data is read too) either works or raises CheckpointError."""
    try:
        inspect_checkpoint(path, stats=True)
    except CheckpointError as e:
        assert "\n" not in str(e)
        return "error"
    return "ok"


@pytest.mark.parametrize("kind", list(SAMPLES))
@FUZZ
@given(data=st.data())
def test_truncated_files_fail_cleanly(tmp_path, kind, data):
    blob = SAMPLES[kind]
    cut = data.draw(st.integers(1, len(blob) - 1), label="length")
    path = tmp_path / "cut.ckpt"
    path.write_bytes(blob[:cut])
    outcome(path)


@pytest.mark.parametrize("kind", list(SAMPLES))
@FUZZ
@given(data=st.data())
def test_flipped_bytes_fail_cleanly(tmp_path, kind, data):
    blob = bytearray(SAMPLES[kind])
    for _ in range(data.draw(st.integers(1, 4), label="flips")):
        position = data.draw(st.integers(0, len(blob) - 1), label="position")
        blob[position] = data.draw(st.integers(0, 255), label="byte")
    path = tmp_path / "flipped.ckpt"
    path.write_bytes(bytes(blob))
    outcome(path)


@FUZZ
@given(data=st.data())
def test_truncated_hdf5_fails_cleanly(tmp_path, data):
    blob = h5_bytes()
    cut = data.draw(st.integers(1, len(blob) - 1), label="length")
    path = tmp_path / "cut.h5"
    path.write_bytes(blob[:cut])
    assert outcome(path) == "error"


def test_truncated_zip_names_the_central_directory(tmp_path):
    path = tmp_path / "cut.pt"
    path.write_bytes(SAMPLES["torch-zip"][:-100])
    with pytest.raises(CheckpointError, match="failed finding central directory"):
        inspect_checkpoint(path)


def test_truncated_hdf5_is_named(tmp_path):
    path = tmp_path / "cut.h5"
    path.write_bytes(h5_bytes()[:1000])
    with pytest.raises(CheckpointError, match=r"unreadable HDF5 .*truncated"):
        inspect_checkpoint(path)


@pytest.mark.parametrize(
    ("blob", "fault"),
    [
        (safetensors_bytes(length=2**62), "over the format's 100 MB limit"),
        (safetensors_bytes(length=90_000_000), "runs past the end"),
        (
            safetensors_bytes(
                {
                    "a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
                    "b": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]},
                }
            ),
            "overlap",
        ),
        (
            safetensors_bytes({"a": {"dtype": "F32", "shape": [8], "data_offsets": [0, 32]}}),
            "past the 24-byte data area",
        ),
        (
            safetensors_bytes({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 16]}}),
            "needs 12",
        ),
        (safetensors_bytes({"a": {"dtype": "Q4", "shape": [1], "data_offsets": [0, 1]}}), "unknown dtype"),
        (safetensors_bytes({"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}), "non-negative"),
    ],
    ids=["absurd-length", "length-past-eof", "overlap", "out-of-range", "size-mismatch", "dtype", "shape"],
)
def test_safetensors_faults_are_named(tmp_path, blob, fault):
    path = tmp_path / "bad.safetensors"
    path.write_bytes(blob)
    with pytest.raises(CheckpointError, match=fault):
        inspect_checkpoint(path)


def test_hostile_lengths_do_not_allocate_or_hang(tmp_path):
    cases = {
        # BINBYTES8 claiming 2**62 bytes: the read is bounded by the data that is there
        "bytes8.pkl": b"\x80\x04\x8e" + struct.pack("<Q", 2**62) + b"xx.",
        # 60 levels of a list holding the previous one twice: 2**60 paths, 61 objects
        "laughs.pkl": b"\x80\x02]" + b"q\x00h\x00h\x00\x86" * 60 + b".",
    }
    for name, blob in cases.items():
        path = tmp_path / name
        path.write_bytes(blob)
        tracemalloc.start()
        try:
            # a walk of every path would never end: the thread's join is a guard against a test that
            # would hang, far above the milliseconds it takes, not a timing check
            worker = threading.Thread(target=inspect_quietly, args=(path,), daemon=True)
            worker.start()
            worker.join(timeout=120)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert not worker.is_alive(), f"{name}: still inspecting"
        assert peak < 64 * 2**20, f"{name}: {peak / 2**20:.0f} MiB allocated"  # no 2**62-byte read, no 2**60 paths


def inspect_quietly(path) -> None:
    with contextlib.suppress(CheckpointError):
        inspect_checkpoint(path)


def test_cli_prints_one_line_and_exits_2(tmp_path):
    path = tmp_path / "cut.pt"
    path.write_bytes(SAMPLES["torch-zip"][:500])
    result = subprocess.run(
        [sys.executable, "-m", "dlscope.cli", "ckpt", "inspect", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and result.stderr.startswith(f"dlscope: error: {path}: truncated")
    assert "Traceback" not in result.stderr
