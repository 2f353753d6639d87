"""TensorFlow checkpoints read without tensorflow (not installable here). The test writes a tensor
bundle the way TF's BundleWriter does — an uncompressed LevelDB table of BundleEntryProto with
prefix-compressed keys and restart points, split over several data blocks, and a data shard — and
checks every tensor comes back with its dtype, shape, offset and values."""

from __future__ import annotations

import pytest
import torch
from crc32c import crc32c
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dlscope.ckpt.inspect import inspect_checkpoint
from dlscope.errors import CheckpointError

DT_FLOAT, DT_INT64, DT_STRING = 1, 9, 7
MAGIC = (0xDB4775248B80FB57).to_bytes(8, "little")


def varint(n: int) -> bytes:
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def field(number: int, wire: int, payload: bytes | int) -> bytes:
    tag = varint(number << 3 | wire)
    if wire == 0:
        return tag + varint(payload)
    if wire == 5:
        return tag + payload.to_bytes(4, "little")
    return tag + varint(len(payload)) + payload


def mask(crc: int) -> int:
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def entry_proto(dtype: int, shape: list[int], offset: int, size: int, crc: int) -> bytes:
    dims = b"".join(field(2, 2, field(1, 0, d)) for d in shape)
    return field(1, 0, dtype) + field(2, 2, dims) + field(4, 0, offset) + field(5, 0, size) + field(6, 5, crc)


def block(entries: list[tuple[bytes, bytes]], restart_interval: int = 2) -> bytes:
    out, restarts, previous = bytearray(), [], b""
    for i, (key, value) in enumerate(entries):
        shared = 0
        if i % restart_interval == 0:
            restarts.append(len(out))
        else:
            while shared < min(len(key), len(previous)) and key[shared] == previous[shared]:
                shared += 1
        out += varint(shared) + varint(len(key) - shared) + varint(len(value)) + key[shared:] + value
        previous = key
    for r in restarts:
        out += r.to_bytes(4, "little")
    return bytes(out + len(restarts).to_bytes(4, "little"))


def table(entries: list[tuple[bytes, bytes]], per_block: int = 3) -> bytes:
    out, index = bytearray(), []
    for start in range(0, len(entries), per_block):
        chunk = entries[start : start + per_block]
        data = block(chunk)
        index.append((chunk[-1][0], varint(len(out)) + varint(len(data))))
        out += data + b"\x00" + b"\x00\x00\x00\x00"  # trailer: no compression, crc32c (not checked)
    meta = block([])
    meta_handle = varint(len(out)) + varint(len(meta))
    out += meta + b"\x00" * 5
    index_block = block(index, restart_interval=1)
    index_handle = varint(len(out)) + varint(len(index_block))
    out += index_block + b"\x00" * 5
    footer = meta_handle + index_handle
    return bytes(out + footer + b"\x00" * (40 - len(footer)) + MAGIC)


def write_bundle(tmp_path, tensors: dict[str, torch.Tensor], strings: tuple[str, ...] = ()) -> str:
    prefix = tmp_path / "ckpt-1"
    data, entries = bytearray(), []
    header = field(1, 0, 1) + field(2, 0, 0) + field(3, 2, field(1, 0, 1) + field(2, 0, 0))
    entries.append((b"", header))
    for name, t in tensors.items():
        raw = t.numpy().tobytes()
        dtype = {torch.float32: DT_FLOAT, torch.int64: DT_INT64}[t.dtype]
        entries.append((name.encode(), entry_proto(dtype, list(t.shape), len(data), len(raw), mask(crc32c(raw)))))
        data += raw + b"\x00" * (-len(raw) % 8)
    for name in strings:
        # TF's string layout: varint lengths, the masked CRC of the lengths (as uint32), the bytes
        length_crc = mask(crc32c((5).to_bytes(4, "little"))).to_bytes(4, "little")
        crc = mask(crc32c(b"hello", crc32c(length_crc, crc32c((5).to_bytes(4, "little")))))
        entries.append((name.encode(), entry_proto(DT_STRING, [], len(data), 10, crc)))
        data += b"\x05" + length_crc + b"hello"
    entries[1:] = sorted(entries[1:])
    (tmp_path / "ckpt-1.index").write_bytes(table(entries))
    (tmp_path / "ckpt-1.data-00000-of-00001").write_bytes(bytes(data))
    return str(prefix)


TENSORS = {
    "layer_with_weights-0/kernel/.ATTRIBUTES/VARIABLE_VALUE": torch.randn(784, 16),
    "layer_with_weights-0/bias/.ATTRIBUTES/VARIABLE_VALUE": torch.randn(16),
    "layer_with_weights-0/kernel/.OPTIMIZER_SLOT/optimizer/m/.ATTRIBUTES/VARIABLE_VALUE": torch.randn(784, 16),
    "layer_with_weights-1/kernel/.ATTRIBUTES/VARIABLE_VALUE": torch.randn(16, 10),
    "optimizer/iter/.ATTRIBUTES/VARIABLE_VALUE": torch.tensor(7),
    "save_counter/.ATTRIBUTES/VARIABLE_VALUE": torch.tensor(1),
}


@pytest.mark.parametrize("how", ["prefix", "index", "shard"])
def test_bundle_read_without_tensorflow(tmp_path, how):
    prefix = write_bundle(tmp_path, TENSORS, strings=("vocabulary",))
    path = {"prefix": prefix, "index": prefix + ".index", "shard": prefix + ".data-00000-of-00001"}[how]
    anatomy = inspect_checkpoint(path, stats=True)
    assert anatomy.format.startswith("TensorFlow checkpoint")
    assert anatomy.layout["tf_index"]["header"]["num_shards"] == 1
    assert anatomy.layout["tf_index"]["data_blocks"] == 3  # 8 entries, 3 per block
    by_name = {t.name: t for t in anatomy.tensors}
    assert set(by_name) == {*TENSORS, "vocabulary"}
    for name, t in TENSORS.items():
        entry = by_name[name]
        assert entry.shape == list(t.shape) and entry.nbytes == t.numel() * t.element_size()
        assert torch.equal(entry.read(), t)
        assert entry.stats["max"] == pytest.approx(t.max().item())
    assert by_name["vocabulary"].dtype == "string"
    assert by_name["vocabulary"].read is None  # strings: listed and CRC-checked, not decoded
    roles = {name: t.role for name, t in by_name.items()}
    assert roles["layer_with_weights-0/kernel/.OPTIMIZER_SLOT/optimizer/m/.ATTRIBUTES/VARIABLE_VALUE"] == "optimizer"
    assert roles["save_counter/.ATTRIBUTES/VARIABLE_VALUE"] == "other"
    groups = {g["group"]: g for g in anatomy.to_dict()["by_group"]}
    assert groups["layer_with_weights-0"]["optimizer"] == 784 * 16 * 4
    assert not anatomy.findings and not anatomy.corrupt  # every CRC32C, the string's included, matched


def test_missing_shard_is_a_finding(tmp_path):
    prefix = write_bundle(tmp_path, TENSORS)
    (tmp_path / "ckpt-1.data-00000-of-00001").unlink()
    anatomy = inspect_checkpoint(prefix)
    assert [(f.key, f.level) for f in anatomy.findings] == [("ckpt.shard_missing", "bad")]
    assert all(t.read is None for t in anatomy.tensors)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_corrupt_index_fails_cleanly(tmp_path, data):
    prefix = write_bundle(tmp_path, TENSORS)
    index = tmp_path / "ckpt-1.index"
    blob = bytearray(index.read_bytes())
    if data.draw(st.booleans(), label="truncate"):
        blob = blob[: data.draw(st.integers(1, len(blob) - 1), label="length")]
    else:
        for _ in range(data.draw(st.integers(1, 4), label="flips")):
            blob[data.draw(st.integers(0, len(blob) - 1), label="at")] = data.draw(st.integers(0, 255), label="byte")
    index.write_bytes(bytes(blob))
    try:
        inspect_checkpoint(prefix + ".index", stats=True)
    except CheckpointError as e:
        assert "\n" not in str(e)
