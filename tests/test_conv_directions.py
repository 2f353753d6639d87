"""Each convolution in its three directions, on each path: shapes, FLOPs, and the slow kernel named."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from dlscope.experiments.batch_device import conv_findings, slowest_conv
from dlscope.experiments.conv_directions import SLOW_RATE_RATIO, conv_directions, slow_kernels
from dlscope.models import CONV_PATHS, build_model
from dlscope.report.sections.sweep import WORDS
from dlscope.report.wording import worded


def test_every_layer_path_and_needed_direction_is_timed(mnist):
    from dlscope.data.loaders import normalise

    x = normalise(mnist.train_images[:16])
    rows = conv_directions(build_model("cnn"), x, repeats=2)
    seen = {(r["layer"], r["path"], r["direction"]) for r in rows}
    want = {("conv1", p, d) for p in CONV_PATHS for d in ("forward", "weight grad")}
    want |= {("conv2", p, d) for p in CONV_PATHS for d in ("forward", "input grad", "weight grad")}
    assert seen == want  # conv1 has no input gradient: its input is the images
    assert all(r["ms"] > 0 and r["gflops"] > 0 for r in rows)
    # a convolution's FLOPs as FlopCounterMode counts them, for the shape each layer really sees
    with FlopCounterMode(display=False) as counter:
        F.conv2d(torch.randn(16, 16, 14, 14), torch.randn(32, 16, 5, 5), padding=2)
    assert {r["flops"] for r in rows if r["layer"] == "conv2"} == {counter.get_total_flops()}


def row(layer, path, direction, gflops):
    return {"layer": layer, "path": path, "direction": direction, "gflops": gflops, "ms": 1.0, "shape": "s"}


def test_a_kernel_far_below_the_others_is_named_with_its_best_alternative():
    rows = [
        row("conv1", "onednn", "forward", 30.0),
        row("conv1", "onednn", "weight grad", 2.0),
        row("conv1", "onednn-cl", "weight grad", 25.0),
        row("conv1", "native", "weight grad", 4.0),
        row("conv2", "onednn", "forward", 50.0),
        row("conv2", "onednn", "input grad", 45.0),
        row("conv2", "onednn", "weight grad", 30.0),
    ]
    slow = slow_kernels(rows)
    assert [(s["layer"], s["direction"]) for s in slow] == [("conv1", "weight grad")]
    assert slow[0]["best_alternative"]["path"] == "onednn-cl"
    assert slow[0]["gflops"] < SLOW_RATE_RATIO * slow[0]["others_median_gflops"]
    sweep_row = {"config": "cpu/t1/b64", **slowest_conv(rows)}
    (finding,) = conv_findings([sweep_row])
    assert finding.values["at.slow_conv"] == "conv1 weight grad" and finding.values["at.slow_conv_gflops"] == 2.0
    assert (
        finding.values["at.slow_conv_best_path"] == "onednn-cl" and finding.values["at.slow_conv_best_gflops"] == 25.0
    )
    assert "onednn-cl" in worded([finding], WORDS).items[0][1]


def test_no_finding_when_the_kernels_run_at_similar_rates():
    rows = [row("conv1", "onednn", "forward", 20.0), row("conv1", "onednn", "weight grad", 15.0)]
    assert slow_kernels(rows) == [] and set(slowest_conv(rows).values()) == {None}
    assert conv_findings([{"config": "cpu/t1/b64", **slowest_conv(rows)}]) == []
