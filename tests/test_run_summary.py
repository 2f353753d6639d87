"""`dlscope run` answers in one screen: at 80 columns its terminal output is a summary of at most 40
lines, what bounds the step first, then the change most likely to pay and `dlscope doctor` to
measure it, the warnings, and where the report is; every table and the reasoning stay in
report.md (and `--verbose` / `dlscope report --full` print them), and sentences on dlscope's own
cost and method are in "How this was measured", never in the summary. Real runs of the docs'
scripts; the registration of findings with synthetic results."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from dlscope.cli import main
from dlscope.report.blocks import Method, Table, fmt
from dlscope.report.render import build_sections
from dlscope.report.runsummary import MAX_WARNINGS, summary_blocks
from dlscope.rundir import SCHEMA_VERSION, load_results

SCRIPTS = Path(__file__).parent / "scripts"
ONE_SCREEN = 40  # lines at 80 columns
VERDICT_WITHIN = 6  # lines after the summary's rule: the verdict is among them
RULE = re.compile(r"^(\S.*?) ─{3,}$")
TOLERANCE_PP = 3.0  # the summary's data share against the script's own clock (test_run_verdicts' bound)


def rules(text: str) -> list[str]:
    return [m.group(1) for line in text.splitlines() if (m := RULE.match(line))]


def dlscopes_lines(stdout: str) -> list[str]:
    """What dlscope printed: the command's own output lies between the observed command's rule and
    the summary's."""
    lines = stdout.splitlines()
    observed = next(i for i, line in enumerate(lines) if line.startswith("The observed command ─"))
    summary = next(i for i, line in enumerate(lines) if line.startswith("Summary ─"))
    return lines[: observed + 1] + lines[summary:]


def assert_every_table_in_the_report(out: Path) -> None:
    """Each section's tables, caption and header row, in report.md; its method sentences under "How
    this was measured", and none of them in the summary."""
    markdown = (out / "report.md").read_text()
    results = load_results(out)
    tables = 0
    for section in build_sections(results):
        for block in section.blocks:
            if isinstance(block, Table):
                tables += 1
                if block.caption:
                    assert f"*{block.caption}*" in markdown, block.caption
                header = "| " + " | ".join(block.columns) + " |"
                assert header in markdown, (section.title, header)
            if isinstance(block, Method):
                method = markdown[markdown.index("## How this was measured") :]
                assert block.text in method, block.text
    assert tables >= 5
    summary = markdown[markdown.index("## Summary") : markdown.index('<a id="run">')]
    assert "own cost" not in summary and "calibrated" not in summary


@pytest.mark.slow
def test_the_summary_is_one_screen_verdict_first_and_the_report_keeps_every_table(tmp_path, capsys):
    # the docs' `dlscope run` example (docs/commands/run.md), smaller, in its own process at 80 columns
    out = tmp_path / "run"
    script = [sys.executable, str(SCRIPTS / "mnist_basic.py"), "--train", "256", "--test", "100", "--epochs", "1"]
    script += ["--batch-size", "32", "--workers", "1"]
    profile = ["--profile-steps", "2", "--wait", "1", "--warmup", "1"]
    proc = subprocess.run(
        [sys.executable, "-m", "dlscope.cli", "run", "--out", str(out), *profile, "--", *script],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "COLUMNS": "80"},
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    ours = dlscopes_lines(proc.stdout)
    assert len(ours) <= ONE_SCREEN, "\n".join(ours)
    wide = [line for line in ours if len(line) > 80 and str(out) not in line]  # a path is printed whole
    assert wide == []
    assert rules(proc.stdout) == ["The observed command", "Summary"]  # no section's tables on the terminal
    summary = ours[ours.index(next(line for line in ours if line.startswith("Summary ─"))) :]
    verdict = next(i for i, line in enumerate(summary) if "bounds the step" in line)
    assert verdict <= VERDICT_WITHIN, summary
    anatomy = load_results(out)["sections"]["anatomy"]
    said = " ".join(" ".join(summary).split())
    assert f"of the {fmt(anatomy['step_ms'])} ms mean step" in said  # its numbers are the anatomy's
    assert f"dlscope doctor -- {' '.join(script)}" in said.replace("\n", " ")
    assert "where everything is" in said and str(out / "report.html") in said
    assert "own cost" not in said and "x-ray" not in said
    assert_every_table_in_the_report(out)

    # the whole report on the terminal: the summary first, then every section, then how it was measured
    assert main(["report", "--full", str(out)]) == 0
    full = capsys.readouterr().out
    titles = rules(full)
    assert titles[0] == "Summary" and titles[-1] == "How this was measured"
    assert {"The observed command", "Training steps", "Step anatomy", "Phases"} <= set(titles)
    assert "Step time (ms) over all steps" in full and "slowest steps (ms)" in full


@pytest.mark.slow
def test_an_input_bound_run_says_so_first_with_the_scripts_share_and_the_change(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    truth, out = tmp_path / "truth.json", tmp_path / "run"
    script = [sys.executable, str(SCRIPTS / "known_truth.py"), str(truth), "--loader", "decode"]
    script += ["--decode-ms", "2", "--workers", "0", "--steps", "40"]
    assert main(["run", "--verbose", "--out", str(out), "--profile-steps", "0", "--", *script]) == 0
    printed = capsys.readouterr().out
    titles = rules(printed)
    assert titles[:2] == ["The observed command", "Summary"] and titles[-1] == "How this was measured"
    assert "Step anatomy" in titles and "Batches: the data flow, batch by batch" in titles  # --verbose: every section
    start = printed.index("Summary ─")
    summary = printed[start : printed.index("The observed command ─", start)]  # then the sections, in full
    said = " ".join(summary.split())
    share = re.search(r"Input bounds the step: the loop waits for a batch in the DataLoader ([\d.]+)%", said)
    assert share, said
    assert float(share.group(1)) == pytest.approx(json.loads(truth.read_text())["data_pct"], abs=TOLERANCE_PP)
    assert "Most likely to pay: more DataLoader workers (num_workers=0 now)" in said
    assert f"dlscope doctor -- {' '.join(script)}" in said
    assert_every_table_in_the_report(out)


def results_with(*sections: tuple[str, dict]) -> dict:
    """A `dlscope run`'s results holding these sections besides a run that exited 0."""
    run = {"command": ["python", "train.py"], "exit_code": 0, "wall_seconds": 3.0, "processes": []}
    found = {"run": run, **dict(sections)}
    return {"schema_version": SCHEMA_VERSION, "steps": list(found), "sections": found}


def summary_text(results: dict) -> str:
    from dlscope.report.blocks import Findings, Para

    said = []
    for block in summary_blocks(results):
        said += (
            [block.text]
            if isinstance(block, Para)
            else [t for _, t in block.items]
            if isinstance(block, Findings)
            else []
        )
    return "\n".join(said)


def cpu_anatomy(steps: int, step_ms: float, **percent: float) -> dict:
    """A host-clock anatomy of a loop with no DataLoader: each part's share of the step."""
    shares = {part: percent.get(part, 0.0) for part in ("data", "gap", "forward", "backward", "optimizer", "other")}
    return {"steps_used": steps, "percent": shares, "step_ms": step_ms, "data_source": None, "verdict": {"key": "gap"}}


def straggler(rank: int, level: str = "bad") -> dict:
    values = {"rank": rank, "last": 6, "of": 6, "median_gap_ms": 30.0, "step_pct": 40.0, "mean_step_ms": 75.0}
    return {"key": "distributed.straggler", "level": level, "values": values}


def test_a_finding_is_promoted_by_its_level_and_its_registered_key():
    promoted = summary_text(results_with(("distributed", {"findings": [straggler(1)]})))
    assert "Rank 1 is the straggler" in promoted
    # the same finding at a level the summary does not promote, and a key no section registers: not said
    quiet = summary_text(results_with(("distributed", {"findings": [straggler(1, "info")]})))
    assert "straggler" not in quiet
    unknown = {"key": "distributed.something_new", "level": "bad", "values": {}}
    assert summary_text(results_with(("distributed", {"findings": [unknown]}))).count("\n") == 0  # the headline alone


def test_alike_warnings_are_said_once_and_those_past_the_screens_share_counted():
    files = [{"path": f"/d/{k}", "bytes": 9, "ms": 5.0, "reads": 2, "batches": 1} for k in range(5)]
    batches = {"samples": {"outliers": []}, "files": {"outliers": files, "median_bytes": 9, "median_ms": 0.1}}
    said = summary_text(results_with(("batches", batches)))
    assert said.count("File /d/") == 1 and "(4 more like it in the report.)" in said
    exposed = {"rank": 0, "exposed_comm_pct": 40.0, "step_ms": 75.0, "straggler": 1}
    distributed = {"findings": [straggler(1), {"key": "distributed.exposed_comm", "level": "warn", "values": exposed}]}
    results = results_with(("distributed", distributed), ("batches", batches), ("phases", {"evals_in_train_mode": 2}))
    results["sections"]["run"]["interrupted"] = "SIGINT"
    said = summary_text(results)  # five kinds of warning: the first MAX_WARNINGS, failures first, then a count
    assert said.index("Rank 1 is the straggler") < said.index("Interrupted (Ctrl-C)")
    assert len(re.findall(r"^(Rank|Interrupted|File|\d+ evaluations)", said, re.M)) == MAX_WARNINGS
    assert said.endswith(f"{5 - MAX_WARNINGS} more warning in the report.")


def test_a_hang_comes_before_the_verdict_and_no_change_is_offered():
    hang = {
        "settings": {"hang_after": 3.0, "hang_factor": 20.0},
        "ended_job": True,
        "captures": [
            {
                "threshold_seconds": 3.0,
                "verdict": {
                    "idle_seconds": 3.4,
                    "stopped": [],
                    "collectives": [],
                    "blocked_io": [],
                    "died": [{"pid": 7, "rank": 1, "steps": 5, "exited_python": False}],
                },
            }
        ],
    }
    anatomy = cpu_anatomy(5, 20.0, forward=30.0, backward=60.0, optimizer=9.0, other=1.0)
    results = results_with(("anatomy", anatomy), ("hang", hang))
    results["sections"]["run"]["exit_code"] = 124
    said = summary_text(results)
    assert said.index("The job hung") < said.index("Compute bounds the step")
    assert "rank 1 (pid 7) died after step 5" in said and "dlscope doctor" not in said


def test_a_slowdown_that_stays_is_a_warning_and_the_threads_a_change_on_a_cpu():
    parts = {"data": [1.0, 1.0], "gap": [0.0, 0.0], "forward": [4.0, 14.0], "backward": [4.0, 4.0]}
    parts |= {"optimizer": [1.0, 1.0], "other": [0.0, 0.0]}
    change = {"step": 120, "start_s": 31.0, "before_ms": 10.0, "after_ms": 20.0, "parts_ms": parts, "forwards": [1, 1]}
    steps = {
        "count": 300,
        "main_pid": 7,
        "processes": [{"pid": 7, "count": 300}],
        "percentiles_ms": {"p50_ms": 12.0},
        "change_points": [change],
        "threads": {"threads": 2, "cores": 8},
    }
    anatomy = cpu_anatomy(290, 14.0, data=5.0, forward=60.0, backward=25.0, optimizer=9.0, other=1.0)
    said = summary_text(results_with(("steps", steps), ("anatomy", anatomy)))
    assert "The step slowed for good from step 120 (31 s in): median 10.00 → 20.00 ms (2×), in forward." in said
    assert "Most likely to pay: torch.set_num_threads(8): the training process computes with 2 intra-op threads" in said
    on_gpu = summary_text(results_with(("steps", steps), ("anatomy", anatomy | {"clock": "gpu"})))
    assert "set_num_threads" not in on_gpu and "No one change stands out" in on_gpu


def test_steps_ending_at_backward_give_no_optimizer_share_and_say_where_the_update_is():
    """A word-language-model loop (pytorch/examples) updates its weights with `p.data.add_` outside
    no_grad: no optimizer step is seen, steps end at backward(), and 0% optimizer would be a share
    nobody measured; the update is in the time before the next forward."""
    steps = {"count": 180, "main_pid": 7, "processes": [{"pid": 7, "count": 180}], "percentiles_ms": {"p50_ms": 18.6}}
    steps["change_points"] = []
    anatomy = cpu_anatomy(172, 18.9, gap=6.0, forward=42.0, backward=52.0)
    said = summary_text(results_with(("steps", steps | {"source": "backward"}), ("anatomy", anatomy)))
    assert "Compute bounds the step: forward 42%, backward 52% of the 18.90 ms mean step." in said
    assert "optimizer 0%" not in said and "writes itself outside torch.no_grad() is in the 6% before" in said
    with_optimizer = summary_text(results_with(("steps", steps | {"source": "optimizer"}), ("anatomy", anatomy)))
    assert "backward 52%, optimizer 0%" in with_optimizer and "No optimizer step" not in with_optimizer
