"""Steps that slow down for good, and whether subnormal floats are why (injob/subnormals.py):
known-truth scripts under `dlscope run`, their census read back from the run's results and report."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from dlscope.analysis.stepfile import StepFile
from dlscope.analysis.steptable import open_stream, steady_steps
from dlscope.report.blocks import fmt
from test_run_ecosystem import SCRIPTS, observe

SCRIPT = [sys.executable, str(SCRIPTS / "subnormal_steps.py")]


def report_text(tmp_path: Path) -> str:
    return " ".join((tmp_path / "run" / "report.md").read_text().split())


def test_steps_slowed_by_subnormal_inputs_are_named_with_the_operator_that_made_them(tmp_path, capfd):
    """From a known step the script's inputs are scaled by 1e-39. What that costs is the CPU's:
    ~40-70× the CPU time a step on the Intel Xeon that computes them in microcode, nothing on an AMD
    EPYC that computes them at full speed. The script measures it on this machine (its `penalty`),
    and the verdict must follow from it. Where the steps slowed well past the watch's 4×: one
    census, on a step after the slowdown, counts the multiply's 65,536 outputs all subnormal, and
    the report says what to change, with the step time before the slowdown as the prediction.
    Where they kept their pace: no census and no advice. Near 4× either, each as it should."""
    sections, truth = observe(tmp_path, capfd, [*SCRIPT, "subnormal"])
    penalty, censuses = float(truth["penalty"]), sections["steps"].get("subnormals", [])
    report = report_text(tmp_path)
    # the watch takes a census once the steps' CPU time reaches 4× its lowest (docs/commands/run.md)
    if penalty >= 6:
        assert censuses, truth
    elif penalty <= 2:
        assert not censuses, (truth, censuses)
    if not censuses:
        assert "set_flush_denormal" not in report and "census" not in report
        return
    (census,) = censuses
    assert census["step"] > int(truth["at"]) and census["steps"] == 1
    made = {o["op"]: o for o in census["ops"]}
    assert made["aten::mul"]["subnormal"] == made["aten::mul"]["values"] == 256 * 256
    assert census["subnormal"] >= 256 * 256 and census["sampled"] > census["subnormal"]
    after = float(truth["after_ms"])
    assert census["slowed_cpu_ms"] > 4 * census["lowest_cpu_ms"] and census["lowest_ms"] < after
    assert "made by aten::mul (100% of its 65,536 values, 1 call)" in report
    assert "torch.set_flush_denormal(True) at the start of the script" in report
    assert f"Predicted: ~{fmt(census['lowest_ms'])} ms" in report  # as the report writes it (10.76, not 10.8)
    # the census step's counting cost is dlscope's: out of the anatomy, marked wherever it is listed
    steps = StepFile(sections["steps"]["file"])
    table = open_stream(steps)[1]
    steady = steady_steps(table, np.arange(len(table)), steps.codes)
    assert steady[table["i"] == census["step"]].all()  # steady but for the census
    assert sections["anatomy"]["census_steps"] == 1
    assert sections["anatomy"]["steps_used"] == np.count_nonzero(steady) - 1
    listed = sections["steps"]["slowest"] + sections["steps"]["edge_rows"]
    assert all(r["census"] == (r["step"] == census["step"]) for r in listed)
    assert "not the 1 step(s) a subnormal census ran in" in report


def test_steps_that_need_more_cpu_without_subnormals_are_said_not_to_be_them(tmp_path, capfd):
    sections, truth = observe(tmp_path, capfd, [*SCRIPT, "busy"])
    (census,) = sections["steps"]["subnormals"]
    assert census["step"] > int(truth["at"]) and census["subnormal"] == 0 and census["sampled"] > 0
    assert census["slowed_cpu_ms"] > 2 * census["lowest_cpu_ms"]
    assert f"none of {census['sampled']:,} values was subnormal: not subnormal floats" in report_text(tmp_path)


@pytest.mark.parametrize("mode", ["flush", "sleep"])
def test_steps_with_no_subnormals_get_no_advice_on_them(tmp_path, capfd, mode):
    """With flush-to-zero the scaled inputs are zeros: the steps keep their pace (their CPU time a
    step; their wall time is also the machine's load: 2.0 → 16.8 ms at a load of 10 on 2 cores).
    Steps that sleep (as on a busier machine) take longer, and their CPU time grows only by what
    waking costs (cold caches: ~2.5× on a 1 ms step here, more under load). No census of either
    finds a subnormal."""
    sections, truth = observe(tmp_path, capfd, [*SCRIPT, mode])
    if mode == "sleep":
        assert float(truth["after_ms"]) > 3 * float(truth["before_ms"])
    else:
        assert float(truth["penalty"]) <= 3
    assert all(c["subnormal"] == 0 for c in sections["steps"].get("subnormals", []))
    assert "set_flush_denormal" not in report_text(tmp_path)


def test_a_census_left_under_another_dispatch_mode_stops_counting_and_says_so():
    """A mode the script enters during the census step and keeps on: the census cannot leave the
    stack under it; it stays there counting nothing, and its record says why."""
    import time

    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from dlscope.injob.subnormals import SlowdownWatch, census_mode
    from dlscope.report.sections.steps import subnormal_finding

    class Passing(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    written: list[dict] = []
    watch = SlowdownWatch(torch, written.append)
    census = census_mode(torch)
    census.__enter__()
    watch.running = (census, 13, time.time(), (0.001, 0.001), (0.005, 0.005))
    above = Passing()
    above.__enter__()
    try:
        torch.ones(4) * 1e-39  # in the census step: counted (the mode above passes it down)
        assert watch(13, time.time()) is False
        torch.ones(4) * 1e-39  # after the census step: not counted
    finally:
        above.__exit__(None, None, None)
        census.__exit__(None, None, None)
    (record,) = written
    assert record["error"] == "mode_above" and record["subnormal"] == 4
    assert census.census.ops["aten::mul"][3] == 4
    level, text = subnormal_finding(record)
    assert level == "info" and "it stopped counting (another dispatch mode was entered above it)" in text


def test_a_child_forked_during_a_census_step_leaves_the_census():
    """A DataLoader's workers forked by a census step's iter() inherit the forking thread's
    dispatch modes: the child's watch takes the census off its stack, and counts nothing there."""
    import os

    import torch
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    from dlscope.injob.subnormals import SlowdownWatch, census_mode

    watch = SlowdownWatch(torch, lambda record: None)
    census = census_mode(torch)
    census.__enter__()
    watch.running = (census, 13, 0.0, (0.001, 0.001), (0.005, 0.005))
    try:
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: its watch made as hooks.after_fork makes it
            child = watch.forked()
            torch.ones(4) * 2
            left = _get_current_dispatch_mode() is None and child.running is None
            os.write(write, b"left" if left and "aten::mul" not in census.census.ops else b"stayed")
            os._exit(0)
        os.close(write)
        said = os.read(read, 16)
        os.waitpid(pid, 0)
    finally:
        census.__exit__(None, None, None)
    assert said == b"left"
