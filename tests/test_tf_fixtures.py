"""dlscope's TF readers on files real TensorFlow wrote (tests/fixtures/tf, made by
scripts/make-tf-fixtures; expected.json is what TF itself said about them). No TF needed here."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from dlscope.ckpt.inspect import inspect_checkpoint
from dlscope.cli import main
from dlscope.experiments.pipeline.example import parse_example
from dlscope.experiments.pipeline.tfrecord import IOCounters, TFRecordError, read_records

FIXTURES = Path(__file__).parent / "fixtures" / "tf"
EXPECTED = json.loads((FIXTURES / "expected.json").read_text())
KERNEL_0 = "optimizer/_trainable_variables/0/.ATTRIBUTES/VARIABLE_VALUE"


def test_records_written_by_tensorflow_read_and_parse():
    records = list(read_records(FIXTURES / "records.tfrecord", 64, IOCounters()))
    parsed = [parse_example(r) for r in records]
    assert parsed == [(r["index"], r["label"], bytes.fromhex(r["image"])) for r in EXPECTED["records"]]


def test_a_flipped_byte_in_a_tensorflow_record_names_file_and_offset(tmp_path):
    data = bytearray((FIXTURES / "records.tfrecord").read_bytes())
    second = 16 + int.from_bytes(data[:8], "little")  # where record 2 starts
    data[second + 20] ^= 0x01
    path = tmp_path / "r.tfrecord"
    path.write_bytes(bytes(data))
    with pytest.raises(TFRecordError, match=f"data CRC32C mismatch in the record at offset {second}"):
        list(read_records(path, 4096, IOCounters()))


def test_tensorflow_bundle_names_shapes_values_and_crcs():
    anatomy = inspect_checkpoint(FIXTURES / "bundle" / "ckpt-1", stats=True)
    assert {t.name: t.shape for t in anatomy.tensors} == EXPECTED["bundle"]
    assert not anatomy.corrupt and not [f for f in anatomy.findings if f.level == "bad"]
    kernel = next(t for t in anatomy.tensors if t.name == KERNEL_0)
    assert kernel.read().tolist() == EXPECTED["bundle_kernel_0"]  # float32 values, bit for bit


def test_object_graph_maps_variables_to_layers_and_adam_slots():
    anatomy = inspect_checkpoint(FIXTURES / "bundle" / "ckpt-1")
    rows = {r["tensor"]: r for r in anatomy.layout["variable_map"]}
    # the model's weights are reached through the optimizer first, but belong to the Dense layers
    assert rows[KERNEL_0]["object"] == "model/_functional/_operations/1/_kernel"
    roles = {t.name: (t.role, t.group) for t in anatomy.tensors}
    assert roles[KERNEL_0] == ("parameter", "_operations/1")
    slots = sorted((r["layer"], r["variable"], r["slot"]) for r in rows.values() if r["slot"])
    per_variable = [(layer, var) for layer in ("_operations/1", "_operations/2") for var in ("_kernel", "bias")]
    assert slots == sorted((lv[0], lv[1], s) for lv in per_variable for s in ("momentum", "velocity"))
    slot_bytes = {g["group"]: g.get("optimizer") for g in anatomy.to_dict()["by_group"]}
    assert slot_bytes["_operations/1"] == 2 * (4 * 3 + 3) * 4  # m and v of a 4×3 kernel and its bias


def test_saved_model_variables_read_as_a_bundle():
    anatomy = inspect_checkpoint(FIXTURES / "saved_model", stats=True)
    assert anatomy.format.startswith("TensorFlow SavedModel")
    assert {t.name: t.shape for t in anatomy.tensors} == EXPECTED["saved_model"]
    weight = next(t for t in anatomy.tensors if t.name.startswith("weight/"))
    assert weight.read().tolist() == [[0, 1, 2], [3, 4, 5]]
    assert not anatomy.corrupt


@pytest.mark.parametrize("name", ["model.keras", "model.weights.h5"])
def test_keras3_tensorflow_backend_optimizer_variables_mapped_to_layers(name):
    pytest.importorskip("h5py")
    anatomy = inspect_checkpoint(FIXTURES / name)
    mapping = anatomy.layout["variable_map"]
    assert len(mapping) == 8  # Adam: m and v for 2 kernels and 2 biases
    assert {(r["layer"], r["variable"]) for r in mapping} == {
        (layer, f"vars/{i}") for layer in EXPECTED["layers"] for i in (0, 1)
    }
    groups = {g["group"]: g for g in anatomy.to_dict()["by_group"]}
    assert set(groups) == set(EXPECTED["layers"])
    assert all(g["optimizer"] == 2 * g["parameter"] for g in groups.values())
    if name == "model.keras":  # the compile config names the optimizer, so the slots get their names
        assert sorted({r["slot"] for r in mapping}) == ["momentum", "velocity"]


@pytest.fixture
def corrupt_bundle(tmp_path) -> Path:
    """The fixture with one bit flipped inside the first kernel's bytes."""
    shutil.copytree(FIXTURES / "bundle", tmp_path / "bundle")
    offset = inspect_checkpoint(FIXTURES / "bundle" / "ckpt-1")
    kernel = next(t for t in offset.tensors if t.name == KERNEL_0)
    shard = tmp_path / "bundle" / "ckpt-1.data-00000-of-00001"
    data = bytearray(shard.read_bytes())
    data[kernel.offset + 5] ^= 0x10
    shard.write_bytes(bytes(data))
    return tmp_path / "bundle" / "ckpt-1"


def test_flipped_tensor_byte_fails_inspect_stats_and_verify(corrupt_bundle, capsys):
    assert main(["ckpt", "inspect", str(corrupt_bundle)]) == 0  # without --stats the bytes are not read
    capsys.readouterr()
    assert main(["ckpt", "inspect", "--stats", str(corrupt_bundle)]) == 1
    assert "CRC32C mismatch" in capsys.readouterr().out
    assert main(["ckpt", "verify", str(corrupt_bundle)]) == 1
    out = capsys.readouterr().out
    assert out.startswith("MISMATCH") and KERNEL_0 in out and out.count("MISMATCH") == 1


def test_verify_passes_tensorflow_files(capsys):
    for path in (FIXTURES / "bundle" / "ckpt-1", FIXTURES / "saved_model"):
        assert main(["ckpt", "verify", str(path)]) == 0
        assert capsys.readouterr().out.startswith("ok")
