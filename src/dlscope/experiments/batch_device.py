"""Batch size × device sweep: what a training step costs, where the time goes, and why (lab steps 6–7).

For every configuration (device, threads, cuDNN autotuning, batch size) on a freshly built model:

    cold step        the very first training step, timed on its own (lazy init, kernel selection)
    warm-up steps    run and thrown away
    timed steps      N training steps (forward, backward, optimizer), each synchronised:
                     CUDA events on a GPU, perf_counter on the CPU; taken in rounds that
                     interleave all configurations, so a noisy neighbour hits them alike
    profiled steps   torch.profiler over a few more steps: top-10, operators per step, the time
                     inside compute kernels (the rest of the step is framework overhead)
    counted step     one step under FlopCounterMode (FLOPs) and a byte-counting dispatch mode
                     (bytes each operator reads and writes) → arithmetic intensity for a roofline

The device's peaks (a large GEMM, a large copy) are measured in the same run, so "% of peak" is
relative to what this machine actually does. Findings (dlscope.findings) are drawn from stated
thresholds and cite the exact row values they rest on (`role.metric`, with `role.config` the row);
report.sections.sweep words them.
"""

from __future__ import annotations

import contextlib
import csv
import functools
import io
import statistics
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from dlscope.analysis.optable import TopOpsTable, table_from_events
from dlscope.errors import ConfigError
from dlscope.experiments.conv_directions import SLOW_RATE_RATIO, conv_directions, slow_kernels
from dlscope.findings import Finding, Level
from dlscope.instruments.profiler import clone_for_profiling
from dlscope.instruments.summary import count_flops
from dlscope.measure.memory import SOURCE as MEMORY_SOURCE
from dlscope.measure.memory import allocation_peak, profile_allocation_peak
from dlscope.measure.native_stderr import quiet_native_stderr
from dlscope.measure.peaks import measure_copy_bandwidth, measure_gemm_peak
from dlscope.measure.stats import percentile
from dlscope.measure.timing import Contender, StepTimer, time_interleaved
from dlscope.models import build_model
from dlscope.train import TrainConfig, make_optimizer, seed_everything, train_step

# Thresholds behind the findings (percent or ratios), stated once so the report can quote them.
OVERHEAD_BOUND_PCT = 50.0  # more than half the step outside compute kernels: overhead-bound
OVERHEAD_MODERATE_PCT = 20.0
COLD_RATIO_WARN = 5.0  # a first step this many times a warm one is worth a warning
TOP_KERNEL_PCT = 20.0  # one kernel taking this share of kernel time is worth naming
NOISY_P95_RATIO = 3.0  # p95 this many times p50: something else competes for the device
NON_GEMM_PCT = 30.0  # kernel time outside convolutions and matmuls worth pointing at
GEMM_KERNELS = ("conv", "addmm", "aten::mm", "aten::bmm", "matmul")  # name fragments of the FLOP-heavy kernels
SHIFT_TOP_N = 10

# Operators that do no arithmetic on tensor data: views, allocation, metadata, scalar reads and thin
# dispatch wrappers (whose work is done by the operator they call). Their self time is framework
# overhead. CompositeImplicitAutograd operators (aten::linear, aten::conv2d …) and views are
# recognised from the dispatcher; this set names the rest.
FRAMEWORK_OPS = frozenset(
    {
        "aten::empty",
        "aten::empty_like",
        "aten::empty_strided",
        "aten::resize_",
        "aten::as_strided_",
        "aten::set_",
        "aten::item",
        "aten::_local_scalar_dense",
        "aten::resolve_conj",
        "aten::resolve_neg",
        "aten::lift_fresh",
        "aten::result_type",
        "aten::to",
        "aten::convolution",
        "aten::_convolution",
        "aten::relu",  # calls aten::clamp_min (CPU) / a TensorIterator kernel counted under it
    }
)


@functools.cache
def is_compute_kernel(name: str) -> bool:
    """True for an aten operator whose self time is arithmetic on tensor data (see FRAMEWORK_OPS)."""
    if not name.startswith("aten::") or name in FRAMEWORK_OPS:
        return False
    packet = getattr(torch.ops.aten, name.removeprefix("aten::"), None)
    if packet is None:
        return True
    overloads = [getattr(packet, o) for o in packet.overloads()]
    if any(op.is_view for op in overloads):
        return False
    # the functional overload is what a training step calls (aten::linear.out has its own kernel)
    main = getattr(packet, "default", None) or overloads[0]
    try:
        return not main.has_kernel_for_dispatch_key(torch._C.DispatchKey.CompositeImplicitAutograd)
    except RuntimeError:  # an overload the dispatcher does not know (aten::to.prim_Device …)
        return True


@dataclass(frozen=True)
class SweepPoint:
    """One configuration of the grid."""

    device: str
    batch_size: int
    threads: int
    cudnn_benchmark: bool | None = None  # CUDA only

    @property
    def key(self) -> str:
        """A short, unique label: cpu/t2/b16, cuda/bench-on/b64."""
        if self.device.startswith("cuda"):
            return f"{self.device}/bench-{'on' if self.cudnn_benchmark else 'off'}/b{self.batch_size}"
        return f"{self.device}/t{self.threads}/b{self.batch_size}"

    @property
    def series(self) -> str:
        """The configuration without its batch size: one line on a throughput plot."""
        return self.key.rsplit("/", 1)[0]


def available_devices() -> list[str]:
    return ["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"]


def sweep_grid(
    batch_sizes: Sequence[int],
    devices: Sequence[str],
    threads: Sequence[int],
    cudnn_benchmark: Sequence[bool] = (False, True),
) -> list[SweepPoint]:
    """Every combination: CPU points vary threads, CUDA points vary cuDNN autotuning."""
    if not batch_sizes or any(b < 1 for b in batch_sizes):
        raise ConfigError("batch sizes must be ≥ 1")
    if not threads or any(t < 1 for t in threads):
        raise ConfigError("threads must be ≥ 1")
    points = []
    for device in devices:
        if device.startswith("cuda"):
            if not torch.cuda.is_available():
                raise ConfigError(f"device {device} requested but torch sees no CUDA GPU")
            points += [
                SweepPoint(device, b, torch.get_num_threads(), bench) for bench in cudnn_benchmark for b in batch_sizes
            ]
        elif device == "cpu":
            points += [SweepPoint("cpu", b, t) for t in threads for b in batch_sizes]
        else:
            raise ConfigError(f"unknown device {device!r}; the sweep knows cpu and cuda[:N]")
    return points


class ByteCounterMode(TorchDispatchMode):
    """Bytes every compute operator reads (its tensor inputs) and writes (its outputs).

    Eager mode runs one operator at a time, each reading its operands from memory and writing its
    result back, so this is the traffic of an unfused step (caches aside) — the denominator of
    its arithmetic intensity. Views, allocations and wrappers move no data and are skipped.
    """

    def __init__(self) -> None:
        super().__init__()
        self.bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if is_compute_kernel(func.name().split(".")[0]):
            leaves, _ = tree_flatten((args, kwargs, out))
            self.bytes += sum(t.numel() * t.element_size() for t in leaves if isinstance(t, torch.Tensor))
        return out


def count_step_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> int:
    """Bytes moved by one whole training step (forward, backward, optimizer) on copies of both."""
    model, optimizer = clone_for_profiling(model, optimizer)
    with ByteCounterMode() as counter:
        train_step(model, optimizer, x, y)
    return counter.bytes


def transfer_us(batch: torch.Tensor, device: torch.device, pinned: bool, repeats: int = 10) -> float:
    """Median µs to copy one input batch host → device, from pinned or pageable host memory."""
    host = batch.cpu().pin_memory() if pinned else batch.cpu().clone()
    timer = StepTimer(device)
    times = timer.time_steps(lambda: host.to(device, non_blocking=pinned), repeats)
    return statistics.median(times) * 1e6


def kernel_times_us(table: TopOpsTable, device: torch.device) -> dict[str, float]:
    """µs per step of every compute kernel: self device time on a GPU, self CPU time on the CPU."""
    steps = max(table.steps, 1)
    if device.type == "cuda":
        return {r.name: r.self_device_us / steps for r in table.rows if r.self_device_us > 0}
    return {r.name: r.self_cpu_us / steps for r in table.rows if is_compute_kernel(r.name)}


def cuda_step_memory(step: Callable[[], object], device: torch.device) -> int:
    """The allocator's peak during one step above what stays allocated between steps (measured
    alone: the peak counter is per device, and the sweep interleaves configurations)."""
    with allocation_peak(device) as recorded:
        step()
    return recorded["peak_bytes"]


def profile_steps(step: Callable[[], object], timer: StepTimer, steps: int) -> tuple[TopOpsTable, float, int | None]:
    """Operators of `steps` profiled steps, their wall seconds, and on the CPU their allocation peak (bytes)."""
    device = timer.device
    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    on_cpu = device.type == "cpu"
    with quiet_native_stderr(), profile(activities=activities, profile_memory=on_cpu) as prof:
        seconds = sum(timer.time_steps(step, steps))
    peak = profile_allocation_peak(prof) if on_cpu else None
    return table_from_events(prof.key_averages(), steps), seconds, peak


@dataclass
class SweepSettings:
    model: str = "cnn"
    steps: int = 30  # timed steps per configuration
    warmup: int = 3
    profile_steps: int = 3
    rounds: int = 5  # the timed steps are taken in this many interleaved rounds over all configurations
    optimizer: str = "adam"
    lr: float | None = None
    seed: int = 1

    def __post_init__(self) -> None:
        if self.steps < 2:
            raise ConfigError("the sweep needs at least 2 timed steps per configuration (for p50/p95)")
        if self.warmup < 0:
            raise ConfigError("warm-up steps must be ≥ 0")
        if self.profile_steps < 1:
            raise ConfigError("profiled steps must be ≥ 1")
        if self.rounds < 1:
            raise ConfigError("rounds must be ≥ 1")


class PointRun:
    """One configuration's model, optimizer and batches, kept alive so timed rounds can interleave.

    Timing every configuration in turn, round after round, spreads a noisy neighbour (other jobs
    on a shared machine) over all of them instead of letting it sink whichever ran at the time.
    """

    def __init__(self, point: SweepPoint, settings: SweepSettings, images: torch.Tensor, labels: torch.Tensor):
        self.point = point
        self.settings = settings
        self.device = torch.device(point.device)
        self.timer = StepTimer(self.device)
        self.timed = Contender(point.key, self.step, self.device, self.configured)
        with self.configured():
            seed_everything(settings.seed)
            self.model = build_model(settings.model).to(self.device).train()
            config = TrainConfig(model=settings.model, optimizer=settings.optimizer, lr=settings.lr)
            self.optimizer = make_optimizer(config, self.model)
            b = point.batch_size
            pool = max(1, min(8, len(labels) // b))  # distinct batches, resident on the device
            self.batches = [
                (images[i * b : (i + 1) * b].to(self.device), labels[i * b : (i + 1) * b].to(self.device))
                for i in range(pool)
            ]
        self._next = 0

    @contextlib.contextmanager
    def configured(self) -> Iterator[None]:
        """This point's threads and cuDNN autotuning, restored afterwards."""
        threads, benchmark = torch.get_num_threads(), torch.backends.cudnn.benchmark
        torch.set_num_threads(self.point.threads)
        if self.point.cudnn_benchmark is not None:
            torch.backends.cudnn.benchmark = self.point.cudnn_benchmark
        try:
            yield
        finally:
            torch.set_num_threads(threads)
            torch.backends.cudnn.benchmark = benchmark

    def step(self) -> None:
        x, y = self.batches[self._next % len(self.batches)]
        self._next += 1
        train_step(self.model, self.optimizer, x, y)

    def finish(self, peak: dict[str, Any]) -> dict[str, Any]:
        """Profile, count FLOPs and bytes, and return the configuration's row."""
        device, b, times = self.device, self.point.batch_size, self.timed.times
        with self.configured():
            if device.type == "cuda":
                step_memory = cuda_step_memory(self.step, device)
            table, profiled_s, cpu_peak = profile_steps(self.step, self.timer, self.settings.profile_steps)
            if device.type == "cpu":
                step_memory = cpu_peak
            x, y = self.batches[0]
            flops = count_flops(self.model, x, y)["train_step"]
            moved = count_step_bytes(self.model, self.optimizer, x, y)
            transfers = (
                {"h2d_pinned_us": transfer_us(x, device, True), "h2d_pageable_us": transfer_us(x, device, False)}
                if device.type == "cuda"
                else {"h2d_pinned_us": None, "h2d_pageable_us": None}
            )
        p50 = statistics.median(times)
        kernels = kernel_times_us(table, device)
        # the kernel share is measured within the profiled steps (both sides under the same conditions)
        # and applied to the unprofiled p50
        kernel_share = min(sum(kernels.values()) * table.steps / (profiled_s * 1e6), 1.0)
        step_us = p50 * 1e6
        overhead_us = step_us * (1 - kernel_share)
        ops_per_step = sum(r.calls for r in table.rows) / table.steps
        achieved = flops / p50 / 1e9
        ranked = sorted(kernels.items(), key=lambda kv: kv[1], reverse=True)
        top_name, top_us = ranked[0] if ranked else (None, 0.0)
        others = [(name, us) for name, us in ranked if not any(g in name for g in GEMM_KERNELS)]
        kernel_total = sum(kernels.values()) or 1.0
        return {
            "config": self.point.key,
            "series": self.point.series,
            "device": self.point.device,
            "device_type": device.type,
            "threads": self.point.threads,
            "cudnn_benchmark": self.point.cudnn_benchmark,
            "batch_size": b,
            "samples_per_s": b / p50,
            "step_p50_ms": p50 * 1e3,
            "step_p95_ms": percentile(times, 95) * 1e3,
            "step_mean_ms": statistics.fmean(times) * 1e3,
            "per_sample_us": step_us / b,
            "cold_step_ms": self.timed.cold_s * 1e3,
            "cold_ratio": self.timed.cold_s / p50,
            "timed_steps": len(times),
            "warmup_steps": self.settings.warmup,
            "flops_per_step": flops,
            "bytes_per_step": moved,
            "intensity": flops / moved if moved else None,
            "achieved_gflops": achieved,
            "peak_gflops": peak["gemm_gflops"],
            "peak_gbps": peak["copy_gbps"],
            "ridge_intensity": peak["gemm_gflops"] / peak["copy_gbps"],
            "pct_of_peak": 100 * achieved / peak["gemm_gflops"],
            "step_memory_bytes": step_memory,
            "memory_source": MEMORY_SOURCE[device.type],
            "kernel_ms": (step_us - overhead_us) / 1e3,
            "overhead_ms": overhead_us / 1e3,
            "kernel_pct": 100 * kernel_share,
            "overhead_pct": 100 * (1 - kernel_share),
            "ops_per_step": ops_per_step,
            "us_per_op": step_us / ops_per_step if ops_per_step else None,
            "overhead_us_per_op": overhead_us / ops_per_step if ops_per_step else None,
            "top_kernel": top_name,
            "top_kernel_pct": 100 * top_us / kernel_total,
            "non_gemm_kernel_pct": 100 * sum(us for _, us in others) / kernel_total,
            "top_non_gemm_kernel": others[0][0] if others else None,
            "top_non_gemm_kernel_pct": 100 * others[0][1] / kernel_total if others else None,
            "conv_kernels": sorted(name for name in kernels if "conv" in name and "backward" not in name),
            **transfers,
            "kernels_us": dict(ranked),
            "top10": table.to_records(10, "self_device" if device.type == "cuda" else "self_cpu"),
            "profiled_steps": table.steps,
            "profiled_step_ms": profiled_s / table.steps * 1e3,
        }


# The CPU row at the largest batch: its slowest convolution direction (slowest_conv).
SLOW_CONV_FIELDS = (
    "slow_conv",
    "slow_conv_shape",
    "slow_conv_ms",
    "slow_conv_gflops",
    "conv_median_gflops",
    "slow_conv_best_path",
    "slow_conv_best_gflops",
)

# Row fields that are one number or label each: the terminal/CSV/report table and what findings cite.
TABLE_FIELDS = (
    "config",
    "device",
    "threads",
    "cudnn_benchmark",
    "batch_size",
    "samples_per_s",
    "step_p50_ms",
    "step_p95_ms",
    "per_sample_us",
    "cold_step_ms",
    "cold_ratio",
    "flops_per_step",
    "bytes_per_step",
    "intensity",
    "achieved_gflops",
    "pct_of_peak",
    "peak_gflops",
    "peak_gbps",
    "ridge_intensity",
    "step_memory_bytes",
    "kernel_ms",
    "overhead_ms",
    "kernel_pct",
    "overhead_pct",
    "ops_per_step",
    "us_per_op",
    "overhead_us_per_op",
    "top_kernel",
    "top_kernel_pct",
    "non_gemm_kernel_pct",
    "top_non_gemm_kernel",
    "top_non_gemm_kernel_pct",
    "h2d_pinned_us",
    "h2d_pageable_us",
    *SLOW_CONV_FIELDS,
)


def measure_peaks(devices: Sequence[str], gemm_n: int = 2048, copy_mbytes: int = 256) -> dict[str, dict[str, Any]]:
    """Each device's measured GEMM FLOP/s and copy bandwidth (the roofline's two roofs)."""
    peaks = {}
    for device in devices:
        gemm = measure_gemm_peak(device, n=gemm_n)
        copy = measure_copy_bandwidth(device, mbytes=copy_mbytes)
        peaks[device] = {
            "gemm_gflops": gemm.value,
            "copy_gbps": copy.value,
            "gemm": gemm.to_dict(),
            "copy": copy.to_dict(),
        }
    return peaks


def best_peaks(*measured: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per device and roof, the best of several measurements: a peak is what the machine can do,
    and a neighbour's burst during one measurement only ever lowers it."""
    best: dict[str, dict[str, Any]] = {}
    for peaks in measured:
        for device, peak in peaks.items():
            mine = best.setdefault(device, dict(peak))
            for value, detail in (("gemm_gflops", "gemm"), ("copy_gbps", "copy")):
                if peak[value] > mine[value]:
                    mine[value], mine[detail] = peak[value], peak[detail]
    return best


def operator_shift(rows: Sequence[dict[str, Any]], top_n: int = SHIFT_TOP_N) -> list[dict[str, Any]]:
    """Which compute kernels appear, vanish or change rank across configurations.

    Each configuration ranks its kernels by time per step; a kernel is listed if it is in some
    configuration's top `top_n`. `ranks` maps every configuration to its rank there (None: absent);
    report.sections.sweep says what changed.
    """
    ranks = {row["config"]: {name: i + 1 for i, name in enumerate(row["kernels_us"])} for row in rows}
    listed = sorted(
        {name for row in rows for name in list(row["kernels_us"])[:top_n]},
        key=lambda name: min(r.get(name, 1 << 30) for r in ranks.values()),
    )
    configs = [row["config"] for row in rows]
    return [{"operator": name, "ranks": {c: ranks[c].get(name) for c in configs}} for name in listed]


def _cite(role: str, row: dict[str, Any], *metrics: str) -> dict[str, Any]:
    """The row values a finding cites, named `role.metric` (`role.config` says which row)."""
    return {f"{role}.{m}": row[m] for m in ("config", *metrics)}


def diagnose(rows: Sequence[dict[str, Any]]) -> list[Finding]:
    """Findings from the thresholds above, each with the row values and the thresholds it cites
    (worded in report.sections.sweep)."""
    findings: list[Finding] = []

    def add(key: str, level: Level, **values: Any) -> None:
        findings.append(Finding(f"sweep.{key}", level, values))

    by_series: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_series.setdefault(row["series"], []).append(row)
    for series, group in by_series.items():
        group = sorted(group, key=lambda r: r["batch_size"])
        small, large = group[0], group[-1]
        pct = small["overhead_pct"]
        add(
            "overhead",
            "bad" if pct >= OVERHEAD_BOUND_PCT else "warn" if pct >= OVERHEAD_MODERATE_PCT else "good",
            series=series,
            overhead_bound_pct=OVERHEAD_BOUND_PCT,
            **_cite("at", small, "batch_size", "overhead_pct", "step_p50_ms", "overhead_us_per_op", "ops_per_step"),
        )
        if large is not small:
            add(
                "batch_gain",
                "info",
                series=series,
                **_cite("large", large, "batch_size", "samples_per_s", "ops_per_step", "kernel_pct"),
                **_cite("small", small, "batch_size", "samples_per_s"),
            )
            if small["conv_kernels"] != large["conv_kernels"] and small["conv_kernels"] and large["conv_kernels"]:
                add(
                    "conv_kernel_change",
                    "info",
                    series=series,
                    **_cite("small", small, "batch_size", "conv_kernels"),
                    **_cite("large", large, "batch_size", "conv_kernels"),
                )
            if large["top_kernel_pct"] is not None and large["top_kernel_pct"] >= TOP_KERNEL_PCT:
                add(
                    "top_kernel",
                    "info",
                    series=series,
                    top_kernel_pct_from=TOP_KERNEL_PCT,
                    **_cite("at", large, "batch_size", "top_kernel", "top_kernel_pct"),
                )
        if large["non_gemm_kernel_pct"] >= NON_GEMM_PCT and large["top_non_gemm_kernel"]:
            add(
                "memory_speed_kernels",
                "info",
                series=series,
                non_gemm_pct_from=NON_GEMM_PCT,
                autotune_trims="pool" in large["top_non_gemm_kernel"],
                **_cite(
                    "at", large, "batch_size", "non_gemm_kernel_pct", "top_non_gemm_kernel", "top_non_gemm_kernel_pct"
                ),
            )
    noisiest = max(rows, key=lambda r: r["step_p95_ms"] / r["step_p50_ms"])
    if noisiest["step_p95_ms"] >= NOISY_P95_RATIO * noisiest["step_p50_ms"]:
        add("noisy", "warn", noisy_p95_ratio=NOISY_P95_RATIO, **_cite("at", noisiest, "step_p95_ms", "step_p50_ms"))
    coldest = max(rows, key=lambda r: r["cold_ratio"])
    if coldest["cold_ratio"] >= COLD_RATIO_WARN:
        add(
            "cold_step",
            "warn",
            cold_ratio_warn=COLD_RATIO_WARN,
            **_cite("at", coldest, "cold_ratio", "cold_step_ms", "step_p50_ms"),
        )
    cpu_rows = {r["batch_size"]: r for r in rows if r["device_type"] == "cpu"}
    for gpu in (r for r in rows if r["device_type"] == "cuda"):
        cpu = cpu_rows.get(gpu["batch_size"])
        if cpu is None:
            continue
        if gpu["samples_per_s"] < cpu["samples_per_s"]:
            add(
                "gpu_slower",
                "warn",
                **_cite("gpu", gpu, "samples_per_s", "kernel_pct", "overhead_us_per_op", "ops_per_step"),
                **_cite("cpu", cpu, "samples_per_s"),
            )
        else:
            add("gpu_faster", "good", **_cite("gpu", gpu, "samples_per_s"), **_cite("cpu", cpu, "samples_per_s"))
    tuned = {(r["device"], r["batch_size"]): r for r in rows if r["cudnn_benchmark"]}
    for plain in (r for r in rows if r["cudnn_benchmark"] is False):
        on = tuned.get((plain["device"], plain["batch_size"]))
        if on is None:
            continue
        add(
            "cudnn_benchmark",
            "info",
            **_cite("on", on, "batch_size", "cold_step_ms", "step_p50_ms"),
            **_cite("off", plain, "cold_step_ms", "step_p50_ms"),
        )
    best = max(rows, key=lambda r: r["pct_of_peak"])
    add(
        "roofline",
        "warn" if best["pct_of_peak"] > 100 else "info",
        memory_bound=best["intensity"] is not None and best["intensity"] < best["ridge_intensity"],
        **_cite("best", best, "achieved_gflops", "pct_of_peak", "peak_gflops", "intensity", "ridge_intensity"),
    )
    return findings


def slowest_conv(directions: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Row fields naming the convolution direction furthest below the others' rate on torch's
    default path (experiments.conv_directions), and the best path measured for it; None if none is."""
    slow = slow_kernels(list(directions))
    if not slow:
        return dict.fromkeys(SLOW_CONV_FIELDS)
    worst, best = slow[0], slow[0]["best_alternative"]
    return {
        "slow_conv": f"{worst['layer']} {worst['direction']}",
        "slow_conv_shape": worst["shape"],
        "slow_conv_ms": worst["ms"],
        "slow_conv_gflops": worst["gflops"],
        "conv_median_gflops": worst["others_median_gflops"],
        "slow_conv_best_path": best["path"] if best else None,
        "slow_conv_best_gflops": best["gflops"] if best else None,
    }


def conv_findings(rows: Sequence[dict[str, Any]]) -> list[Finding]:
    """A convolution direction far below the others' rate (`slowest_conv`), and what beats it."""
    findings = []
    for row in (r for r in rows if r.get("slow_conv")):
        cited = ["slow_conv", "slow_conv_gflops", "slow_conv_ms", "slow_conv_shape", "conv_median_gflops"]
        if row["slow_conv_best_gflops"] is not None and row["slow_conv_best_gflops"] > row["slow_conv_gflops"]:
            cited += ["slow_conv_best_path", "slow_conv_best_gflops"]
        values = {"slow_rate_ratio": SLOW_RATE_RATIO, **_cite("at", row, *cited)}
        findings.append(Finding("sweep.slow_conv", "warn", values))
    return findings


def run_batch_device_sweep(
    points: Sequence[SweepPoint],
    settings: SweepSettings,
    images: torch.Tensor,
    labels: torch.Tensor,
    peak_sizes: tuple[int, int] = (2048, 256),
    on_point: Callable[[SweepPoint | None, str], None] | None = None,
) -> dict[str, Any]:
    """Measure every point (normalised `images`, on the host); then the operator shift and findings.

    The peaks (GEMM n, copy MiB: `peak_sizes`) are measured before and after the timed rounds
    and the better kept. Each convolution of the CPU point with the largest batch is then timed in
    its three directions (experiments.conv_directions). `on_point(point, phase)` is called before
    each unit of work (a peak measurement, a timed round or the convolutions with point None,
    starting or profiling a point): 2 × len(points) + settings.rounds + 2 (+1 with a CPU) calls.
    """
    if len(labels) < max(p.batch_size for p in points):
        raise ConfigError(f"the largest batch needs {max(p.batch_size for p in points)} samples, got {len(labels)}")
    devices = list(dict.fromkeys(p.device for p in points))
    say = on_point or (lambda point, phase: None)
    say(None, "measuring peaks")
    first_peaks = measure_peaks(devices, *peak_sizes)
    runs = [PointRun(point, settings, images, labels) for point in points]
    by_name = {run.timed.name: run for run in runs}
    time_interleaved(
        [run.timed for run in runs],
        settings.steps,
        settings.rounds,
        settings.warmup,
        on_start=lambda c: say(by_name[c.name].point, "starting"),
        on_round=lambda i: say(None, f"timed round {i + 1}/{settings.rounds}"),
    )
    say(None, "measuring peaks again")
    peaks = best_peaks(first_peaks, measure_peaks(devices, *peak_sizes))
    rows = []
    for run in runs:
        say(run.point, "profiling")
        rows.append(run.finish(peaks[run.point.device]))
    directions = []
    cpu_runs = [run for run in runs if run.device.type == "cpu"]
    if cpu_runs:
        say(None, "convolutions by direction")
        largest = max(cpu_runs, key=lambda run: run.point.batch_size)
        with largest.configured():
            directions = conv_directions(largest.model, largest.batches[0][0], repeats=3)
    for row in rows:
        row.update(slowest_conv(directions if cpu_runs and row["config"] == largest.point.key else []))
    findings = diagnose(rows) + conv_findings(rows)
    return {
        "settings": asdict(settings),
        "rows": rows,
        "peaks": peaks,
        "shift": operator_shift(rows),
        "conv_directions": directions,
        "findings": [f.to_json() for f in findings],
        "thresholds": {
            "overhead_bound_pct": OVERHEAD_BOUND_PCT,
            "overhead_moderate_pct": OVERHEAD_MODERATE_PCT,
            "cold_ratio_warn": COLD_RATIO_WARN,
            "top_kernel_pct": TOP_KERNEL_PCT,
            "noisy_p95_ratio": NOISY_P95_RATIO,
            "non_gemm_pct": NON_GEMM_PCT,
            "slow_rate_ratio": SLOW_RATE_RATIO,
        },
    }


def rows_csv(rows: Sequence[dict[str, Any]]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(TABLE_FIELDS), extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()
