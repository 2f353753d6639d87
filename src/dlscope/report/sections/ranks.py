"""Section ranks: the processes of a torchrun job (dlscope train|lab --nproc-per-node N)."""

from __future__ import annotations

from typing import Any

from dlscope.console import safe
from dlscope.report.blocks import Block, Findings, Para, Table, fmt

TITLE = "Ranks: the torchrun job, process by process"


def render(section: dict[str, Any]) -> list[Block]:
    world, nodes = section["world_size"], section["nnodes"]
    blocks: list[Block] = [
        Para(
            f"{world} ranks ({section['nproc_per_node']} per node × {nodes} node{'s' if nodes > 1 else ''}), "
            f"backend {section['backend']}, {section['threads_per_rank']} thread(s) per rank, DDP buckets of "
            f"{section['bucket_cap_mb']:g} MB, checkpoints as {section['ckpt_format']}. Each rank trained "
            f"1/{world} of every global batch; launched as `{safe(section['command'])}`."
        )
    ]
    rows = [
        [
            r["rank"],
            r["node_rank"],
            str(r["pid"]),  # an id, not a quantity: no thousands separator
            r["threads"],
            r["steps"],
            r["samples"],
            fmt(r["samples_per_s"]),
            fmt(r["step_ms_median"]),
            fmt(r["step_ms_p90"]),
            safe(r["trace"] or "—"),
        ]
        for r in section["ranks"]
    ]
    blocks.append(
        Table(
            ["rank", "node", "pid", "thr", "steps", "samples", "smp/s", "p50 ms", "p90 ms", "trace"],
            rows,
            legend="thr: torch threads; smp/s: the rank's own samples per second of its steps; "
            "p50/p90 ms: step time percentiles (first and profiled steps left out)",
            optional=("node", "pid", "trace"),
        )
    )
    findings = []
    if section["restarts"]:
        restarted = f"torchrun restarted the ranks {section['restarts']} time(s)"
        findings.append(("warn", f"{restarted}; they resumed from the last checkpoint."))
    spread = section.get("step_ms_spread")
    if spread is not None and len(section["ranks"]) > 1:
        slowest = section["slowest_rank"]
        if spread > 1.1:
            text = (
                f"Rank {slowest} is slow: its median step is {spread:.2f}× the fastest rank's, and DDP makes "
                "every rank wait for it at each all-reduce."
            )
            findings.append(("warn", text))
        else:
            text = f"The ranks keep pace: the slowest median step (rank {slowest}) is {spread:.2f}× the fastest."
            findings.append(("good", text))
    if findings:
        blocks.append(Findings(findings))
    return blocks
