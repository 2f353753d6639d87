"""Section gpu (`dlscope run` of a script that trains on CUDA): host-device synchronisations and
the lines that made them, model-FLOPs utilisation against this GPU's measured peaks, memory and
its top allocation sites, and the profiled steps' GPU busy and idle time and copies — worded here
from the facts gpuanalysis.py measured."""

from __future__ import annotations

import os
from typing import Any

from dlscope.findings import Finding
from dlscope.report.blocks import Block, Findings, Para, Table
from dlscope.report.sections.steps import mebibytes

TITLE = "GPU"
SYNC_WARN_PER_STEP = 1.0  # a synchronisation in every step: the host waits for the GPU each step
PAGEABLE_WARN_PCT = 50.0  # most bytes copied to the GPU from pageable memory: pinning pays


def where(file: str, line: int) -> str:
    return f"{os.path.basename(file)}:{line}" if file else "?"


def sync_blocks(section: dict[str, Any]) -> list[Block]:
    anatomy, lines = section["anatomy"], section.get("sync_lines") or []
    per_step = anatomy.get("syncs_per_step")
    if per_step is None:
        return []
    if not per_step:
        return [Findings([("good", "No host-device synchronisation in the steady steps: the host queues work ahead.")])]
    top = lines[0] if lines else None
    text = (
        f"{per_step:.3g} host-device synchronisations a step (in {anatomy['steps_with_syncs_pct']:.0f}% of the "
        "steady steps): at each the host waits until the GPU has finished everything queued, then the GPU "
        "idles until the host queues more."
    )
    if top is not None:
        text += (
            f" Most come from {where(top['script_file'], top['script_line'])} ({top['function']}): a .item(), a "
            "print of a tensor, a copy to the CPU or from unpinned memory, a nonzero() or a Python if on a tensor."
        )
    rows = [
        [where(x["script_file"], x["script_line"]), x["function"], where(x["file"], x["line"]), x["count"]]
        for x in lines
    ]
    level = "warn" if per_step >= SYNC_WARN_PER_STEP else "info"
    blocks: list[Block] = [Findings([(level, text)])]
    if rows:
        blocks.append(
            Table(
                ["script line", "function", "torch's line", "syncs"],
                rows,
                "Where the synchronisations were made (torch.cuda.set_sync_debug_mode)",
                legend="script line: the first frame outside torch and dlscope; torch's line: the call that "
                "synchronised, as torch reports it. Counted over the whole run.",
            )
        )
    return blocks


def mfu_blocks(section: dict[str, Any]) -> list[Block]:
    mfu = section.get("mfu")
    if not mfu:
        return []
    peaks = mfu.get("peaks") or {}
    peak_rows = [[dtype, round(v / 1e12, 1)] for dtype, v in peaks.items()]
    if mfu.get("mfu") is None:
        reasons = {
            "no_peak": f"no peak could be measured for {', '.join(mfu.get('no_peak') or [])}",
            "no_flops": "no matrix product or convolution was counted in the step measured",
            "no_step_time": "no steady step was timed on the GPU's clock",
            "error": f"counting the step's FLOPs failed ({mfu.get('error')})",
        }
        return [Para(f"No model-FLOPs utilisation: {reasons.get(mfu.get('reason'), 'not measured')}.")]
    text = (
        f"Model-FLOPs utilisation {100 * mfu['mfu']:.1f}%: one step's matrix products and convolutions "
        f"({mfu['flops_per_step'] / 1e9:.3g} GFLOP, counted by dtype on one step) would take "
        f"{mfu['ideal_seconds'] * 1e3:.3g} ms at this GPU's peaks, measured in the same process at exit, "
        f"against a {mfu['step_seconds'] * 1e3:.3g} ms step on the GPU's clock."
    )
    level = "good" if mfu["mfu"] >= 0.5 else "info"
    return [
        Findings([(level, text)]),
        Table(["dtype", "peak TFLOP/s"], peak_rows, "Matmul peaks measured on this GPU (square products)"),
    ]


def memory_blocks(section: dict[str, Any]) -> list[Block]:
    anatomy = section["anatomy"]
    text = f"Peak reserved by torch's caching allocator: {mebibytes(section.get('peak_reserved_bytes'))} MB"
    if anatomy.get("reserved_max_bytes") is not None:
        text += f" (at a steady step's end, at most {mebibytes(anatomy['reserved_max_bytes'])} MB)"
    blocks: list[Block] = [Para(text + ".")]
    for window in section.get("memory") or []:
        rows = [
            [where(s["file"], s["line"]), s["function"], s["count"], mebibytes(s["bytes"]), mebibytes(s["largest"])]
            for s in window["sites"]
        ]
        if rows:
            blocks.append(
                Table(
                    ["line", "function", "allocs", "MB", "largest MB"],
                    rows,
                    "Allocations during the profiled steps, by the script's line (torch's memory history)",
                    legend=f"snapshot: {window['snapshot']} (opens in pytorch.org/memory_viz)",
                )
            )
    return blocks


def profiled_blocks(section: dict[str, Any]) -> list[Block]:
    blocks: list[Block] = []
    for window in section.get("profiled") or []:
        rows = [
            [
                s["profiler_step"],
                s["host_ms"],
                s["gpu_busy_ms"],
                s["gpu_idle_ms"],
                s["busy_pct"],
                s["kernels"],
                s["sync_calls"],
            ]
            for s in window["steps"]
        ]
        blocks.append(
            Table(
                ["step", "host ms", "busy ms", "idle ms", "busy %", "kernels", "syncs"],
                rows,
                "The profiled steps on the GPU (kernels, copies and memsets; overlaps counted once)",
            )
        )
        summary = window["summary"]
        pageable = summary.get("h2d_pageable_pct")
        if pageable is not None and pageable >= PAGEABLE_WARN_PCT:
            copy_ms = pageable_copies(summary)
            blocks.append(
                Findings(
                    [
                        (
                            "warn",
                            f"{pageable:.0f}% of the bytes copied to the GPU ({summary['h2d_mb_per_step']:.3g} MB a "
                            f"step, {copy_ms:.3g} ms of GPU copy time in a {summary['host_ms']:.3g} ms step) came from "
                            "pageable memory: each such copy is staged through a pinned buffer and blocks the host "
                            "until it is done. With DataLoader(pin_memory=True) and .to(device, non_blocking=True) "
                            "the copy runs while the host queues the next work: up to "
                            f"{100 * copy_ms / summary['host_ms']:.0f}% of the step to gain, if the GPU has other "
                            "work to overlap it with (a prediction: measure it).",
                        )
                    ]
                )
            )
    return blocks


def pageable_copies(summary: dict[str, Any]) -> float:
    """The GPU copy time a step spends on copies to the GPU from pageable memory, ms."""
    return sum(c["ms"] for c in summary["copies"] if c["direction"] == "h2d" and c["memory"] == "pageable")


def summary_findings(section: dict[str, Any], sections: dict[str, Any]) -> list[Finding]:
    """The host waiting for the GPU every step, and copies from pageable memory, as facts."""
    found = []
    anatomy, lines = section["anatomy"], section.get("sync_lines") or []
    per_step = anatomy.get("syncs_per_step")
    if per_step and per_step >= SYNC_WARN_PER_STEP:
        top = lines[0] if lines else None
        at = where(top["script_file"], top["script_line"]) if top else None
        found.append(Finding("gpu.syncs", "warn", {"per_step": per_step, "where": at}))
    for window in section.get("profiled") or []:
        summary = window["summary"]
        pageable = summary.get("h2d_pageable_pct")
        if pageable is not None and pageable >= PAGEABLE_WARN_PCT:
            share = pageable_copies(summary) / summary["host_ms"]
            values = {"pct": pageable, "copy_pct": 100 * share, "gain": 1 / max(1 - share, 1e-9)}
            found.append(Finding("gpu.pageable", "warn", values))
            break  # the first window says it
    return found


HEADLINES = {  # the summary's words for the warnings it shows
    "gpu.syncs": lambda v: (
        f"{v['per_step']:.3g} host-device synchronisations a step"
        + (f", most from {v['where']}" if v["where"] else "")
        + ": the host waits for the GPU, then the GPU for the host."
    ),
    "gpu.pageable": lambda v: (
        f"{v['pct']:.0f}% of the bytes copied to the GPU came from pageable memory: each copy blocks the host."
    ),
}
CHANGES = {  # the summary's words for the changes these findings suggest
    "gpu.syncs": lambda v: (
        "no synchronisation in the step"
        + (f" (the one at {v['where']}: a .item(), a print, a copy to the CPU)" if v["where"] else "")
        + ", so the host queues work ahead of the GPU."
    ),
    "gpu.pageable": lambda v: (
        "DataLoader(pin_memory=True) and .to(device, non_blocking=True): the copies to the GPU are "
        f"{v['copy_pct']:.0f}% of the step (up to {v['gain']:.3g}× if they all overlapped other work)."
    ),
}


def render(section: dict[str, Any]) -> list[Block]:
    device = section.get("device") or "a CUDA device"
    head = f"On {device}: {section['steps_seen']} steps seen on the GPU's clock."
    if section.get("waited"):
        head += f" The GPU fell {section['waited']} times more than 64 steps behind and was waited for."
    if section.get("error"):
        head += f" Part of the GPU's facts were lost at exit: {section['error']}."
    return [Para(head), *sync_blocks(section), *mfu_blocks(section), *memory_blocks(section), *profiled_blocks(section)]
