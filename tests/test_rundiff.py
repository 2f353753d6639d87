"""`dlscope diff RUN_A RUN_B` on real runs of an input-bound script (tests/scripts/known_truth.py:
a 2 ms read and a 1 ms busy-wait decoding in __getitem__, a forward that waits as a host waits for its GPU):
more DataLoader workers are named as a change of the data part, beyond its noise; two runs of the
same configuration, made side by side (so a busy machine slows both alike), show no change; bad
input is one line naming the file, exit 2."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dlscope.analysis.stepfile import StepFile
from dlscope.cli import main
from dlscope.report.sections import SECTIONS
from dlscope.report.terminal import print_blocks
from dlscope.rundir import load_results
from dlscope.stages import rundiff
from dlscope.stages.rundiff import compare

pytestmark = pytest.mark.timing  # runs compared with each other; the module's runs made once, in one worker

SCRIPTS = Path(__file__).parent / "scripts"
PROFILE = ["--profile-steps", "2", "--wait", "1", "--warmup", "1"]


def run_command(out: Path, workers: int) -> list[str]:
    script = [sys.executable, str(SCRIPTS / "known_truth.py"), str(out) + "-truth.json", "--decode-ms", "1"]
    script += ["--read-ms", "2"]  # workers overlap the read even when every core is busy (a shared machine)
    script += ["--forward-waits", "--workers", str(workers), "--steps", "100"]
    return [sys.executable, "-m", "dlscope.cli", "run", "--out", str(out), *PROFILE, "--", *script]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """w0, w2: 0 then 2 workers, one after the other; same1, same2: 0 workers, both at once."""
    root = tmp_path_factory.mktemp("rundiff")
    found = {name: root / name for name in ("w0", "w2", "same1", "same2")}
    for name in ("w0", "w2"):
        subprocess.run(run_command(found[name], int(name[1])), check=True, capture_output=True)
    pair = [subprocess.Popen(run_command(found[name], 0), stdout=subprocess.DEVNULL) for name in ("same1", "same2")]
    assert [p.wait() for p in pair] == [0, 0]
    return found


@pytest.mark.slow
def test_more_workers_are_named_as_the_data_part_beyond_noise(runs, capsys):
    section = compare(runs["w0"], runs["w2"])
    parts = {r["part"]: r for r in section["parts"]}
    data = parts["data"]
    said = json.dumps(section["parts"], indent=1)  # what the diff saw, when it fails on a busy machine
    assert data["significant"] and data["high_ms"] < 0, said  # the whole band below zero: faster, beyond noise
    changed = section["findings"][0]["values"]["changed"]
    assert changed[0]["part"] == "data", said  # the largest change of all parts
    assert section["step"]["significant"] and section["step"]["speedup_low"] > 1
    assert section["findings"][0]["key"] == "rundiff.faster"
    assert section["operators"] is not None  # both have a profiler top-10
    assert section["io"] is None  # neither ran with --trace-io
    assert main(["diff", str(runs["w0"]), str(runs["w2"])]) == 1  # the step time changed
    out = capsys.readouterr().out
    assert "B's step is" in out and "faster" in out and "data went from" in out


@pytest.mark.slow
def test_two_runs_of_the_same_configuration_show_no_change(runs, capsys):
    section = compare(runs["same1"], runs["same2"])
    said = json.dumps(section["parts"], indent=1)
    assert [r["part"] for r in section["parts"] if r["significant"]] == [], said
    assert not section["step"]["significant"]
    assert section["findings"][0]["key"] == "rundiff.same_step"
    assert main(["diff", str(runs["same1"]), str(runs["same2"])]) == 0
    assert "No significant difference in step time" in capsys.readouterr().out


@pytest.mark.slow
def test_the_floor_only_adds_to_the_band(runs):
    # with no floor, a part is a change exactly when its band excludes zero
    for row in compare(runs["w0"], runs["w2"], min_change_pct=0.0)["parts"]:
        assert row["significant"] == row["beyond_noise"]


@pytest.mark.slow
def test_the_parts_are_the_anatomy_of_each_run(runs):
    # the same steady steps and the same own-cost correction as the run's own step anatomy
    section = compare(runs["w0"], runs["w2"])
    for side, run in (("a", "w0"), ("b", "w2")):
        anatomy = load_results(runs[run])["sections"]["anatomy"]
        assert section[side]["steps"] == anatomy["steps_used"]
        for row in section["parts"]:
            assert row[f"{side}_ms"] == pytest.approx(anatomy["mean_ms"][row["part"]], rel=1e-3, abs=1e-3)
        assert section["step"][f"{side}_ms"] == pytest.approx(
            anatomy["step_ms"] - anatomy["dlscope_us_per_step"] / 1e3, abs=1e-3
        )


@pytest.mark.slow
def test_json_and_the_report_section(runs, capsys, tmp_path):
    assert main(["diff", str(runs["w0"]), str(runs["w2"]) + "/results.json", "--json"]) == 1
    printed = json.loads(capsys.readouterr().out)
    assert printed["step"]["speedup"] > 1 and printed["b"]["path"] == str(runs["w2"])
    # registered as a report section: a run directory holding it renders it in report.html and .md
    from rich.console import Console

    from dlscope.report.render import render_report

    console = Console(width=80, record=True, color_system=None)
    print_blocks(SECTIONS["rundiff"].render(printed), console)
    lines = console.export_text().splitlines()
    assert max(len(line) for line in lines) <= 80 and any("data (inside a data source)" in line for line in lines)
    copy = tmp_path / "with-diff"
    shutil.copytree(runs["w0"], copy)
    results = json.loads((copy / "results.json").read_text())
    results["sections"]["rundiff"] = printed
    results["steps"].append("rundiff")
    (copy / "results.json").write_text(json.dumps(results))
    html, md = render_report(copy)
    assert "Run diff" in md.read_text() and "data went from" in html.read_text()


def bad(tmp_path: Path, runs: dict[str, Path], how: str) -> tuple[Path, str]:
    """A copy of a real run, spoilt one way; the file the error must name."""
    copy = tmp_path / how
    shutil.copytree(runs["w0"], copy)
    results_file = copy / "results.json"
    results = json.loads(results_file.read_text())
    steps = copy / results["sections"]["steps"]["file"]
    if how == "not-a-run":
        results_file.unlink()
        return copy, str(copy)
    if how == "newer-schema":
        results["schema_version"] = 99
    elif how == "another-kind":
        results["run"]["command"] = "train"
        del results["sections"]["steps"]
    elif how == "no-steps-file":
        steps.unlink()
        return copy, str(steps)
    elif how == "malformed-census":
        results["sections"]["steps"]["subnormals"] = [{"steps": 1}]
    elif how == "not-a-steps-file":
        steps.write_bytes(b"PK\x03\x04 not a step file")
        return copy, str(steps)
    results_file.write_text(json.dumps(results))
    return copy, str(results_file)


@pytest.mark.slow
@pytest.mark.parametrize(
    "how", ["not-a-run", "newer-schema", "another-kind", "no-steps-file", "not-a-steps-file", "malformed-census"]
)
def test_bad_input_is_one_line_naming_the_file(runs, tmp_path, capsys, how):
    spoilt, named = bad(tmp_path, runs, how)
    for args in ([str(runs["w0"]), str(spoilt)], [str(spoilt), str(runs["w0"]), "--json"]):
        assert main(["diff", *args]) == 2
        captured = capsys.readouterr()
        assert captured.out == "" and "Traceback" not in captured.err
        assert len(captured.err.strip().splitlines()) == 1 and named in captured.err


def traced_run(tmp_path: Path, side: str) -> tuple[Path, dict]:
    """What `dlscope run --trace-io` recorded of known_truth.py with 0 (a) and 2 (b) workers
    (tests/fixtures/rundiff: its iotrace phases and some rows of files.csv), in a run directory here."""
    fixture = Path(__file__).parent / "fixtures" / "rundiff" / side
    run = tmp_path / side
    (run / "iotrace").mkdir(parents=True)
    csv_text = (fixture / "iotrace" / "files.csv").read_text().replace("{run}", str(run))
    (run / "iotrace" / "files.csv").write_text(csv_text)
    return run, json.loads((fixture / "sections.json").read_text())


def test_system_calls_and_files_that_changed_most(tmp_path):
    (a_run, a), (b_run, b) = traced_run(tmp_path, "a"), traced_run(tmp_path, "b")
    io = rundiff.io(a, b, (a_run, b_run))
    calls = [abs(r["b_count"] - r["a_count"]) for r in io["syscalls"]]
    assert calls == sorted(calls, reverse=True) and calls[0] > 0  # the largest change in calls first
    files = {r["path"]: r for r in io["files"]}
    # the DataLoader's workers: their modules are read in B only, or more often
    worker = next(r for path, r in files.items() if path.endswith("torch/utils/data/_utils/worker.py"))
    assert worker["b_calls"] > worker["a_calls"]
    # dlscope's own files are not the job's, and the job's pids are spelled alike in both runs
    assert not [p for p in files if p.startswith((str(a_run), str(b_run))) or "dlscope-calibrate" in p]
    assert not [p for p in files if re.match(r"/proc/\d+/", p)]
    assert rundiff.io(a, {"sections": {}}, (a_run, b_run)) is None  # B not traced: nothing compared


@pytest.mark.slow
def test_a_short_run_is_said_to_give_a_wide_band(runs, tmp_path, capsys):
    # the first 8 steps of a real run (a run cut short): too few steady steps for a narrow band
    short = tmp_path / "short"
    shutil.copytree(runs["w0"], short)
    steps = short / json.loads((short / "results.json").read_text())["sections"]["steps"]["file"]
    header = StepFile(steps)
    steps.write_bytes(steps.read_bytes()[: header.offset + 8 * header.dtype.itemsize])
    section = compare(short, runs["w2"])
    assert section["a"]["few_steps"] and not section["b"]["few_steps"]
    assert "rundiff.few_steps" in [f["key"] for f in section["findings"]]
    main(["diff", str(short), str(runs["w2"])])
    assert "Few steady steps in A" in capsys.readouterr().out
