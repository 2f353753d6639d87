"""`dlscope run` on a GPU, against scripts that time themselves with CUDA events by hand
(tests/scripts/cuda_truth.py): the anatomy on the GPU's clock within ±5 points of their truth,
the synchronisations named with their line, copies from pageable memory seen, the FLOPs
utilisation and the memory sites measured. Skipped without a CUDA GPU."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

SCRIPT = Path(__file__).parent / "scripts" / "cuda_truth.py"
TOLERANCE_PP = 5.0


def line_of(marker: str) -> int:
    return next(i for i, text in enumerate(SCRIPT.read_text().splitlines(), 1) if f"# {marker}:" in text)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from dlscope.options import RunOptions, ScriptOptions, StepOptions
    from dlscope.runner import Plan, run_command

    done = {}
    for mode in ("item", "pageable", "compute"):
        out = tmp_path_factory.mktemp(mode)
        command = [sys.executable, str(SCRIPT), str(out / "truth.json"), "--mode", mode]
        options = StepOptions(script=ScriptOptions(command))
        plan = Plan("run", ["run"], options=RunOptions(out=str(out / "run")), step_options=options)
        results = run_command(plan, render=False)
        assert results["sections"]["run"]["exit_code"] == 0
        done[mode] = results["sections"], json.loads((out / "truth.json").read_text()), out / "run"
    return done


@pytest.mark.parametrize("mode", ["item", "pageable", "compute"])
def test_the_anatomy_is_the_gpus_within_five_points_of_the_truth(runs, mode):
    sections, truth, _ = runs[mode]
    anatomy = sections["anatomy"]
    assert anatomy["clock"] == "gpu"
    for part in ("forward", "backward", "optimizer"):
        assert anatomy["percent"][part] == pytest.approx(truth["percent"][part], abs=TOLERANCE_PP), part
    if mode == "pageable":  # a DataLoader: its wait is data, the copy after it the step's other
        assert anatomy["percent"]["data"] == pytest.approx(truth["percent"]["data"], abs=TOLERANCE_PP)
    assert anatomy["step_ms"] == pytest.approx(truth["step_ms"], rel=0.15)


def test_a_compute_bound_step_is_not_called_an_optimizer_wait(runs):
    """The host's clock gives the GPU's time to wherever the full launch queue blocks it."""
    anatomy = runs["compute"][0]["anatomy"]
    assert anatomy["percent"]["backward"] > anatomy["percent"]["optimizer"]
    assert sum(anatomy["percent"][p] for p in ("forward", "backward", "optimizer")) > 90


def test_each_sync_is_counted_with_the_line_that_made_it(runs):
    gpu = runs["item"][0]["gpu"]
    assert gpu["anatomy"]["syncs_per_step"] == pytest.approx(1, abs=0.05)
    top = gpu["sync_lines"][0]
    assert os.path.basename(top["script_file"]) == SCRIPT.name and top["script_line"] == line_of("SYNC")
    pageable = runs["pageable"][0]["gpu"]
    assert pageable["anatomy"]["syncs_per_step"] >= 1
    assert line_of("COPY") in {x["script_line"] for x in pageable["sync_lines"]}
    assert runs["compute"][0]["gpu"]["anatomy"]["syncs_per_step"] == 0


def test_copies_from_pageable_memory_are_seen_in_the_profiled_steps(runs):
    (window,) = runs["pageable"][0]["gpu"]["profiled"]
    assert window["summary"]["h2d_pageable_pct"] > 90
    busy = runs["compute"][0]["gpu"]["profiled"][0]["summary"]["busy_pct"]
    assert busy > 90  # a compute-bound loop keeps the GPU busy


def test_flops_utilisation_and_memory_sites_are_measured(runs):
    sections, _, run = runs["compute"]
    mfu = sections["gpu"]["mfu"]
    assert 0 < mfu["mfu"] <= 1 and mfu["peaks"]
    memory = sections["gpu"]["memory"]
    assert memory and memory[0]["sites"] and (run / memory[0]["snapshot"]).exists()


def test_the_doctor_tries_pinned_non_blocking_copies_and_gpu_autocast_on_a_pageable_loop(tmp_path, monkeypatch):
    """A loop whose batches come from a DataLoader of unpinned tensors, copied with blocking
    `.to(device)`: the baseline counts its two blocking pageable copies a step, the pinned-copies
    candidate is predicted from the host's wait in them and measured; bf16 autocast is the GPU's,
    from the matrix products' device time, or said why not."""
    from dlscope.options import DoctorOptions, RunOptions, StepOptions
    from dlscope.runner import Plan, run_command

    monkeypatch.chdir(tmp_path)
    command = [sys.executable, str(SCRIPT), str(tmp_path / "truth.json"), "--mode", "pageable", "--steps", "400"]
    options = DoctorOptions(command, budget_s=60.0, max_steps=40, rounds=2)
    plan = Plan(
        "doctor", ["doctor"], options=RunOptions(out=str(tmp_path / "run")), step_options=StepOptions(doctor=options)
    )
    section = run_command(plan, render=False)["sections"]["doctor"]
    copies = section["baseline"]["facts"]["copies"]
    assert copies["calls"] == 2 * copies["steps"] and copies["blocking"] == copies["calls"] and copies["pinned"] == 0
    judged = {c["key"]: c for c in section["candidates"]}
    pinned = judged["pin_memory"]
    assert pinned["predicted"] > 1 and pinned["basis"]["copies_per_step"] == 2
    assert pinned["measured"]["verdict"] in ("faster", "same", "slower")
    autocast = judged.get("autocast") or next(s for s in section["not_tried"] if s["key"] == "autocast")
    assert autocast.get("change", {}).get("autocast_device", "cuda") == "cuda"
