"""The GPU section from its records (what gpuclock.py writes, with a real profiler trace taken on
an H100, tests/data/gpu/) to the terminal at 80 columns: every fact worded, no cell cut."""

from __future__ import annotations

import gzip
import io
import json
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console

from dlscope.analysis import gpu as gpuanalysis
from dlscope.report.sections import anatomy as anatomy_words
from dlscope.report.sections import gpu as gpu_words
from dlscope.report.terminal import print_blocks

TRACES = Path(__file__).parent / "data" / "gpu"
SCRIPT = "/home/student/train.py"


def recorded(trace: str) -> list[list]:
    """The steps a run's window recorded, as its profile record has them ([index, N, start, end],
    CLOCK_REALTIME s): here the trace's own ProfilerStep#N marks, one step each."""
    with gzip.open(TRACES / trace, "rt") as f:
        document = json.load(f)
    shift = int(document.get("baseTimeNanoseconds") or 0) / 1e3
    marks = [  # the host's marks; the GPU's own (gpu_user_annotation) are their shadows there
        e
        for e in document["traceEvents"]
        if e.get("cat") == "user_annotation" and str(e.get("name", "")).startswith("ProfilerStep#")
    ]
    steps = sorted((int(e["name"].split("#", 1)[1]), e["ts"] + shift, e["ts"] + e["dur"] + shift) for e in marks)
    assert steps, trace
    return [[n, n, start / 1e6, end / 1e6] for n, start, end in steps]


def records(trace: str) -> list[dict]:
    # [index, step µs, data µs, loader, forward µs, backward µs, optimizer µs, syncs, reserved MiB, excluded]
    rows = [[i, 12_000, 4_000, 1, 800, 1_300, 300, 2, 900, int(i == 3)] for i in range(1, 40)]
    torch_line = "/usr/lib/python3/site-packages/torch/_tensor.py"
    return [
        {"k": "gpu_steps", "rows": rows},
        {
            "k": "gpu",
            "device": "NVIDIA H100 80GB HBM3",
            "waited": 0,
            "sync_lines": [
                {
                    "file": torch_line,
                    "line": 1030,
                    "script_file": SCRIPT,
                    "script_line": 41,
                    "function": "train",
                    "count": 39,
                },
                {
                    "file": SCRIPT,
                    "line": 44,
                    "script_file": SCRIPT,
                    "script_line": 44,
                    "function": "train",
                    "count": 39,
                },
            ],
            "sync_lines_total": 2,
            "peak_reserved_bytes": 950 << 20,
            "tf32": False,
        },
        {"k": "gpu_flops", "by_dtype": {"float32": 3 * 10**10}, "flops": 3 * 10**10},
        {"k": "gpu_peaks", "flops_per_s": {"float32": 51.6e12}},
        {
            "k": "gpu_memory",
            "snapshot": "processes/memory-7-1.pickle",
            "sites": [
                {"file": SCRIPT, "line": 41, "function": "train", "count": 80, "bytes": 2 << 30, "largest": 32 << 20}
            ],
        },
        {"k": "profile", "trace": str(TRACES / trace), "recorded": recorded(trace)},
    ]


def text(blocks: list, width: int = 80) -> str:
    out = io.StringIO()
    print_blocks(blocks, Console(file=out, width=width, color_system=None, theme=None))
    return out.getvalue()


def test_the_gpu_section_words_every_fact_inside_80_columns():
    section = gpuanalysis.gpu_section(records("pageable.json.gz"), unsteady=np.asarray([1, 2]))
    anatomy = section["anatomy"]
    assert anatomy["steps_used"] == 36  # 39 seen, less the first the clock saw, a profiled one, the FLOPs one
    assert anatomy["percent"]["data"] == round(100 * 4_000 / 12_000, 2) and anatomy["syncs_per_step"] == 2
    assert section["mfu"]["mfu"] == pytest.approx(3e10 / 51.6e12 / 0.012, rel=1e-3)
    (window,) = section["profiled"]
    assert window["summary"]["h2d_pageable_pct"] > 90
    out = text(gpu_words.render(section))
    assert max(len(line) for line in out.splitlines()) <= 80 and "…" not in out
    for said in (
        "2 host-device synchronisations a step",
        "train.py:41",
        "_tensor.py:1030",
        "pageable memory",
        "Model-FLOPs utilisation",
        "memory-7-1.pickle",
        "51.6",
    ):
        assert said in " ".join(out.split()), said


def test_a_gpu_with_no_sync_is_said_to_run_ahead():
    recs = records("compute.json.gz")
    for row in recs[0]["rows"]:
        row[7] = 0
    section = gpuanalysis.gpu_section(recs, unsteady=np.asarray([1]))
    out = text(gpu_words.render(section))
    assert "No host-device synchronisation" in out and "pageable" not in out


def test_the_anatomy_on_the_gpus_clock_shows_the_hosts_shares_beside():
    gpu = gpuanalysis.anatomy(np.asarray(records("item.json.gz")[0]["rows"]), unsteady=np.asarray([1]))
    host = {"data": 1.0, "gap": 0.0, "forward": 2.0, "backward": 3.0, "optimizer": 60.0, "other": 34.0}
    section = {
        "steps_used": gpu["steps_used"],
        "used": "steady",
        "clock": "gpu",
        "data_source": gpu["data_source"],
        "mean_ms": gpu["mean_ms"],
        "percent": gpu["percent"],
        "host_percent": host,
        "dlscope_us_per_step": 12.0,
        "peak_rss_bytes": 1 << 30,
        "peak_cuda_bytes": 1 << 29,
        "verdict": {
            "key": "input_bound",
            "level": "highly",
            "step_ms": gpu["step_ms"],
            "steps": gpu["steps_used"],
            "clock": "gpu",
            "data_pct": gpu["percent"]["data"],
            "data_ms": gpu["mean_ms"]["data"],
            "thresholds_pct": {"highly": 20.0, "moderately": 5.0},
            "loader_steps": 39,
        },
    }
    out = text(anatomy_words.render(section))
    assert "on the GPU's clock" in out and "host %" in out and "60.0" in out
    assert max(len(line) for line in out.splitlines()) <= 80 and "…" not in out


def test_the_gpus_warnings_reach_a_runs_summary_and_the_change_with_the_highest_gain_leads():
    from dlscope.report.blocks import Findings, Para
    from dlscope.report.runsummary import summary_blocks
    from dlscope.rundir import SCHEMA_VERSION

    section = gpuanalysis.gpu_section(records("pageable.json.gz"), unsteady=np.asarray([1, 2]))
    gpu = section["anatomy"]
    verdict = {"key": "input_bound", "level": "highly", "data_pct": gpu["percent"]["data"]}
    verdict["thresholds_pct"] = {"highly": 20.0, "moderately": 5.0}
    anatomy = {k: gpu[k] for k in ("steps_used", "step_ms", "percent", "data_source")} | {"clock": "gpu"}
    run = {"command": ["python", "train.py"], "exit_code": 0, "wall_seconds": 9.0, "processes": []}

    def summary(anatomy: dict) -> str:
        sections = {"run": run, "anatomy": anatomy, "gpu": section}
        results = {"schema_version": SCHEMA_VERSION, "steps": list(sections), "sections": sections}
        blocks = summary_blocks(results)
        said = [b.text for b in blocks if isinstance(b, Para)] + [
            t for b in blocks if isinstance(b, Findings) for _, t in b.items
        ]
        return " ".join(" ".join(said).split())

    # a third of the step in the DataLoader (up to 1.5× were it free) outranks pinning (1.32×), said as a warning
    said = summary(anatomy | {"verdict": verdict})
    assert "The loop's own work bounds the step: 46.7% of the 12.00 ms mean step on the GPU's clock" in said
    assert "Most likely to pay: more DataLoader workers" in said and "up to 1.5× if the input were free" in said
    assert "2 host-device synchronisations a step, most from train.py:41" in said
    assert "100% of the bytes copied to the GPU came from pageable memory" in said
    # no DataLoader: pinning is the change, with its measured ceiling
    said = summary(anatomy | {"data_source": "none", "verdict": {"key": "gap"}})
    assert "Most likely to pay: DataLoader(pin_memory=True) and .to(device, non_blocking=True)" in said
    assert "up to 1.32× if they all overlapped other work" in said and "pageable memory: each copy" not in said
