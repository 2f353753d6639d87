"""The convolution four ways: correctness against torch, FLOP formulas, sampling, loop orders, CLI."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.flop_counter import FlopCounterMode

from dlscope.cli import main
from dlscope.errors import ConfigError
from dlscope.experiments.conv import (
    CONV_IMPLS,
    IMPLS,
    ConvShape,
    im2col,
    loop_order_experiment,
    model_conv_shapes,
    parse_perf_csv,
    random_conv,
    time_conv,
)
from dlscope.models import build_model


@st.composite
def conv_shapes(draw) -> ConvShape:
    r, s = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    padding = draw(st.integers(0, 2))
    h = draw(st.integers(max(1, r - 2 * padding), 9))
    w = draw(st.integers(max(1, s - 2 * padding), 9))
    return ConvShape(
        n=draw(st.integers(1, 2)),
        c=draw(st.integers(1, 3)),
        h=h,
        w=w,
        k=draw(st.integers(1, 3)),
        r=r,
        s=s,
        stride=draw(st.integers(1, 3)),
        padding=padding,
    )


@settings(max_examples=25, deadline=None)
@given(shape=conv_shapes(), seed=st.integers(0, 2**16))
def test_every_implementation_agrees_with_torch(shape: ConvShape, seed: int):
    x, w, b = random_conv(shape, seed)
    reference = F.conv2d(x, w, b, stride=shape.stride, padding=shape.padding)
    assert reference.shape == (shape.n, shape.k, shape.out_h, shape.out_w)
    for impl in IMPLS:
        out = CONV_IMPLS[impl](x, w, b, shape.stride, shape.padding)
        assert out.shape == reference.shape, impl
        assert (out - reference).abs().max() <= 1e-4, impl


def test_im2col_buffer_is_the_patch_matrix():
    shape = ConvShape(2, 3, 8, 6, 4, 3, 3, 2, 1)
    x, _, _ = random_conv(shape)
    cols = im2col(x, shape.r, shape.s, shape.stride, shape.padding)
    assert cols.shape == (shape.n * shape.out_h * shape.out_w, shape.c * shape.r * shape.s)
    assert cols.numel() * cols.element_size() == shape.im2col_bytes
    # row 0 is the top-left window: zero padding, then the image's corner
    assert cols[0].reshape(3, 3, 3)[:, 1:, 1:].equal(x[0, :, :2, :2])
    assert cols[0].reshape(3, 3, 3)[:, 0, :].abs().sum() == 0


@pytest.mark.parametrize(
    "shape",
    [
        ConvShape(4, 1, 28, 28, 16, 5, 5, 1, 2),
        ConvShape(4, 16, 14, 14, 32, 5, 5, 1, 2),
        ConvShape(2, 3, 11, 9, 5, 3, 2, 2, 1),
    ],
)
def test_flop_formulas_equal_flop_counter(shape: ConvShape):
    x, w, b = random_conv(shape)
    with FlopCounterMode(display=False) as forward:
        F.conv2d(x, w, b, stride=shape.stride, padding=shape.padding)
    assert forward.get_total_flops() == shape.flops
    for input_grad in (True, False):
        xg = x.clone().requires_grad_(input_grad)
        wg = w.clone().requires_grad_(True)
        out = F.conv2d(xg, wg, b, stride=shape.stride, padding=shape.padding)
        with FlopCounterMode(display=False) as backward:
            out.sum().backward()
        assert backward.get_total_flops() == shape.backward_flops(input_grad)


def test_timing_reports_error_throughput_and_share_of_peak():
    shape = ConvShape(1, 4, 10, 10, 8, 3, 3, 1, 1)
    timings = time_conv(shape, peak_gflops=100.0, repeats=3)
    assert [t.impl for t in timings] == list(IMPLS)
    for t in timings:
        assert t.max_abs_error <= 1e-4
        assert t.median_seconds > 0
        assert t.gflops == pytest.approx(shape.flops / t.median_seconds / 1e9)
        assert t.pct_of_peak == pytest.approx(t.gflops)  # peak 100 GFLOP/s
        assert t.sampled is None


def test_loops_run_on_a_sample_beyond_their_budget_and_refuse_hopeless_shapes():
    shape = ConvShape(3, 8, 16, 16, 6, 3, 3, 1, 1)  # ~100k multiply-adds ≈ 10 ms of Python
    (timing,) = time_conv(shape, ("loops",), loops_budget_s=0.004)
    assert timing.sampled is not None and timing.sampled["images"] == 1 and timing.sampled["of_images"] == 3
    assert timing.max_abs_error <= 1e-4
    with pytest.raises(ConfigError, match="would take"):
        time_conv(ConvShape(64, 256, 56, 56, 256, 3, 3, 1, 1), ("loops",), loops_budget_s=0.01)


def test_shape_validation():
    with pytest.raises(ConfigError, match="does not fit"):
        ConvShape(1, 1, 3, 3, 1, 5, 5)
    with pytest.raises(ConfigError, match="≥ 1"):
        ConvShape(0, 1, 3, 3, 1, 1, 1)


def test_model_conv_shapes_are_the_cnn_layers():
    shapes = model_conv_shapes(build_model("cnn"), 128)
    assert shapes == {
        "conv1.0": ConvShape(128, 1, 28, 28, 16, 5, 5, 1, 2),
        "conv2.0": ConvShape(128, 16, 14, 14, 32, 5, 5, 1, 2),
    }


@pytest.mark.skipif(shutil.which("gcc") is None and shutil.which("cc") is None, reason="needs a C compiler")
def test_loop_orders_compute_the_same_convolution():
    shape = ConvShape(2, 3, 20, 17, 4, 3, 3, 1, 1)
    result = loop_order_experiment(shape, repeats=1)
    assert [o["order"] for o in result["orders"]] == ["seed", "strided"]
    for o in result["orders"]:
        assert o["max_abs_error"] <= 1e-4
        assert o["median_seconds"] > 0
    assert result["orders"][0]["slowdown"] == 1.0


def test_perf_csv_parsing_keeps_counts_and_marks_unsupported_counters():
    # `perf stat -x,` writes value,unit,event,run-time,percentage,...
    text = "1234567,,cycles,1000000,100.00,,\n<not supported>,,cache-misses,0,100.00,,\n"
    assert parse_perf_csv(text) == {"cycles": 1234567, "cache-misses": None}


@pytest.mark.slow
def test_ops_conv_command_writes_results_and_report(tmp_path):
    out = tmp_path / "run"
    argv = ["ops", "conv", "--shape", "2,3,9,9", "--filters", "4,3,3", "--padding", "1", "--stride", "2"]
    argv += ["--loop-order-shape", "1,2,16,16,4,3,3", "--repeats", "2", "--out", str(out), "--no-progress"]
    assert main(argv) == 0
    results = json.loads((out / "results.json").read_text())
    section = results["sections"]["ops"]
    assert [t["impl"] for t in section["conv"]["timings"]] == list(IMPLS)
    assert all(t["max_abs_error"] <= 1e-4 for t in section["conv"]["timings"])
    assert section["conv"]["shape"]["stride"] == 2
    assert [layer["layer"] for layer in section["conv"]["model_layers"]] == ["conv1.0", "conv2.0"]
    report = (out / "report.html").read_text()
    assert "the convolution four ways" in report.lower() and "loop order" in report.lower()


@pytest.mark.parametrize(
    ("argv", "fault"),
    [
        (["--shape", "1,2,3"], "--shape N,C,H,W must be 4"),
        (["--filters", "4,9,9", "--shape", "1,1,4,4", "--padding", "0"], "does not fit"),
        (["--impl", "loops,fft"], "unknown implementation fft"),
        (["--loops-budget", "0"], "--loops-budget must be > 0"),
    ],
)
def test_ops_conv_bad_input_is_one_line_and_exit_2(tmp_path, capsys, argv, fault):
    out = tmp_path / "run"
    assert main(["ops", "conv", *argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("dlscope: error:") and fault in err and "\n" not in err
    assert not out.exists()


def test_seed_loops_match_torch_on_a_model_layer():
    """The seed's literal seven loops on the cnn's first layer for one image (~0.5 M multiply-adds)."""
    model = build_model("cnn")
    conv = model.conv1[0]
    x = torch.randn(1, 1, 28, 28)
    with torch.no_grad():
        reference = conv(x)
        out = CONV_IMPLS["loops"](x, conv.weight, conv.bias, 1, 2)
    assert (out - reference).abs().max() <= 1e-4


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_library_implementations_on_the_gpu_agree_with_the_cpu():
    shape = ConvShape(4, 16, 14, 14, 32, 5, 5, 1, 2)
    timings = time_conv(shape, ("im2col", "torch"), repeats=3, device="cuda")
    for t in timings:
        assert t.max_abs_error <= 1e-2  # cuDNN may use TF32 (10-bit mantissa) for float32 convolutions
        assert t.median_seconds > 0
