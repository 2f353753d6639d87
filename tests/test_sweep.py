"""The batch size × device sweep: rows, timing discipline, FLOPs, bytes, peaks, shift, findings, CLI."""

from __future__ import annotations

import csv
import json
import statistics
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from dlscope.cli import main
from dlscope.data.loaders import normalise
from dlscope.experiments.batch_device import (
    TABLE_FIELDS,
    ByteCounterMode,
    PointRun,
    SweepPoint,
    SweepSettings,
    best_peaks,
    diagnose,
    is_compute_kernel,
    operator_shift,
    run_batch_device_sweep,
    sweep_grid,
)
from dlscope.models import build_model
from dlscope.report.blocks import Figure, Findings, Table
from dlscope.report.sections.sweep import WORDS, render, shift_change
from dlscope.report.wording import worded

# One thread: on a shared 2-core machine a 2-thread parallel region waits for its slowest thread,
# which makes every timing hostage to the neighbours; one thread keeps the comparisons meaningful.
SETTINGS = SweepSettings(steps=12, warmup=2, profile_steps=2, rounds=3)


@pytest.fixture(scope="module")
def batches(mnist):
    return normalise(mnist.train_images[:256]), mnist.train_labels[:256]


@pytest.fixture(scope="module")
def sweep(batches):
    images, labels = batches
    points = sweep_grid([1, 64], ["cpu"], [1])
    phases = []
    result = run_batch_device_sweep(points, SETTINGS, images, labels, (512, 16), lambda p, phase: phases.append(phase))
    result["phases"] = phases
    return result


def test_a_row_for_every_requested_configuration(sweep):
    assert [r["config"] for r in sweep["rows"]] == ["cpu/t1/b1", "cpu/t1/b64"]
    for row in sweep["rows"]:
        optional = ("h2d_", "slow_conv", "conv_median")  # GPU transfers; a slow convolution only when there is one
        missing = [f for f in TABLE_FIELDS if row[f] is None and not f.startswith(optional) and f != "cudnn_benchmark"]
        assert not missing, f"{row['config']} lacks {missing}"
        assert row["timed_steps"] == SETTINGS.steps
        assert row["ops_per_step"] > 100  # a cnn training step is a few hundred aten calls
        assert 0 < row["kernel_pct"] <= 100
        assert row["kernel_pct"] + row["overhead_pct"] == pytest.approx(100)
        assert len(row["top10"]) == 10
        assert row["step_memory_bytes"] > 0
    assert len(sweep["phases"]) == 2 * 2 + SETTINGS.rounds + 3  # and the convolutions by direction
    assert {d["layer"] for d in sweep["conv_directions"]} == {"conv1", "conv2"}


def test_batch_one_trains_fewer_samples_per_second_than_batch_64(sweep):
    b1, b64 = sweep["rows"]
    assert b1["samples_per_s"] < b64["samples_per_s"]
    assert b1["per_sample_us"] > b64["per_sample_us"]
    # the same operators carry 64× the samples: batch 1 spends a larger share outside kernels
    assert b1["overhead_pct"] > b64["overhead_pct"]


def test_cold_step_is_timed_apart_from_the_warm_ones(batches):
    images, labels = batches
    run = PointRun(SweepPoint("cpu", 8, 1), SweepSettings(steps=4, warmup=3), images, labels)
    run.timed.start()
    run.timed.warm(3)
    # neither the cold step nor the warm-up is counted among the timed steps
    assert run.timed.cold_s > 0 and len(run.timed.warm_times) == 3 and run.timed.times == []
    run.timed.time(4)
    assert len(run.timed.times) == 4
    row = run.finish({"gemm_gflops": 100.0, "copy_gbps": 10.0})
    assert row["cold_step_ms"] == pytest.approx(run.timed.cold_s * 1e3)
    assert row["cold_ratio"] == pytest.approx(run.timed.cold_s / statistics.median(run.timed.times))
    assert row["warmup_steps"] == 3 and row["timed_steps"] == 4


def test_flops_equal_flop_counter_mode(sweep, batches):
    images, labels = batches
    for row in sweep["rows"]:
        b = row["batch_size"]
        model = build_model("cnn")
        with FlopCounterMode(display=False) as counter:
            F.cross_entropy(model(images[:b]), labels[:b]).backward()
        assert row["flops_per_step"] == counter.get_total_flops()
    assert sweep["rows"][1]["flops_per_step"] == 64 * sweep["rows"][0]["flops_per_step"]


def test_best_peaks_keep_the_higher_of_two_measurements():
    low = {"cpu": {"gemm_gflops": 50.0, "copy_gbps": 12.0, "gemm": {"n": 1}, "copy": {"n": 1}}}
    high = {"cpu": {"gemm_gflops": 150.0, "copy_gbps": 9.0, "gemm": {"n": 2}, "copy": {"n": 2}}}
    best = best_peaks(low, high)["cpu"]
    assert (best["gemm_gflops"], best["gemm"], best["copy_gbps"], best["copy"]) == (150.0, {"n": 2}, 12.0, {"n": 1})


def test_measured_peaks_are_positive(sweep):
    peak = sweep["peaks"]["cpu"]
    assert peak["gemm_gflops"] > 0 and peak["copy_gbps"] > 0
    for row in sweep["rows"]:
        assert row["pct_of_peak"] == pytest.approx(100 * row["achieved_gflops"] / peak["gemm_gflops"])
        assert row["ridge_intensity"] == pytest.approx(peak["gemm_gflops"] / peak["copy_gbps"])


def test_every_number_a_finding_cites_is_in_the_table(sweep):
    assert sweep["findings"]
    rows = {r["config"]: r for r in sweep["rows"]}
    for finding in sweep["findings"]:
        cited = {k: v for k, v in finding["values"].items() if "." in k}
        assert cited, finding
        for name, value in cited.items():
            role, metric = name.split(".")
            assert rows[cited[f"{role}.config"]][metric] == value
            if isinstance(value, float):
                assert metric in TABLE_FIELDS
    # each is worded from its values alone, and quotes the names it cites
    for finding, (_, text) in zip(sweep["findings"], worded(sweep["findings"], WORDS).items, strict=True):
        quoted = [v for k, v in finding["values"].items() if isinstance(v, str) and not k.endswith(".config")]
        assert all(v in text for v in quoted), (finding, text)


def test_byte_counter_counts_operands_and_results_but_not_views():
    a, b = torch.randn(64, 32), torch.randn(32, 16)
    with ByteCounterMode() as counter:
        a.view(32, 64)
        a.t()
    assert counter.bytes == 0
    with ByteCounterMode() as counter:
        torch.mm(a, b)
    assert counter.bytes == (64 * 32 + 32 * 16 + 64 * 16) * 4


def test_compute_kernels_exclude_views_allocations_and_wrappers():
    for name in ("aten::addmm", "aten::mkldnn_convolution", "aten::max_pool2d_with_indices", "aten::clamp_min"):
        assert is_compute_kernel(name), name
    for name in ("aten::view", "aten::t", "aten::empty", "aten::linear", "aten::conv2d", "aten::relu", "Optimizer.x"):
        assert not is_compute_kernel(name), name


def _row(config, batch, samples_per_s, kernels, device="cpu", **extra):
    row = {
        "config": config,
        "series": config.rsplit("/", 1)[0],
        "device": device,
        "device_type": device,
        "batch_size": batch,
        "samples_per_s": samples_per_s,
        "step_p50_ms": 1000 * batch / samples_per_s,
        "step_p95_ms": 1100 * batch / samples_per_s,
        "cold_step_ms": 50.0,
        "cold_ratio": 50.0 * samples_per_s / (1000 * batch),
        "kernel_pct": 30.0,
        "overhead_pct": 70.0,
        "ops_per_step": 270.0,
        "overhead_us_per_op": 5.0,
        "achieved_gflops": 10.0,
        "pct_of_peak": 5.0,
        "peak_gflops": 200.0,
        "intensity": 20.0,
        "ridge_intensity": 10.0,
        "top_kernel": next(iter(kernels)),
        "top_kernel_pct": 40.0,
        "non_gemm_kernel_pct": 10.0,
        "top_non_gemm_kernel": "aten::max_pool2d_with_indices",
        "top_non_gemm_kernel_pct": 6.0,
        "conv_kernels": sorted(k for k in kernels if "conv" in k),
        "kernels_us": kernels,
        "cudnn_benchmark": None,
    }
    return {**row, **extra}


def test_operator_shift_names_kernels_that_appear_vanish_or_move():
    rows = [
        _row("cpu/t1/b1", 1, 500.0, {"aten::_slow_conv2d_forward": 50.0, "aten::addmm": 10.0}),
        _row(
            "cpu/t1/b64",
            64,
            9000.0,
            {"aten::mkldnn_convolution": 900.0, "aten::max_pool2d": 500.0, "aten::addmm": 20.0},
        ),
    ]
    shift = {s["operator"]: s for s in operator_shift(rows)}
    assert shift["aten::_slow_conv2d_forward"]["ranks"] == {"cpu/t1/b1": 1, "cpu/t1/b64": None}
    assert shift["aten::mkldnn_convolution"]["ranks"] == {"cpu/t1/b1": None, "cpu/t1/b64": 1}
    assert shift["aten::addmm"]["ranks"] == {"cpu/t1/b1": 2, "cpu/t1/b64": 3}
    # the report's change column: the configurations a kernel is only in, or its range of ranks
    assert "cpu/t1/b1" in shift_change(shift["aten::_slow_conv2d_forward"]["ranks"])
    assert "2–3" in shift_change(shift["aten::addmm"]["ranks"])


def test_diagnosis_explains_a_gpu_slower_than_the_cpu_and_overhead_bound_steps():
    rows = [
        _row("cpu/t2/b1", 1, 1200.0, {"aten::_slow_conv2d_forward": 50.0}),
        _row("cpu/t2/b64", 64, 9000.0, {"aten::mkldnn_convolution": 900.0}, overhead_pct=10.0, kernel_pct=90.0),
        _row("cuda/bench-off/b1", 1, 600.0, {"aten::cudnn_convolution": 5.0}, device="cuda", kernel_pct=8.0),
    ]
    findings = {f.key: f for f in diagnose(rows)}
    slower = findings["sweep.gpu_slower"]
    assert slower.level == "warn"
    assert (slower.values["gpu.config"], slower.values["cpu.config"]) == ("cuda/bench-off/b1", "cpu/t2/b1")
    assert slower.values["gpu.kernel_pct"] == 8.0
    (bound,) = [f for f in diagnose(rows) if f.key == "sweep.overhead" and f.values["series"] == "cpu/t2"]
    assert bound.level == "bad" and bound.values["at.config"] == "cpu/t2/b1" and bound.values["at.overhead_pct"] == 70
    change = findings["sweep.conv_kernel_change"].values
    assert (change["small.conv_kernels"], change["large.conv_kernels"]) == (
        ["aten::_slow_conv2d_forward"],
        ["aten::mkldnn_convolution"],
    )
    assert "slower" in worded([slower], WORDS).items[0][1]


def test_diagnosis_compares_cudnn_autotuning_on_and_off():
    off = _row(
        "cuda/bench-off/b64", 64, 90000.0, {"aten::cudnn_convolution": 50.0}, device="cuda", cudnn_benchmark=False
    )
    on = _row("cuda/bench-on/b64", 64, 95000.0, {"aten::cudnn_convolution": 45.0}, device="cuda", cudnn_benchmark=True)
    on["cold_step_ms"] = 900.0
    (finding,) = [f for f in diagnose([off, on]) if f.key == "sweep.cudnn_benchmark"]
    assert (finding.values["on.config"], finding.values["on.cold_step_ms"]) == ("cuda/bench-on/b64", 900.0)
    assert (finding.values["off.config"], finding.values["off.cold_step_ms"]) == ("cuda/bench-off/b64", 50.0)


def test_render_builds_tables_and_three_figures_from_the_section(sweep):
    section = {**sweep, "csv": "sweep/sweep.csv"}
    section = json.loads(json.dumps(section))  # the report renders from results.json alone
    blocks = render(section)
    figures = [b for b in blocks if isinstance(b, Figure)]
    assert [f.name for f in figures] == ["sweep_throughput", "sweep_shares", "sweep_roofline"]
    assert all(f.png.startswith(b"\x89PNG") for f in figures)
    main = next(b for b in blocks if isinstance(b, Table))
    assert [row[0] for row in main.rows] == ["cpu/t1/b1", "cpu/t1/b64"]
    assert any(isinstance(b, Findings) and b.items for b in blocks)


def test_grid_rejects_bad_configurations():
    from dlscope.errors import ConfigError

    with pytest.raises(ConfigError):
        sweep_grid([0], ["cpu"], [1])
    with pytest.raises(ConfigError):
        sweep_grid([1], ["tpu"], [1])
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="no CUDA GPU"):
            sweep_grid([1], ["cuda"], [1])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_points_sync_with_events_and_report_allocator_memory(batches):
    images, labels = batches
    points = sweep_grid([1, 64], ["cpu", "cuda"], [1], [False, True])
    result = run_batch_device_sweep(points, SETTINGS, images, labels, (1024, 64))
    gpu = [r for r in result["rows"] if r["device_type"] == "cuda"]
    assert [r["config"] for r in gpu] == [
        "cuda/bench-off/b1",
        "cuda/bench-off/b64",
        "cuda/bench-on/b1",
        "cuda/bench-on/b64",
    ]
    assert not torch.backends.cudnn.benchmark  # restored after the sweep
    for row in gpu:
        assert row["step_memory_bytes"] > 0 and row["memory_source"] == "torch.cuda.max_memory_allocated"
        assert row["h2d_pinned_us"] > 0 and row["h2d_pageable_us"] > 0
        assert any(t["self_device_us"] > 0 for t in row["top10"])
    assert any(f["key"] in ("sweep.gpu_slower", "sweep.gpu_faster") for f in result["findings"])


@pytest.mark.slow
def test_cli_sweep_writes_table_csv_results_and_report(tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "dlscope.cli", "sweep", "--batch-sizes", "1,16", "--threads", "1", "--steps", "6"]
    cmd += ["--warmup", "1", "--rounds", "2", "--profile-steps", "1", "--out", str(out), "--no-progress"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "cpu/t1/b16" in proc.stdout and "samples/s" in proc.stdout
    results = json.loads((out / "results.json").read_text())
    section = results["sections"]["sweep"]
    assert [r["config"] for r in section["rows"]] == ["cpu/t1/b1", "cpu/t1/b16"]
    # a fresh process: the first step of the first configuration pays for lazy initialisation
    assert section["rows"][0]["cold_ratio"] > 1
    with open(out / section["csv"]) as f:
        records = list(csv.DictReader(f))
    assert [r["config"] for r in records] == ["cpu/t1/b1", "cpu/t1/b16"]
    assert list(records[0]) == list(TABLE_FIELDS)
    html = (out / "report.html").read_text()
    assert "measured roofline" in html and html.count("data:image/png;base64") >= 3
    assert (out / "figures" / "sweep_roofline.png").is_file()


def test_cli_sweep_rejects_bad_input_in_one_line_without_a_run_directory(tmp_path, capsys):
    out = tmp_path / "run"
    for bad in (["--batch-sizes", "1,x"], ["--steps", "1"], ["--devices", "tpu"], ["--cudnn-benchmark", "maybe"]):
        try:
            code = main(["sweep", *bad, "--out", str(out)])
        except SystemExit as e:  # argparse's own errors
            code = e.code
        assert code == 2, bad
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "error" in err, err
        assert not out.exists()
