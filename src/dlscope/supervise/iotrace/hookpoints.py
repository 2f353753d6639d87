"""The hook-point map: for each syscall a trace saw, where a tracer could attach on this kernel —
its tracepoints (stable ABI) and the kprobe/kretprobe on its kernel entry function (where
kprobes exist) — the seed's tracepoint/kprobe chart, generated from what the kernel offers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dlscope.supervise.iotrace.ebpf import tracefs


def kernel_offers() -> dict[str, Any]:
    """What this kernel exposes to tracers (read from tracefs; no privileges needed to read)."""
    root = tracefs()
    if root is None:
        return {"tracefs": None, "syscall_tracepoints": False, "kprobes": False, "sched_tracepoints": False}
    return {
        "tracefs": str(root),
        "syscall_tracepoints": (root / "events" / "syscalls").is_dir(),
        "kprobes": (root / "kprobe_events").exists(),
        "sched_tracepoints": (root / "events" / "sched" / "sched_process_fork").is_dir(),
    }


def _has_symbol(root: Path, symbol: str, cache: dict[str, set[str]]) -> bool:
    if "symbols" not in cache:
        path = root / "available_filter_functions"
        try:
            cache["symbols"] = {line.split()[0] for line in path.read_text().splitlines() if line}
        except OSError:
            cache["symbols"] = set()
    return symbol in cache["symbols"]


def hook_map(calls: list[str]) -> list[dict[str, Any]]:
    """One row per syscall: tracepoints and kprobe, each with whether this kernel has it."""
    root = tracefs()
    offers = kernel_offers()
    cache: dict[str, set[str]] = {}
    rows = []
    for call in calls:
        enter = f"syscalls:sys_enter_{call}"
        has_tp = root is not None and (root / "events" / "syscalls" / f"sys_enter_{call}").is_dir()
        symbol = f"__x64_sys_{call}"
        has_symbol = root is not None and _has_symbol(root, symbol, cache)
        rows.append(
            {
                "syscall": call,
                "tracepoint": f"{enter} / sys_exit_{call}",
                "tracepoint_available": has_tp,
                "kprobe": f"kprobe:{symbol} / kretprobe:{symbol}",
                "kprobe_available": bool(offers["kprobes"] and has_symbol),
            }
        )
    return rows
