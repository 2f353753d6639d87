"""FLOPs by dtype (injob/flops.py), MFU arithmetic, and matmul peaks per dtype
(measure/peaks.py), on real torch ops on the CPU."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from dlscope.analysis.gpu import mfu
from dlscope.injob.flops import StepFlops
from dlscope.measure.peaks import matmul_peaks, measure_gemm_peak, tf32_enabled

BATCH, IN, OUT = 16, 64, 32
LINEAR_FLOPS = 3 * 2 * BATCH * IN * OUT  # forward, then the input's and the weight's gradients


def linear_step(model: torch.nn.Module) -> None:
    x = torch.randn(BATCH, IN, requires_grad=True)  # its gradient is the third product
    model(x).sum().backward()


def test_float32_step_counts_three_products_under_float32() -> None:
    model = torch.nn.Linear(IN, OUT)
    counter = StepFlops()
    assert counter.start()
    linear_step(model)
    result = counter.stop()
    assert result["by_dtype"] == {"float32": LINEAR_FLOPS}
    assert result["flops"] == LINEAR_FLOPS
    assert "error" not in result


def test_autocast_step_counts_under_bfloat16() -> None:
    model = torch.nn.Linear(IN, OUT)
    counter = StepFlops()
    counter.start()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        x = torch.randn(BATCH, IN, requires_grad=True)
        loss = model(x).float().sum()
    loss.backward()
    assert counter.stop()["by_dtype"] == {"bfloat16": LINEAR_FLOPS}


def test_start_and_stop_in_separate_calls_and_nothing_after() -> None:
    model = torch.nn.Linear(IN, OUT)
    counter = StepFlops()

    def step_end() -> None:  # start and stop from different frames, as the step machine does
        counter.start()

    def next_step_end() -> dict:
        return counter.stop()

    step_end()
    linear_step(model)
    linear_step(model)
    assert next_step_end()["by_dtype"] == {"float32": 2 * LINEAR_FLOPS}
    # the mode is gone: nothing more is counted, a second stop says so
    assert torch.utils._python_dispatch._get_current_dispatch_mode() is None
    linear_step(model)
    assert counter.stop()["by_dtype"] == {}


def test_stop_without_start_is_empty() -> None:
    assert StepFlops().stop() == {"by_dtype": {}, "flops": 0}


def test_a_failing_formula_is_reported_not_raised() -> None:
    counter = StepFlops()
    counter.start()
    counter._counter.flop_registry = {torch.ops.aten.mm: lambda *a, **k: 1 / 0}
    y = torch.randn(4, 8) @ torch.randn(8, 2)  # the script's op still runs
    result = counter.stop()
    assert y.shape == (4, 2)
    assert result["by_dtype"] == {} and "ZeroDivisionError" in result["error"]


def test_a_mode_entered_after_start_is_left_in_place_then_released_once_it_exits() -> None:
    from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode, _pop_mode

    class Passthrough(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    model = torch.nn.Linear(IN, OUT, bias=False)
    counter = StepFlops()
    counter.start()
    try:
        with Passthrough() as theirs:
            linear_step(model)  # through theirs, then ours: counted
            result = counter.stop()
            assert _get_current_dispatch_mode() is theirs and counter.stuck
            assert not counter.release()  # theirs still above ours
            linear_step(model)
        assert result["flops"] == LINEAR_FLOPS and "another torch dispatch mode" in result["error"]
        assert counter.release() and not counter.stuck and _get_current_dispatch_mode() is None
        assert counter.release()  # nothing left to do
    finally:  # on any failure above: ours taken off, or every later test counts
        while _get_current_dispatch_mode() is not None:
            _pop_mode()


def test_importing_flops_does_not_import_torch() -> None:
    code = "import sys, dlscope.injob.flops; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_mfu_arithmetic() -> None:
    flops = {"bfloat16": 6 * 10**12, "float32": 10**12}
    peaks = {"bfloat16": 600e12, "float32": 50e12, "float16": 600e12}
    result = mfu(flops, 0.06, peaks)
    assert result["ideal_seconds"] == pytest.approx(0.01 + 0.02)
    assert result["mfu"] == pytest.approx(0.03 / 0.06)
    assert result["achieved_flops_per_s"] == pytest.approx(7e12 / 0.06)
    assert result["flops_per_step"] == 7 * 10**12
    assert result["no_peak"] == []


def test_mfu_without_a_peak_for_a_counted_dtype() -> None:
    result = mfu({"tf32": 10**9, "bfloat16": 10**9, "float16": 0}, 0.01, {"bfloat16": 1e12, "float32": 1e12})
    assert result["mfu"] is None and result["ideal_seconds"] is None
    assert result["no_peak"] == ["tf32"] and result["reason"] == "no_peak"
    assert result["achieved_flops_per_s"] == pytest.approx(2e11)


def test_mfu_without_flops_or_step_time() -> None:
    assert mfu({}, 0.01, {"float32": 1e12})["mfu"] is None
    assert mfu({"float32": 10**9}, 0.0, {"float32": 1e12})["reason"] == "no_step_time"


def matmul_settings() -> tuple:
    matmul = torch.backends.cuda.matmul
    return matmul.fp32_precision, matmul.allow_tf32, torch.get_float32_matmul_precision()


@pytest.mark.parametrize("precision", ["highest", "high"])
def test_matmul_peaks_on_cpu_and_settings_kept(precision: str) -> None:
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(precision)
    try:
        before = matmul_settings()
        peaks = matmul_peaks("cpu")
        assert matmul_settings() == before
    finally:
        torch.set_float32_matmul_precision(previous)
    assert peaks["float32"] > 0  # on the CPU, float32 is float32 whatever cuBLAS's TF32 setting
    assert all(value > 0 for value in peaks.values())
    assert set(peaks) <= {"float32", "bfloat16", "float16"}


def test_matmul_peaks_leaves_out_what_it_cannot_time() -> None:
    peaks = matmul_peaks("cpu", dtypes=("float32", "tf32", "float8_e4m3fn", "complex64", "nonsense"), n=64)
    assert list(peaks) == ["float32"]


def test_measure_gemm_peak_still_works() -> None:
    peak = measure_gemm_peak("cpu", n=128, repeats=2)
    assert peak.value > 0 and peak.best_seconds > 0


def test_tf32_setting_read_through_either_api() -> None:
    matmul = torch.backends.cuda.matmul
    before = matmul.fp32_precision
    try:
        matmul.fp32_precision = "tf32"
        assert tf32_enabled("matmul")
        matmul.fp32_precision = "ieee"
        assert not tf32_enabled("matmul")
    finally:
        matmul.fp32_precision = before
    assert matmul_settings()[0] == before
