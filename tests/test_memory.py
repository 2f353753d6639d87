"""Memory anatomy: the per-layer table is right, and the model of the peak matches the measured one."""

from __future__ import annotations

import json

import pytest
import torch

from dlscope.cli import main
from dlscope.instruments.layer_memory import FUNCTIONAL, layer_memory, measure_peak, memory_anatomy, saved_activations
from dlscope.measure.memory import SOURCE
from dlscope.models import build_model


def adam(model: torch.nn.Module) -> torch.optim.Optimizer:
    return torch.optim.Adam(model.parameters(), lr=1e-3)


def sgd(model: torch.nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True)  # as dlscope's --optimizer sgd


@pytest.mark.slow
def test_memory_model_is_within_10_percent_of_the_measured_peak_for_cnn():
    result = memory_anatomy(lambda: build_model("cnn"), adam, [16, 64])
    assert result["method"] == SOURCE["cpu"]
    for c in result["comparisons"]:
        assert abs(c["error_pct"]) <= 10, c
        assert c["measured_peak_bytes"] > c["static_bytes"] + c["activation_bytes"] * 0.5


@pytest.mark.parametrize("make_optimizer", [adam, sgd], ids=["adam", "sgd"])
def test_memory_model_covers_the_optimizer_step_of_a_weight_heavy_model(make_optimizer):
    """The MLP's 1.6 MB of weights dwarf its activations: its peak is the optimizer step's temporaries."""
    result = memory_anatomy(lambda: build_model("mlp"), make_optimizer, [16])
    (c,) = result["comparisons"]
    assert c["peak_at"] == "optimizer step"
    assert abs(c["error_pct"]) <= 10, c


def test_layer_table_weights_grads_and_optimizer_state():
    model = build_model("cnn")
    x, y = torch.randn(4, 1, 28, 28), torch.randint(0, 10, (4,))
    params = sum(p.numel() * 4 for p in model.parameters())
    rows = {r.name: r for r in layer_memory(model, adam, x, y)}
    assert sum(r.weight_bytes for r in rows.values()) == params
    assert sum(r.grad_bytes for r in rows.values()) == params
    # Adam keeps exp_avg and exp_avg_sq per parameter, plus a 4-byte step counter per tensor
    tensors = len(list(model.parameters()))
    assert sum(r.optimizer_bytes for r in rows.values()) == 2 * params + 4 * tensors
    momentum_rows = layer_memory(model, sgd, x, y)
    assert sum(r.optimizer_bytes for r in momentum_rows) == params
    # the pool saves int64 indices of its 16×14×14 output; the ReLU saves its 16×28×28 float output
    assert rows["conv1.2"].saved_bytes_per_sample == 16 * 14 * 14 * 8
    assert rows["conv1.1"].saved_bytes_per_sample == 16 * 28 * 28 * 4
    assert rows["conv1.0"].saved_bytes_per_sample == 0  # it saves only the input batch and its weight
    assert FUNCTIONAL in rows


def test_saved_activations_grow_linearly_with_the_batch():
    model = build_model("cnn")
    small, _ = saved_activations(model, torch.randn(8, 1, 28, 28), torch.randint(0, 10, (8,)))
    large, _ = saved_activations(model, torch.randn(32, 1, 28, 28), torch.randint(0, 10, (32,)))
    for name in ("conv1.1", "conv1.2", "conv2.1", "conv2.2", "out"):
        assert large[name] == 4 * small[name]


def test_measured_peak_grows_with_the_batch():
    small = measure_peak(lambda: build_model("cnn"), adam, 8)
    large = measure_peak(lambda: build_model("cnn"), adam, 32)
    assert 2.5 < large / small < 4.5


@pytest.mark.slow
def test_ops_memory_command(tmp_path):
    out = tmp_path / "run"
    assert main(["ops", "memory", "--batch-sizes", "16,32", "--out", str(out), "--no-progress"]) == 0
    section = json.loads((out / "results.json").read_text())["sections"]["ops"]
    assert section["parts"] == ["memory"]
    assert [c["batch_size"] for c in section["memory"]["comparisons"]] == [16, 32]
    assert "modelled against measured peak" in (out / "report.html").read_text().lower()


def test_ops_memory_bad_batch_sizes(tmp_path, capsys):
    assert main(["ops", "memory", "--batch-sizes", "16,x", "--out", str(tmp_path / "r")]) == 2
    assert "--batch-sizes" in capsys.readouterr().err


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_peak_holds_at_least_the_modelled_tensors():
    result = memory_anatomy(lambda: build_model("cnn"), adam, [16, 64], device="cuda")
    assert result["method"] == "torch.cuda.max_memory_allocated"
    small, large = result["comparisons"]
    for c in (small, large):
        # cuDNN workspaces come on top, so the measurement can only exceed the tensors that must exist
        assert c["measured_peak_bytes"] >= c["static_bytes"] + c["activation_bytes"]
    assert large["measured_peak_bytes"] > small["measured_peak_bytes"]


def test_the_cpu_allocation_peak_replays_allocations_and_frees_in_time_order():
    from dlscope.measure.memory import allocation_peak

    mib = 2**20
    with allocation_peak(torch.device("cpu")) as recorded:
        a = torch.empty(mib)  # 4 MiB
        b = torch.empty(2 * mib)  # 8 MiB: 12 MiB held together
        del a
        c = torch.empty(mib)  # 4 MiB again, after a was freed: still 12
        del b, c
    assert 12 * mib <= recorded["peak_bytes"] < 13 * mib
