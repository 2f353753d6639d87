"""MNIST: the embedded copy, another copy on disk, checksums, and fetching from a mirror."""

from __future__ import annotations

import contextlib
import functools
import gzip
import http.server
import shutil
import threading
from pathlib import Path

import pytest

from dlscope.data.mnist import MNIST_FILES, fetch_mnist, load_mnist, vendored_dir
from dlscope.errors import DatasetError


def test_embedded_mnist_is_complete(mnist):
    assert mnist.source == "embedded"
    assert tuple(mnist.train_images.shape) == (60000, 28, 28)
    assert tuple(mnist.test_images.shape) == (10000, 28, 28)
    assert mnist.train_labels.min().item() == 0 and mnist.train_labels.max().item() == 9
    assert mnist.train_labels[:8].tolist() == [5, 0, 4, 1, 9, 2, 1, 3]  # the famous first digits


def copy_as_torchvision(tmp_path: Path, compressed: bool = True) -> Path:
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for spec in MNIST_FILES.values():
        src = vendored_dir() / f"{spec.name}.gz"
        if compressed:
            shutil.copy(src, raw / src.name)
        else:
            (raw / spec.name).write_bytes(gzip.decompress(src.read_bytes()))
    return raw


@pytest.mark.parametrize("compressed", [True, False])
def test_data_dir_in_torchvision_layout(tmp_path, mnist, compressed):
    copy_as_torchvision(tmp_path, compressed)
    data = load_mnist(tmp_path)
    assert data.source.endswith("MNIST/raw")
    assert (data.test_images == mnist.test_images).all()


def test_checksum_catches_one_flipped_byte(tmp_path):
    raw = copy_as_torchvision(tmp_path, compressed=False)
    path = raw / "t10k-images-idx3-ubyte"
    content = bytearray(path.read_bytes())
    content[5_000_000] ^= 0x01  # one bit of one pixel: still a valid IDX file
    path.write_bytes(bytes(content))
    with pytest.raises(DatasetError, match="checksum mismatch") as err:
        load_mnist(tmp_path)
    assert "t10k-images-idx3-ubyte" in str(err.value)


def test_missing_file_and_missing_dir(tmp_path):
    raw = copy_as_torchvision(tmp_path)
    (raw / "train-labels-idx1-ubyte.gz").unlink()
    with pytest.raises(DatasetError, match="missing train-labels-idx1-ubyte"):
        load_mnist(tmp_path)
    with pytest.raises(DatasetError, match="does not exist"):
        load_mnist(tmp_path / "elsewhere")


@contextlib.contextmanager
def serve(directory: Path):
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(directory))
    handler.log_message = lambda *a, **k: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_fetch_from_local_mirror(tmp_path):
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    for spec in MNIST_FILES.values():
        shutil.copy(vendored_dir() / f"{spec.name}.gz", mirror)
    with serve(mirror) as url:
        raw = fetch_mnist(url, tmp_path / "cache")
    assert sorted(p.name for p in raw.iterdir()) == sorted(f"{s.name}.gz" for s in MNIST_FILES.values())
    assert load_mnist(tmp_path / "cache").train_labels.shape == (60000,)


def test_fetch_bad_checksum_leaves_nothing(tmp_path):
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    for spec in MNIST_FILES.values():
        shutil.copy(vendored_dir() / f"{spec.name}.gz", mirror)
    labels = mirror / "t10k-labels-idx1-ubyte.gz"
    content = bytearray(gzip.decompress(labels.read_bytes()))
    content[100] = (content[100] + 1) % 10
    labels.write_bytes(gzip.compress(bytes(content)))
    with serve(mirror) as url, pytest.raises(DatasetError, match="checksum mismatch"):
        fetch_mnist(url, tmp_path / "cache")
    leftovers = [p for p in (tmp_path / "cache").rglob("*") if p.is_file()] if (tmp_path / "cache").exists() else []
    assert leftovers == []


def test_fetch_missing_file_is_one_line_error(tmp_path):
    (tmp_path / "empty").mkdir()
    with serve(tmp_path / "empty") as url, pytest.raises(DatasetError, match="download failed") as err:
        fetch_mnist(url, tmp_path / "cache")
    assert "train-images-idx3-ubyte.gz" in str(err.value)
