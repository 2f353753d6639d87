"""`dlscope ckpt inspect` / `diff` on files the tests write with torch, safetensors and Keras:
counts and bytes must equal what torch.load(weights_only=True), safetensors and h5py report."""

from __future__ import annotations

import json
import math
import os
import subprocess
import zipfile

import pytest
import torch

from dlscope.checkpoint import save_checkpoint
from dlscope.ckpt.diff import diff_checkpoints
from dlscope.ckpt.inspect import inspect_checkpoint, tensor_stats
from dlscope.ckpt.keras_seed import seed_mlp
from dlscope.cli import main
from dlscope.errors import CheckpointError
from dlscope.models import build_model
from dlscope.train import TrainConfig, rng_state


def tensors_of(obj) -> list[torch.Tensor]:
    """Every tensor torch.load returned, in any container."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        return [t for v in obj.values() for t in tensors_of(v)]
    if isinstance(obj, list | tuple):
        return [t for v in obj for t in tensors_of(v)]
    return []


def trained_state(steps: int = 2) -> dict:
    torch.manual_seed(0)
    model = build_model("cnn")
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1, gamma=0.7)
    for _ in range(steps):
        loss = model(torch.randn(4, 1, 28, 28)).logsumexp(1).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
    return {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()}


def assert_matches_torch_load(path, anatomy) -> None:
    loaded = tensors_of(torch.load(path, weights_only=True))
    assert len(anatomy.tensors) == len(loaded)
    assert sum(t.numel for t in anatomy.tensors) == sum(t.numel() for t in loaded)
    assert sum(t.nbytes for t in anatomy.tensors) == sum(t.numel() * t.element_size() for t in loaded)
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in loaded}
    assert anatomy.to_dict()["totals"]["storage_bytes"] == sum(storages.values())


def test_torch_zip_model_and_optimizer(tmp_path):
    path = tmp_path / "state.pt"
    torch.save(trained_state(), path)
    anatomy = inspect_checkpoint(path, stats=True)
    assert anatomy.format.startswith("torch zip") and anatomy.safe_to_load and not anatomy.findings
    assert_matches_torch_load(path, anatomy)
    roles = {r["role"]: r for r in anatomy.to_dict()["by_role"]}
    assert roles["parameter"]["tensors"] == 6  # conv1, conv2, out: weight + bias
    assert roles["optimizer"]["tensors"] == 18  # Adam: step, exp_avg, exp_avg_sq per parameter
    exp_avg = next(t for t in anatomy.tensors if t.name == "optimizer.state.4.exp_avg")
    assert exp_avg.group == "out" and exp_avg.shape == [10, 1568]  # mapped to the 5th parameter
    members = anatomy.layout["zip_members"]
    assert all(m["crc_ok"] for m in members)
    assert all(m["alignment"] == 0 for m in members if "/data/" in m["name"])
    pickle_info = anatomy.layout["pickles"][0]
    assert pickle_info["protocol"] == 2 and pickle_info["calls"]["torch._utils._rebuild_tensor_v2"] == 24
    assert anatomy.training["optimizer_param_groups"][0]["lr"] == pytest.approx(1e-3 * 0.7**2)
    # offsets really point at the bytes: the stats read from them equal torch's own
    loaded = torch.load(path, weights_only=True)
    weight = loaded["model"]["conv1.0.weight"]
    stats = next(t for t in anatomy.tensors if t.name == "model.conv1.0.weight").stats
    assert stats["mean"] == pytest.approx(weight.double().mean().item())
    assert stats["std"] == pytest.approx(weight.double().std(unbiased=False).item())


def test_lab_checkpoint_roles_config_and_rng(tmp_path):
    state = trained_state(1)
    state.update(
        epoch=1,
        global_step=1,
        rng=rng_state(),
        config=TrainConfig(model="cnn").to_dict(),
        history=[{"epoch": 1, "test_acc": 97.5}],
    )
    path = tmp_path / "final.pt"
    save_checkpoint(path, state)
    anatomy = inspect_checkpoint(path)
    assert anatomy.safe_to_load
    assert_matches_torch_load(path, anatomy)
    roles = {r["role"] for r in anatomy.to_dict()["by_role"]}
    assert roles == {"parameter", "optimizer", "rng"}
    assert anatomy.architecture["class_name"] == "cnn"
    assert [layer["name"] for layer in anatomy.architecture["layers"]] == ["conv1.0", "conv2.0", "out"]
    assert anatomy.training["config"]["optimizer"] == "adam"
    assert anatomy.metadata["history.0.test_acc"] == 97.5
    assert anatomy.metadata["scheduler.gamma"] == 0.7


def test_view_saves_whole_storage_and_stats_follow_the_view(tmp_path):
    base = torch.arange(10, dtype=torch.float32)
    path = tmp_path / "view.pt"
    torch.save({"view": base[2:5], "strided": base[::3]}, path)
    anatomy = inspect_checkpoint(path, stats=True)
    shared = anatomy.to_dict()["shared_storages"]
    assert len(shared) == 1 and shared[0]["storage_bytes"] == 40
    assert sorted(shared[0]["tensors"]) == ["strided", "view"]
    by_name = {t.name: t for t in anatomy.tensors}
    assert (by_name["view"].stats["min"], by_name["view"].stats["max"]) == (2.0, 4.0)
    assert by_name["strided"].stats["mean"] == pytest.approx((0 + 3 + 6 + 9) / 4)


def test_storage_saved_from_gpu_is_noted(tmp_path):
    # no GPU here: rewrite the location torch.save recorded, as a CUDA save would have written it
    cpu = tmp_path / "cpu.pt"
    torch.save({"w": torch.ones(2)}, cpu)
    gpu = tmp_path / "gpu.pt"
    with zipfile.ZipFile(cpu) as src, zipfile.ZipFile(gpu, "w") as dst:
        for info in src.infolist():
            data = src.read(info)
            if info.filename.endswith("data.pkl"):
                data = data.replace(b"X\x03\x00\x00\x00cpu", b"X\x06\x00\x00\x00cuda:0")
            dst.writestr(info, data)
    anatomy = inspect_checkpoint(gpu)
    assert [t.device for t in anatomy.tensors] == ["cuda:0"]
    findings = {f.key: f.values for f in anatomy.findings}
    assert findings["ckpt.device_storages"]["devices"] == ["cuda:0"]  # the words say: map_location='cpu'
    assert findings["ckpt.misaligned"] == {"storages": 1}  # zipfile's writer does not pad as torch.save does
    assert anatomy.safe_to_load
    assert torch.equal(torch.load(gpu, weights_only=True, map_location="cpu")["w"], torch.ones(2))


def test_stats_count_zeros_nan_inf():
    x = torch.tensor([0.0, 0.0, 1.0, 3.0, float("nan"), float("inf"), -float("inf"), 2.0])
    s = tensor_stats(x)
    finite = torch.tensor([0.0, 0.0, 1.0, 3.0, 2.0], dtype=torch.float64)
    assert (s["nan"], s["inf"], s["zeros"]) == (1, 2, 2 / 8)
    assert (s["min"], s["max"]) == (0.0, 3.0)
    assert s["mean"] == pytest.approx(finite.mean().item())
    assert s["std"] == pytest.approx(finite.std(unbiased=False).item())


def test_stats_chunked_merge_equals_one_pass(monkeypatch):
    import dlscope.ckpt.inspect as inspect_module

    x = torch.randn(10_001, dtype=torch.float64) * 3 + 100  # a large mean: naive sum of squares loses digits
    whole = tensor_stats(x)
    monkeypatch.setattr(inspect_module, "CHUNK", 97)
    chunked = tensor_stats(x)
    assert chunked["std"] == pytest.approx(whole["std"], rel=1e-9)
    assert chunked["mean"] == pytest.approx(x.mean().item(), rel=1e-12)


def test_legacy_torch_format(tmp_path):
    path = tmp_path / "legacy.pt"
    torch.save(trained_state(1), path, _use_new_zipfile_serialization=False)
    anatomy = inspect_checkpoint(path, stats=True)
    assert anatomy.format.startswith("legacy") and anatomy.safe_to_load
    assert_matches_torch_load(path, anatomy)
    loaded = torch.load(path, weights_only=True)
    bias = next(t for t in anatomy.tensors if t.name == "model.out.bias")
    assert bias.stats["max"] == pytest.approx(loaded["model"]["out.bias"].max().item())


def test_whole_pickled_module_named_as_its_state_dict(tmp_path):
    model = torch.nn.Sequential(
        torch.nn.Conv2d(1, 2, 3), torch.nn.BatchNorm2d(2), torch.nn.Sequential(torch.nn.Linear(3, 4))
    )
    path = tmp_path / "model.pth"
    torch.save(model, path)  # the handouts' habit: the module object itself, not its state_dict
    anatomy = inspect_checkpoint(path)
    assert not anatomy.safe_to_load  # nn classes are off the allow-list: torch.load(weights_only) refuses it
    assert {f.level for f in anatomy.findings} == {"bad"}
    assert [t.name for t in anatomy.tensors] == list(model.state_dict())
    roles = {t.name: t.role for t in anatomy.tensors}
    assert roles["1.running_var"] == "buffer" and roles["2.0.weight"] == "parameter"
    arch = anatomy.architecture
    assert arch["class_name"] == "Sequential"
    assert [(layer["name"], layer["class_name"]) for layer in arch["layers"]] == [
        ("0", "Conv2d"),
        ("1", "BatchNorm2d"),
        ("2.0", "Linear"),
    ]


def test_lightning_style_dict(tmp_path):
    state = trained_state(1)
    path = tmp_path / "epoch=3.ckpt"
    torch.save(
        {
            "epoch": 3,
            "global_step": 120,
            "pytorch-lightning_version": "2.4.0",
            "state_dict": {f"model.{k}": v for k, v in state["model"].items()},
            "optimizer_states": [state["optimizer"]],
            "lr_schedulers": [state["scheduler"]],
            "hyper_parameters": {"lr": 1e-3, "batch_size": 64},
        },
        path,
    )
    anatomy = inspect_checkpoint(path)
    assert_matches_torch_load(path, anatomy)
    roles = {r["role"]: r["tensors"] for r in anatomy.to_dict()["by_role"]}
    assert roles == {"parameter": 6, "optimizer": 18}
    assert anatomy.metadata["pytorch-lightning_version"] == "2.4.0"
    assert anatomy.training["config"] == {"lr": 1e-3, "batch_size": 64}
    assert anatomy.training["scheduler"]["gamma"] == 0.7 and anatomy.training["optimizer_param_groups"][0]["lr"] > 0
    exp_avg_sq = next(t for t in anatomy.tensors if t.name == "optimizer_states.0.state.1.exp_avg_sq")
    assert exp_avg_sq.group == "model.conv1.0" and exp_avg_sq.shape == [16]


def test_safetensors_matches_safe_open(tmp_path):
    safetensors_torch = pytest.importorskip("safetensors.torch")
    from safetensors import safe_open

    tensors = {
        "conv.weight": torch.randn(16, 1, 5, 5),
        "conv.bias": torch.zeros(16, dtype=torch.float16),
        "bn.num_batches_tracked": torch.tensor(3),
        "mask": torch.tensor([True, False]),
        "emb": torch.randn(7, 3).to(torch.bfloat16),
    }
    path = tmp_path / "model.safetensors"
    safetensors_torch.save_file(tensors, path, metadata={"format": "pt"})
    anatomy = inspect_checkpoint(path, stats=True)
    assert anatomy.format == "safetensors" and anatomy.metadata == {"format": "pt"}
    with safe_open(path, "pt") as f:
        assert sorted(t.name for t in anatomy.tensors) == sorted(f.keys())
        for t in anatomy.tensors:
            ref = f.get_tensor(t.name)
            assert (t.shape, t.dtype, t.nbytes) == (
                list(ref.shape),
                str(ref.dtype)[6:],
                ref.numel() * ref.element_size(),
            )
            assert torch.equal(t.read(), ref)
    assert anatomy.to_dict()["totals"]["overhead_bytes"] == 8 + anatomy.layout["safetensors_header"]["header_bytes"]
    assert {t.name: t.role for t in anatomy.tensors}["bn.num_batches_tracked"] == "buffer"


@pytest.fixture(scope="module")
def keras_files(tmp_path_factory):
    os.environ.setdefault("KERAS_BACKEND", "torch")
    keras = pytest.importorskip("keras", reason="keras 3 is a test dependency (requirements-test.txt)")
    import numpy as np

    out = tmp_path_factory.mktemp("keras")
    model = seed_mlp(keras)
    model.fit(np.random.rand(64, 28, 28).astype("float32"), np.random.randint(0, 10, 64), epochs=1, verbose=0)
    files = {"h5": out / "model.h5", "keras": out / "model.keras", "weights": out / "w.weights.h5"}
    model.save(files["keras"])  # first: after a legacy .h5 save, Keras 3.15 drops the optimizer from compile_config
    model.save(files["h5"])
    model.save_weights(files["weights"])
    return files


def h5_datasets(source) -> dict[str, tuple]:
    import h5py

    found = {}
    with h5py.File(source, "r") as f:
        f.visititems(
            lambda name, obj: found.update({name: (obj.shape, obj.dtype.itemsize)}) if hasattr(obj, "shape") else None
        )
    return found


SEED_LAYERS = ["InputLayer", "Flatten", "Dense", "Dropout", "Dense"]


def test_keras_h5_model_config_and_training_config(keras_files):
    anatomy = inspect_checkpoint(keras_files["h5"], stats=True)
    assert anatomy.format.startswith("Keras HDF5 model")
    assert [layer["class_name"] for layer in anatomy.architecture["layers"]] == SEED_LAYERS
    dense = anatomy.architecture["layers"][2]
    assert dense["config"]["units"] == 512 and dense["config"]["activation"] == "relu"
    assert anatomy.training["loss"] == "sparse_categorical_crossentropy"
    assert anatomy.training["metrics"] == ["accuracy"]
    assert anatomy.training["optimizer"] == "Adam" and anatomy.training["optimizer_config"]["beta_1"] == 0.9
    datasets = h5_datasets(keras_files["h5"])
    assert sorted(t.name for t in anatomy.tensors) == sorted(datasets)
    assert sum(t.nbytes for t in anatomy.tensors) == sum(math.prod(s) * i for s, i in datasets.values())
    kernel = next(t for t in anatomy.tensors if t.name.endswith("dense/kernel"))
    assert kernel.shape == [784, 512] and kernel.role == "parameter" and kernel.group == "dense"
    assert {t.role for t in anatomy.tensors} == {"parameter", "optimizer"}
    groups = {g["group"]: g for g in anatomy.to_dict()["by_group"]}
    assert groups["dense_1"]["optimizer"] == 2 * (512 * 10 + 10) * 4  # momentum + velocity, not dense's


def test_keras_v3_zip_offsets_point_into_the_member(keras_files):
    anatomy = inspect_checkpoint(keras_files["keras"], stats=True)
    assert anatomy.format.startswith("Keras v3")
    assert [layer["class_name"] for layer in anatomy.architecture["layers"]] == SEED_LAYERS
    assert anatomy.training["optimizer"] == "Adam" and "keras_version" in anatomy.metadata
    with zipfile.ZipFile(keras_files["keras"]) as z:
        import io

        datasets = h5_datasets(io.BytesIO(z.read("model.weights.h5")))
    assert len(anatomy.tensors) == len(datasets) == 14
    # a dataset's file offset is the member's data offset plus its offset inside the HDF5 image
    kernel = next(t for t in anatomy.tensors if t.name == "layers/dense/vars/0")
    with open(keras_files["keras"], "rb") as f:
        f.seek(kernel.offset)
        raw = torch.frombuffer(bytearray(f.read(kernel.nbytes)), dtype=torch.float32).reshape(784, 512)
    assert torch.equal(raw, kernel.read())


def test_keras_weights_only_h5(keras_files):
    anatomy = inspect_checkpoint(keras_files["weights"])
    assert anatomy.format == "Keras HDF5 weights" and anatomy.architecture is None
    assert len(anatomy.tensors) == len(h5_datasets(keras_files["weights"]))


def test_diff_identical_changed_added_removed(tmp_path):
    state = trained_state(1)
    a, b, c = tmp_path / "a.pt", tmp_path / "b.pt", tmp_path / "c.pt"
    torch.save(state, a)
    torch.save(torch.load(a, weights_only=True), b)
    same = diff_checkpoints(a, b)
    assert same["identical"] and len(same["tensors"]) == 24
    changed = torch.load(a, weights_only=True)
    changed["model"]["out.bias"][3] += 0.5
    changed["model"]["extra"] = torch.ones(2)
    del changed["model"]["conv1.0.bias"]
    changed["model"]["conv2.0.bias"] = changed["model"]["conv2.0.bias"].double()
    torch.save(changed, c)
    result = diff_checkpoints(a, c)
    assert not result["identical"]
    assert result["added"] == ["model.extra"] and result["removed"] == ["model.conv1.0.bias"]
    assert [x["name"] for x in result["shape_or_dtype_changed"]] == ["model.conv2.0.bias"]
    (bias,) = [r for r in result["tensors"] if not r["identical"]]
    old = state["model"]["out.bias"][3].item()
    assert bias["name"] == "model.out.bias" and bias["max_abs"] == pytest.approx(0.5, rel=1e-6)
    assert bias["max_rel"] == pytest.approx(0.5 / abs(old), rel=1e-4)


def run_cli(capsys: pytest.CaptureFixture, *args: str) -> subprocess.CompletedProcess:
    """The CLI in this process (no interpreter start-up per command): its exit status and output."""
    capsys.readouterr()
    code = main(list(args))
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(["dlscope", *args], code, out, err)


@pytest.mark.slow
def test_cli_inspect_json_and_diff_exit_codes(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "160")
    a, b = tmp_path / "a.pt", tmp_path / "b.pt"
    torch.save(trained_state(1), a)
    torch.save(trained_state(2), b)
    shown = run_cli(capsys, "ckpt", "inspect", str(a), "--stats")
    assert shown.returncode == 0, shown.stderr
    assert "safe to torch.load" in shown.stdout and "model.conv1.0.weight" in shown.stdout
    as_json = run_cli(capsys, "ckpt", "inspect", str(a), "--json")
    data = json.loads(as_json.stdout)
    assert data["totals"]["tensors"] == 24 and data["safe_to_load"] is True
    assert run_cli(capsys, "ckpt", "diff", str(a), str(a)).returncode == 0
    differ = run_cli(capsys, "ckpt", "diff", str(a), str(b))
    assert differ.returncode == 1 and "common tensors differ" in differ.stdout


def test_missing_and_wrong_magic_are_clean_errors(tmp_path):
    with pytest.raises(CheckpointError, match="no such file"):
        inspect_checkpoint(tmp_path / "absent.pt")
    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"\x00\x01GARBAGE" * 10)
    with pytest.raises(CheckpointError, match=r"unknown format .* wrong magic"):
        inspect_checkpoint(junk)
