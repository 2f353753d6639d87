"""The device's measured peaks: dense GEMM FLOP/s (fp32, and per dtype) and memory-copy bandwidth.

Rooflines, "% of peak" and model-FLOPs-utilisation figures are relative to these, measured in the
same run on the same machine, rather than to a datasheet number the machine may never reach.

Each figure is the fastest of several repeats after a warm-up. On CUDA a repeat is timed with a pair
of CUDA events around it on the current stream, and the host synchronises once, after the last
repeat: the queue stays full, so no launch gap or host wake-up is counted. On the CPU it is
`time.perf_counter` around the call.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass

import torch


@dataclass
class Peak:
    what: str
    value: float  # GFLOP/s or GB/s
    unit: str
    size: int
    best_seconds: float  # the fastest repeat: a peak is what the device can do, not what it usually did
    repeats: int

    def to_dict(self) -> dict:
        return asdict(self)


# matmul_peaks' default. "tf32" too: cuDNN runs float32 convolutions in TF32 by default (cuBLAS
# does not), so a float32 model's FLOPs are counted partly under "tf32" (flops.py) even when
# "float32" measures IEEE products; on a CPU, or with TF32 on, it adds nothing
MATMUL_DTYPES = ("float32", "tf32", "bfloat16", "float16")
# square-matmul size per device type: ~ms per product on an H100 (bf16 ~1.6 ms at n=8192, fp32 in
# IEEE ~20 ms), small enough on a CPU that three dtypes take well under a second
MATMUL_N = {"cuda": 8192, "cpu": 512}
MATMUL_REPEATS = {"cuda": 10, "cpu": 3}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _best_seconds(fn: Callable[[], object], device: torch.device, repeats: int, warmup: int = 2) -> float:
    """The fastest of `repeats` calls of `fn`, after `warmup` untimed ones."""
    if device.type == "cuda":
        # events on the device's current stream; one synchronisation, after the last repeat
        with torch.cuda.device(device):
            for _ in range(warmup):
                fn()
            stream = torch.cuda.current_stream(device)
            events = [
                (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(repeats)
            ]
            for start, end in events:
                start.record(stream)
                fn()
                end.record(stream)
            events[-1][1].synchronize()
            return min(start.elapsed_time(end) for start, end in events) / 1e3
    for _ in range(warmup):
        fn()
    _sync(device)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - start)
    return min(times)


def tf32_enabled(op: str = "matmul") -> bool:
    """Whether float32 `op`s ("matmul": cuBLAS; "conv": cuDNN convolutions) on CUDA may run in TF32
    now. Reads torch's newer per-backend `fp32_precision` where it has one ("none" defers to the
    level above), else the older `allow_tf32` flag: reading `allow_tf32` raises after a script has
    set the newer API (torch ≥ 2.9 refuses a mix), the newer one reflects the older's settings."""
    backends = torch.backends
    if op == "conv":
        levels = [getattr(backends.cudnn, "conv", None), backends.cudnn, backends]
        legacy = backends.cudnn
    else:
        levels = [backends.cuda.matmul, backends]
        legacy = backends.cuda.matmul
    try:
        for level in levels:
            precision = getattr(level, "fp32_precision", None) if level is not None else None
            if precision is None:
                break  # a torch before the newer API
            if precision != "none":
                return precision == "tf32"
        else:
            return False  # "none" all the way up: torch's default, IEEE float32
    except Exception:  # a torch whose newer API differs: fall back to the flag
        pass
    try:
        return bool(legacy.allow_tf32)
    except Exception:  # unreadable: say IEEE, the stricter claim
        return False


def measure_gemm_peak(device: str | torch.device = "cpu", n: int = 2048, repeats: int = 5) -> Peak:
    """fp32 n×n×n matmul throughput (2·n³ FLOPs per call, the FlopCounterMode convention)."""
    device = torch.device(device)
    a = torch.randn(n, n, device=device)
    b = torch.randn(n, n, device=device)
    seconds = _best_seconds(lambda: torch.mm(a, b), device, repeats)
    return Peak("gemm_fp32", 2 * n**3 / seconds / 1e9, "GFLOP/s", n, seconds, repeats)


def matmul_peaks(
    device: str | torch.device = "cpu",
    dtypes: Iterable[str] = MATMUL_DTYPES,
    n: int | None = None,
    repeats: int | None = None,
) -> dict[str, float]:
    """The best-of-`repeats` FLOP/s of an n×n×n matmul (2·n³ FLOPs per product) per dtype name.

    Keys are the names flops.py counts under. "float32" is measured with the process's current TF32
    setting and keyed "tf32" when that is on (CUDA only); the name "tf32" asks for float32 with TF32
    forced on for the measurement (CUDA only), the settings restored after. A dtype the device
    cannot multiply (an error, out of memory included) and a name that is not a float dtype (e.g. a
    float8 count) are left out. `n` and `repeats` default per device type (MATMUL_N, MATMUL_REPEATS).
    """
    device = torch.device(device)
    if n is None:
        n = MATMUL_N.get(device.type, MATMUL_N["cpu"])
    if repeats is None:
        repeats = MATMUL_REPEATS.get(device.type, MATMUL_REPEATS["cpu"])
    peaks: dict[str, float] = {}
    for name in dict.fromkeys(dtypes):
        force_tf32 = name == "tf32"
        if force_tf32 and device.type != "cuda":
            continue
        dtype = torch.float32 if force_tf32 else getattr(torch, name, None)
        # float8 names are counted (torch._scaled_mm) but torch.mm has no float8 product to time
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point or dtype.itemsize < 2:
            continue
        key = name
        if dtype == torch.float32 and device.type == "cuda" and (force_tf32 or tf32_enabled("matmul")):
            key = "tf32"
        if key in peaks:
            continue
        try:
            seconds = _matmul_seconds(device, dtype, n, repeats, force_tf32)
        except Exception:  # the device cannot do this dtype (or has no room): no peak for it
            continue
        peaks[key] = 2 * n**3 / seconds
    return peaks


def _matmul_seconds(device: torch.device, dtype: torch.dtype, n: int, repeats: int, force_tf32: bool) -> float:
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    out = torch.empty(n, n, device=device, dtype=dtype)  # one output, reused: no allocation timed
    if not force_tf32:
        return _best_seconds(lambda: torch.mm(a, b, out=out), device, repeats)
    # the newer per-backend setting when torch has it (restoring it restores the older flag it
    # implies, and the older float32_matmul_precision, as torch 2.13 does); the older flag otherwise
    matmul = torch.backends.cuda.matmul
    newer = getattr(matmul, "fp32_precision", None)
    older = None if newer is not None else matmul.allow_tf32
    try:
        legacy = torch.get_float32_matmul_precision()
    except Exception:  # unreadable after the newer API was used: nothing to put back
        legacy = None
    try:
        if newer is not None:
            matmul.fp32_precision = "tf32"
        else:
            matmul.allow_tf32 = True
        return _best_seconds(lambda: torch.mm(a, b, out=out), device, repeats)
    finally:
        if newer is not None:
            matmul.fp32_precision = newer
        else:
            matmul.allow_tf32 = older
        if legacy is not None and torch.get_float32_matmul_precision() != legacy:
            torch.set_float32_matmul_precision(legacy)


def measure_copy_bandwidth(device: str | torch.device = "cpu", mbytes: int = 256, repeats: int = 5) -> Peak:
    """Device-memory copy bandwidth: bytes read plus bytes written per second."""
    device = torch.device(device)
    n = mbytes * 2**20 // 4
    src = torch.randn(n, device=device)
    dst = torch.empty_like(src)
    seconds = _best_seconds(lambda: dst.copy_(src), device, repeats)
    return Peak("copy", 2 * n * 4 / seconds / 1e9, "GB/s", n * 4, seconds, repeats)
