"""The framework's life cycle: forward graph, autograd graph, torch.compile's joint graph and code."""

from __future__ import annotations

import json
import subprocess
import xml.etree.ElementTree as ET

import pytest
import torch

from dlscope.cli import main
from dlscope.data.loaders import normalise
from dlscope.instruments.graph import (
    autograd_graph,
    compile_and_compare,
    forward_graph,
    loss_on_batch,
    parse_joint_graph,
)
from dlscope.models import build_model
from dlscope.report.graphs import have_dot, layers_of, python_svg, to_dot
from dlscope.report.sections.graph import code_excerpts


@pytest.fixture
def batch(mnist):
    return normalise(mnist.train_images[:8]), mnist.train_labels[:8]


def test_forward_graph_has_the_model_ops_with_shapes(batch):
    x, _ = batch
    graph = forward_graph(build_model("cnn"), x)
    labels = [n["label"] for n in graph["nodes"]]
    assert labels[0] == "input x\n8×1×28×28"
    assert labels[-1] == "output\n8×10"
    joined = "\n".join(labels)
    for op in ("Conv2d 1→16 5×5", "Conv2d 16→32 5×5", "ReLU", "MaxPool2d", "Linear 1568→10", "flatten"):
        assert op in joined
    assert "conv2.2: MaxPool2d 2\n8×32×7×7" in labels
    ids = {n["id"] for n in graph["nodes"]}
    assert all(src in ids and dst in ids for src, dst in graph["edges"])
    assert len(graph["edges"]) == len(graph["nodes"]) - 1  # a chain: every node feeds the next


def test_autograd_graph_has_backward_nodes_and_saved_tensors(batch):
    x, y = batch
    model = build_model("cnn")
    graph = autograd_graph(model, loss_on_batch(model, x, y))
    names = [n["name"] for n in graph["nodes"] if n["kind"] in ("backward", "accumulate")]
    for op in ("ConvolutionBackward0", "ReluBackward0", "MaxPool2DWithIndicesBackward0", "AddmmBackward0"):
        assert op in names
    assert names.count("ConvolutionBackward0") == 2
    assert names.count("AccumulateGrad") == len(list(model.parameters()))
    accumulate = "\n".join(n["label"] for n in graph["nodes"] if n["kind"] == "accumulate")
    for name, _ in model.named_parameters():
        assert name in accumulate
    relu_saved = [s for n in graph["nodes"] if n["name"] == "ReluBackward0" for s in n["saved"]]
    assert {"name": "result", "shape": [8, 16, 28, 28], "dtype": "f32", "bytes": 8 * 16 * 28 * 28 * 4} in relu_saved
    # each pool saves the ReLU output its ReLU saved, the loss saves the log-softmax result: counted once
    assert graph["saved_bytes"] - graph["saved_distinct_bytes"] == 4 * 8 * (16 * 28 * 28 + 32 * 14 * 14 + 10)
    # every edge joins known nodes, and gradients flow away from the loss
    ids = {n["id"] for n in graph["nodes"]}
    assert all(e[0] in ids and e[1] in ids for e in graph["edges"])
    assert layers_of(graph)[graph["nodes"][0]["id"]] >= 1  # the loss's node is fed by its saved tensors


def test_graphs_render_to_svg_with_and_without_graphviz(batch):
    x, y = batch
    model = build_model("cnn")
    graph = autograd_graph(model, loss_on_batch(model, x, y))
    svg = ET.fromstring(python_svg(graph))
    rects = svg.findall("{http://www.w3.org/2000/svg}rect")
    assert len(rects) == len(graph["nodes"])
    assert len(svg.findall("{http://www.w3.org/2000/svg}line")) == len(graph["edges"])
    dot = to_dot(graph)
    assert dot.count("->") == len(graph["edges"])
    if have_dot():
        done = subprocess.run(["dot", "-Tsvg"], input=dot, capture_output=True, text=True, check=True)
        assert "ConvolutionBackward0" in done.stdout


def test_parse_joint_graph_reads_nodes_and_edges():
    text = """class inner_f(torch.nn.Module):
    def forward(self, primals, tangents):
        primals_1: "f32[4, 3][3, 1]cpu"; tangents_1: "f32[4][1]cpu";
        primals_1, tangents_1, = fx_pytree.tree_flatten_spec([primals, tangents], self._in_spec)
        relu: "f32[4, 3][3, 1]cpu" = torch.ops.aten.relu.default(primals_1);  primals_1 = None
        sum_1: "f32[4][1]cpu" = torch.ops.aten.sum.dim_IntList(relu, [1])
        le: "b8[4, 3][3, 1]cpu" = torch.ops.aten.le.Scalar(relu, 0);  relu = None
        return pytree.tree_unflatten([sum_1, le, tangents_1], self._out_spec)
"""
    graph = parse_joint_graph(text)
    ops = {n["id"]: n["op"] for n in graph["nodes"]}
    assert ops == {
        "primals_1": "input",
        "tangents_1": "input",
        "relu": "relu",
        "sum_1": "sum.dim_IntList",
        "le": "le.Scalar",
        "return": "output",
    }
    assert ["primals_1", "relu"] in graph["edges"] and ["relu", "le"] in graph["edges"]
    assert ["sum_1", "return"] in graph["edges"] and ["tangents_1", "return"] in graph["edges"]


@pytest.mark.slow
def test_compile_captures_joint_graph_and_generated_code(batch):
    x, y = batch
    result = compile_and_compare(build_model("cnn"), lambda m: torch.optim.Adam(m.parameters()), x, y, repeats=3)
    assert result["cache"] == "cold"
    assert set(result["generated_code"]) == {"forward", "backward"}
    assert all(code.strip() for code in result["generated_code"].values())
    assert result["kernels"] and all(k.startswith("cpp_fused_") for k in result["kernels"])
    assert 'extern "C"' in result["generated_code"]["forward"]  # the C++ source Inductor compiles
    excerpts = code_excerpts(result["generated_code"]["backward"])
    assert excerpts["kernel"].startswith("cpp_fused_") and "kernel(" in excerpts["kernel"]
    assert excerpts["schedule"].startswith("def call(") and "aten.convolution_backward" in excerpts["schedule"]
    ops = {n["op"] for n in result["joint_graph"]["nodes"]}
    assert {"convolution", "relu", "convolution_backward", "mm"} <= ops
    assert result["compile_seconds"] > 0 and result["step_ms"]["eager"] > 0 and result["step_ms"]["compiled"] > 0


@pytest.mark.slow
def test_graph_command_without_compile_embeds_svgs(tmp_path):
    out = tmp_path / "run"
    argv = ["graph", "--no-compile", "--batch-size", "4", "--out", str(out), "--no-progress"]
    assert main(argv) == 0
    section = json.loads((out / "results.json").read_text())["sections"]["graph"]
    assert "compiled" not in section
    assert (out / section["files"]["forward"]).read_text().startswith("def forward")
    html = (out / "report.html").read_text()
    assert html.count("<svg") >= 2 and "dlscope graph" in html
    assert (out / "figures" / "graph_autograd.svg").exists()


def test_graph_bad_repeats_is_one_line(tmp_path, capsys):
    assert main(["graph", "--repeats", "0", "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("dlscope: error: ") and "--repeats" in err and "≥ 1" in err and "\n" not in err, err
    assert not (tmp_path / "r").exists()
