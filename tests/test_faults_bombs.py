"""Hostile dataset files: a gzip bomb, a sparse 64 GiB file, a header declaring more than memory.
Each ends with one line naming the file, before anything is inflated or read in full."""

from __future__ import annotations

import zlib
from pathlib import Path

import numpy as np
import pytest

from dlscope.cli import main
from dlscope.data.idx import encode_idx, read_idx
from dlscope.errors import DatasetError

MIB = 1 << 20


def gzip_member(data: bytes) -> bytes:
    packer = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    return packer.compress(data) + packer.flush()


def write_gzip_bomb(path: Path, header: bytes, inflated_mib: int) -> Path:
    """`header` then `inflated_mib` MiB of zeros, as concatenated gzip members (what gunzip
    inflates): a 16 GiB bomb is a 16 MiB file, written in well under a second."""
    zeros = gzip_member(b"\0" * MIB)
    with open(path, "wb") as f:
        f.write(gzip_member(header))
        for _ in range(inflated_mib):
            f.write(zeros)
    return path


MNIST_TRAIN_HEADER = encode_idx(np.zeros((60000, 28, 28), np.uint8))[:16]


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("dlscope: error: ") and "Traceback" not in err, err
    return err


def test_gzip_bomb_in_a_data_dir_is_one_line(tmp_path, capsys):
    bomb = write_gzip_bomb(tmp_path / "train-images-idx3-ubyte.gz", MNIST_TRAIN_HEADER, 16 * 1024)
    assert bomb.stat().st_size < 40 * MIB
    assert main(["data", "verify", "--data-dir", str(tmp_path)]) == 2
    err = one_error_line(capsys)
    assert str(bomb) in err and "more than the 47,040,016 bytes expected" in err


def test_gzip_bomb_is_capped_by_its_own_idx_header(tmp_path):
    header = encode_idx(np.zeros((4, 4), np.uint8))[:12]  # declares 16 bytes of data
    bomb = write_gzip_bomb(tmp_path / "small-idx2.gz", header, 256)
    with pytest.raises(DatasetError, match="inflates to more than the 28 bytes expected"):
        read_idx(bomb)


def test_sparse_64_gib_file_is_refused_without_reading(tmp_path, capsys):
    sparse = tmp_path / "train-images-idx3-ubyte"
    with open(sparse, "wb") as f:
        f.write(MNIST_TRAIN_HEADER)
        f.truncate(64 << 30)
    assert main(["data", "verify", "--data-dir", str(tmp_path)]) == 2
    err = one_error_line(capsys)
    assert str(sparse) in err and "68,719,476,736 bytes" in err


def test_header_declaring_more_than_memory_is_refused(tmp_path):
    huge = tmp_path / "huge-idx3"
    header = bytes([0, 0, 0x08, 3]) + np.array([65536, 1024, 1024], ">u4").tobytes()
    with open(huge, "wb") as f:
        f.write(header)
        f.truncate(len(header) + (64 << 30))  # exactly what the header declares: 64 GiB
    with pytest.raises(DatasetError, match=r"more than the .* available in memory"):
        read_idx(huge)
    with pytest.raises(DatasetError, match="available in memory"):
        read_idx(write_gzip_bomb(tmp_path / "huge-idx3.gz", header, 1))


def small_h5(path: Path) -> Path:
    h5py = pytest.importorskip("h5py")
    with h5py.File(path, "w") as f:
        f.attrs["keras_version"] = "2.15.0"
        f.create_dataset("model_weights/dense/kernel:0", data=np.ones((4, 8), np.float32))
    return path


def test_hdf5_probe_past_its_bound_is_one_line(tmp_path, capsys, monkeypatch):
    """HDF5 is read in a child first, killed at PROBE_TIMEOUT_S. The mutated model.h5 that loops
    forever was not reproducible here, so a real probe of a real file is given 10 ms: the child
    cannot finish (its interpreter alone takes longer), exactly as a looping one would not."""
    from dlscope.ckpt import hdf5_probe

    path = small_h5(tmp_path / "model.h5")
    assert main(["ckpt", "inspect", str(path)]) == 0  # the default bound lets a healthy file through
    capsys.readouterr()
    monkeypatch.setattr(hdf5_probe, "PROBE_TIMEOUT_S", 0.01)
    assert main(["ckpt", "inspect", "--stats", str(path)]) == 2
    err = one_error_line(capsys)
    assert str(path) in err and "still reading the file's structure after" in err
