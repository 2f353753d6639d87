"""IDX format: round trips for every dtype, and one clear error per kind of corruption."""

from __future__ import annotations

import gzip

import numpy as np
import pytest

from dlscope.data.idx import IDX_DTYPES, encode_idx, read_idx, write_idx
from dlscope.errors import DatasetError


@pytest.mark.parametrize("code", sorted(IDX_DTYPES))
@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_round_trip_every_dtype(tmp_path, code, suffix):
    dtype = IDX_DTYPES[code].newbyteorder("=")
    rng = np.random.default_rng(code)
    array = (rng.standard_normal((3, 4, 5)) * 100).astype(dtype)
    path = write_idx(tmp_path / f"a-idx3{suffix}", array)
    back = read_idx(path)
    assert back.dtype == dtype
    np.testing.assert_array_equal(back, array)
    # gzip is detected from content, not the name
    assert (path.read_bytes()[:2] == b"\x1f\x8b") == (suffix == ".gz")


def test_header_is_big_endian(tmp_path):
    content = encode_idx(np.arange(6, dtype=np.int32).reshape(2, 3))
    assert content[:4] == bytes([0, 0, 0x0C, 2])
    assert content[4:12] == (2).to_bytes(4, "big") + (3).to_bytes(4, "big")
    assert content[12:16] == (0).to_bytes(4, "big") and content[16:20] == (1).to_bytes(4, "big")


def _write(tmp_path, content: bytes, name="bad-idx") -> str:
    path = tmp_path / name
    path.write_bytes(content)
    return str(path)


GOOD = encode_idx(np.arange(12, dtype=np.uint8).reshape(3, 4))


@pytest.mark.parametrize(
    ("content", "fault"),
    [
        (b"\x01\x00" + GOOD[2:], "wrong magic"),
        (GOOD[:2] + b"\x0a" + GOOD[3:], "unknown IDX dtype code 0x0A"),
        (GOOD[:2] + b"\x07" + GOOD[3:], "unknown IDX dtype code 0x07"),
        (GOOD[:-1], "truncated body"),
        (GOOD + b"\x00\x00", "size/dimension mismatch"),
        (GOOD[:6], "truncated header"),
        (b"", "too short"),
        (GOOD[:3] + b"\x00", "zero dimensions"),
    ],
)
def test_corruptions_name_file_and_fault(tmp_path, content, fault):
    path = _write(tmp_path, content)
    with pytest.raises(DatasetError) as err:
        read_idx(path)
    assert fault in str(err.value)
    assert str(err.value).startswith(path)
    assert "\n" not in str(err.value)


def test_corrupt_and_truncated_gzip(tmp_path):
    packed = gzip.compress(GOOD)
    with pytest.raises(DatasetError, match="truncated gzip stream"):
        read_idx(_write(tmp_path, packed[: len(packed) // 2], "t.gz"))
    flipped = bytearray(packed)
    flipped[12] ^= 0xFF
    with pytest.raises(DatasetError, match="gzip"):
        read_idx(_write(tmp_path, bytes(flipped), "c.gz"))


def test_missing_file(tmp_path):
    with pytest.raises(DatasetError, match="file not found"):
        read_idx(tmp_path / "nope")


def test_write_refuses_unsupported_dtype(tmp_path):
    with pytest.raises(ValueError, match="cannot store"):
        write_idx(tmp_path / "x", np.zeros(3, dtype=np.complex64))
    assert not list(tmp_path.iterdir())
