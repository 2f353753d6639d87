"""Profiler over real training steps and the model summary's FLOPs."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from dlscope.data.loaders import ResidentBatches, normalise
from dlscope.instruments.profiler import profile_training, write_tables
from dlscope.instruments.summary import summarize_model
from dlscope.models import build_model


def test_profile_holds_convolution_forward_and_backward(mnist, tmp_path):
    model = build_model("cnn")
    optimizer = torch.optim.Adam(model.parameters())
    before = {k: v.clone() for k, v in model.state_dict().items()}
    batches = ResidentBatches(mnist.train_images[:640], mnist.train_labels[:640], batch_size=64)
    result = profile_training(model, optimizer, batches, wait=1, warmup=1, active=3, trace_path=tmp_path / "t.json")
    names = {row.name for row in result.table.rows}
    assert {"aten::convolution", "aten::convolution_backward", "aten::max_pool2d_with_indices_backward"} <= names
    assert result.table.steps == 3 and result.batch_size == 64
    conv = next(r for r in result.table.rows if r.name == "aten::convolution")
    assert conv.calls == 2 * 3  # two conv layers, three active steps: warm-up steps are not counted
    assert set(result.step_parts_us) == {"step/forward", "step/backward", "step/optimizer"}
    assert result.step_us > 0 and sum(result.step_parts_us.values()) <= result.step_us * 1.05
    top = result.table.top(10)
    assert len(top) == 10 and top == sorted(top, key=lambda r: r.self_cpu_us, reverse=True)
    by_calls = result.table.top(10, "calls")
    assert by_calls[0].calls == max(r.calls for r in result.table.rows)
    # profiling works on a copy: the caller's model is untouched
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    trace = json.loads((tmp_path / "t.json").read_text())
    assert any(e.get("name") == "step/backward" for e in trace["traceEvents"])
    paths = write_tables(result, tmp_path / "tables")
    rows = list(csv.DictReader(io.StringIO(Path(paths["top_csv"]).read_text())))
    assert len(rows) == 10 and rows[0]["name"] == top[0].name
    assert json.loads(Path(paths["top_json"]).read_text())[0]["name"] == top[0].name


def test_summary_flops_equal_flop_counter(mnist):
    model = build_model("cnn")
    x, y = normalise(mnist.train_images[:16]), mnist.train_labels[:16]
    summary = summarize_model(model, x, y)
    with FlopCounterMode(display=False) as counter:
        F.cross_entropy(model(x), y).backward()
    assert summary["flops"]["train_step"] == counter.get_total_flops()
    assert summary["flops"]["train_step_per_sample"] == 16_401_280  # 16.4 MFLOP, as REFERENCES.md states
    assert summary["total_params"] == 28_938
    layers = {layer["name"]: layer for layer in summary["layers"]}
    assert layers["conv1.0"]["output_shape"] == [-1, 16, 28, 28]
    assert layers["conv2.2"]["output_shape"] == [-1, 32, 7, 7]
    assert layers["conv2.0"]["forward_flops"] == 2 * 16 * 32 * 25 * 14 * 14 * 16
    assert sum(layer["forward_flops"] for layer in summary["layers"]) == summary["flops"]["forward"]
