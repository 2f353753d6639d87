"""The profiler's window of `dlscope run` over real steps: what it records as a step is a training
step (an evaluation or a checkpoint inside the window is apart, in the top-10 and on the
timeline), and a window cut by the recording cap is counted as it ran. The script
(tests/scripts/epoch_eval_save.py) writes its own steps, validations and saves."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from dlscope.analysis import timeline
from dlscope.cli import main
from dlscope.injob.hooks import PROFILE_BUDGET_S
from dlscope.rundir import load_results

SCRIPT = Path(__file__).parent / "scripts" / "epoch_eval_save.py"
VALIDATION_ONLY = {"aten::topk", "aten::cdist", "aten::_cdist_forward", "aten::_euclidean_dist"}


def observe(tmp_path: Path, schedule: tuple[str, ...], *args: str) -> tuple[dict, dict, Path, dict]:
    """The run's sections, the script's truth, the run directory, the main process's profile record."""
    out, truth = tmp_path / "run", tmp_path / "truth.json"
    assert main(["run", "--out", str(out), *schedule, "--", sys.executable, str(SCRIPT), str(truth), *args]) == 0
    sections = load_results(out)["sections"]
    main_pid = sections["steps"]["main_pid"]
    records = [json.loads(line) for line in (out / "processes" / f"{main_pid}.jsonl").read_text().splitlines()]
    profile = next(r for r in records if r.get("k") == "profile")
    return sections, json.loads(truth.read_text()), out, profile


def profiler_steps_inside_steps(out: Path, sections: dict) -> list[timeline.Slice]:
    """The timeline's profiler steps, each checked to lie inside a training step of its own."""
    trace = timeline.load(out / sections["run"]["timeline"])
    assert timeline.nesting_errors(trace) == []
    pid = sections["steps"]["main_pid"]
    steps, marks = trace.tracks_named(pid, "steps"), trace.tracks_named(pid, "profiler steps")
    assert all(timeline.inside(m.start, m.end, steps, tolerance_us=1.0) for m in marks)
    return marks


@pytest.mark.slow
def test_an_evaluation_and_a_checkpoint_inside_the_window_are_no_profiled_step(tmp_path):
    # 4 steps an epoch, each followed by a validation and a save; steps 3-7 recorded: the first
    # epoch's last step, its validation and save, then the next epoch's four steps
    schedule = ("--start-after", "1", "--wait", "1", "--warmup", "1", "--profile-steps", "5")
    sections, truth, out, profile = observe(tmp_path, schedule, "--epochs", "3", "--steps", "4")
    top = sections["top10"]
    window = top["windows"][0]
    assert (top["active_steps"], window["first_step"], window["last_step"]) == (5, 3, 7)
    # the validation's operators are not the training's (before, topk was third of its top-10)
    assert not VALIDATION_ONLY & {r["name"] for r in top["rows"]}
    # each step as many operators as the others (before, the step after the validation held ~10×);
    # step 4 also begins its epoch: the training loader's iter() is its data
    per_step = {r["step"]: r["ops"] for r in top["ops_per_step"]}
    assert max(per_step.values()) <= 1.05 * min(per_step.values())
    assert list(per_step) == [3, 4, 5, 6, 7]
    # on the timeline each profiled step lies inside its step, none over the validation or the save
    marks = profiler_steps_inside_steps(out, sections)
    assert len(marks) == 5
    trace = timeline.load(out / sections["run"]["timeline"])
    apart = [p for p in trace.tracks_named(window["pid"], "phases") if p.name in ("eval", "checkpoint_save")]
    assert apart and not any(m.start < p.end - 1 and p.start < m.end - 1 for m in marks for p in apart)  # (µs)
    # the recorded steps are the script's own steps 3-7, and none holds a validation or a save
    # (each begins outside every step: the step after them starts where the save returned)
    for index, _, start, end in profile["recorded"]:
        step = truth["steps"][index]
        assert start <= step[1] and step[0] <= end
        assert not any(start < begun < end for begun, _ in truth["evals"] + truth["saves"])
    assert not VALIDATION_ONLY & {op["key"] for op in profile["ops"]}
    # shown apart: what ran between the steps, and its operators
    assert {"aten::topk", "aten::cdist"} <= {op["key"] for op in profile["between_ops"]}
    phases = [(p["phase"], p["after_step"]) for p in top["between"]["phases"]]
    assert phases == [("eval", 3), ("checkpoint_save", 3)]
    assert "an evaluation and a checkpoint save after step 3" in (out / "report.md").read_text()


@pytest.mark.slow
def test_a_window_the_recording_cap_cuts_counts_the_steps_it_recorded(tmp_path):
    # 1.3 s steps: the cap stops the window at the step end past 5 s of recording, after 4 steps
    # or fewer (on a loaded machine a step can take longer)
    schedule = ("--start-after", "1", "--wait", "0", "--warmup", "1", "--profile-steps", "5")
    sections, truth, out, profile = observe(tmp_path, schedule, "--epochs", "1", "--steps", "7", "--step-sleep", "1.3")
    top = sections["top10"]
    window = top["windows"][0]
    first, last = window["first_step"], window["last_step"]
    # torch's own trace holds one ProfilerStep mark per recorded step (before, one more, empty,
    # opened past the last step), and the count is the steps' (before, 5 for steps 2-5)
    raw = json.loads((out / top["trace"]).read_text())["traceEvents"]
    marks = [e for e in raw if str(e.get("name", "")).startswith("ProfilerStep#")]
    assert first == 2 and top["active_steps"] == last - first + 1 == len(marks) < 5
    assert len(profiler_steps_inside_steps(out, sections)) == len(marks)
    assert [r["step"] for r in top["ops_per_step"]] == list(range(first, last + 1))
    assert all(r["ops"] for r in top["ops_per_step"])
    report = (out / "report.md").read_text()
    assert f"over {len(marks)} profiled steps (steps {first}–{last}; the window stopped there" in report
    assert profile["cut"] == PROFILE_BUDGET_S and [r[0] for r in profile["recorded"]] == list(range(first, last + 1))
    assert len(truth["steps"]) == sections["steps"]["count"] == 7
