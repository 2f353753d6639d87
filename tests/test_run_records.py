"""`dlscope run`'s step file and what is drawn from it, fed with rows written the way the hooks
write them (RecordFile.write_step) or generated in bulk: size per step, readers, summaries of
fixed size at any length, change points, the verdict's facts. No subprocess, no torch."""

from __future__ import annotations

import json
import os

import numpy as np
import pandas as pd
import pytest

from dlscope.analysis import observed as analysis
from dlscope.analysis import steptable
from dlscope.analysis.stepfile import StepFile, read_records
from dlscope.contract.env import STRICT_ENV
from dlscope.contract.records import STEP_STRUCT, STEPS_WINDOW, steps_header
from dlscope.injob.recorder import RecordFile
from dlscope.report.sections import steps as steps_section


def step(i: int, start: float, seconds: float = 0.01, **fields) -> dict:
    base = dict(
        i=i,
        src="optimizer",
        start=start,
        end=start + seconds,
        data=0.002,
        data_source="loader",
        forward=0.003,
        backward=0.003,
        optimizer=0.001,
        peak_rss=200 * 2**20,
        peak_cuda=None,
        profiled=None,
        profiler_seconds=0.0,
        tid=7,
    )
    return {**base, **fields}


def bulk(path, seconds: np.ndarray, loader: bool = True, data_fraction: float = 0.2, **parts: np.ndarray) -> StepFile:
    """A step file of len(seconds) steps, written as the hooks' rows would be (in one go): data
    `data_fraction` of each step, forward 0.3 of it (or `parts`, seconds), the rest "other"."""
    path.write_bytes(steps_header())
    header = StepFile(path)
    rows = np.zeros(len(seconds), header.dtype)
    rows["i"] = np.arange(len(seconds))
    rows["start"] = 1.7e9 + np.concatenate([[0.0], np.cumsum(seconds[:-1])])
    rows["seconds"] = seconds
    rows["data"] = seconds * data_fraction
    rows["forward"] = seconds * 0.3
    for name, values in parts.items():
        rows[name] = values
    rows["data_source"] = header.codes["data_source"].index("loader" if loader else "gap")
    rows["peak_rss_kib"] = 1000
    rows["peak_cuda_kib"] = 0xFFFFFFFF
    with open(path, "ab") as f:
        f.write(rows.tobytes())
    return StepFile(path)


def test_each_step_is_one_small_row_that_numpy_and_pandas_read(tmp_path):
    records = RecordFile(str(tmp_path))
    for i in range(5):
        records.write_step(**step(i, 1.7e9 + i * 0.01, profiled="active" if i == 3 else None))
    assert StepFile(tmp_path / f"{os.getpid()}.steps").count == 5  # read while the process runs
    records.close_steps()  # at exit: the file cut to its last row
    steps = StepFile(tmp_path / f"{os.getpid()}.steps")
    assert steps.count == 5 and steps.dtype.itemsize <= 64
    size = (tmp_path / f"{os.getpid()}.steps").stat().st_size
    assert size - steps.offset == 5 * steps.dtype.itemsize
    frame = pd.DataFrame(steps.read())
    assert frame["i"].tolist() == [0, 1, 2, 3, 4]
    assert np.allclose(frame["seconds"], 0.01, rtol=1e-6)
    assert frame["peak_rss_kib"].tolist() == [200 * 1024] * 5 and (frame["peak_cuda_kib"] == 0xFFFFFFFF).all()
    assert [steps.codes["profiled"][c] for c in frame["profiled"]] == [None, None, None, "active", None]
    assert read_records(tmp_path) == {os.getpid(): []}  # no JSON line per step


def test_rows_are_read_back_across_windows_before_and_after_exit(tmp_path):
    """The mapped window moves along as it fills; a process killed before its exit leaves the
    window's unwritten room (zero rows), which is not read."""
    records = RecordFile(str(tmp_path))
    n = 3 * STEPS_WINDOW // STEP_STRUCT.size + 7  # three windows and a bit
    for i in range(n):
        records.write_step(i, "optimizer", 1.7e9 + i, 1.7e9 + i + 0.5, 0.1, "gap", 0.1, 0.1, 0.1)
    path = tmp_path / f"{os.getpid()}.steps"
    assert path.stat().st_size > StepFile(path).offset + n * STEP_STRUCT.size  # room not yet written
    for _ in range(2):  # as a kill leaves it, then as the exit leaves it
        rows = StepFile(path).read()
        assert rows["i"].tolist() == list(range(n))
        assert np.allclose(rows["start"], 1.7e9 + np.arange(n)) and np.allclose(rows["seconds"], 0.5)
        records.close_steps()
    assert path.stat().st_size == StepFile(path).offset + n * STEP_STRUCT.size


def test_a_row_cut_by_a_kill_is_not_read(tmp_path):
    records = RecordFile(str(tmp_path))
    for i in range(3):
        records.write_step(**step(i, 1.7e9 + i))
    records.close_steps()
    path = tmp_path / f"{os.getpid()}.steps"
    with open(path, "ab") as f:
        f.write(b"\x01" * 20)
    assert StepFile(path).count == 3
    assert [len(c) for c in StepFile(path).chunks(rows=2)] == [2, 1]
    path.write_bytes(b"not steps at all")
    with pytest.raises(ValueError, match="not a dlscope step file"):
        StepFile(path)


def test_unknown_step_fields_fail_in_tests_and_are_noted_in_a_users_job(tmp_path, monkeypatch):
    assert os.environ.get(STRICT_ENV) == "1"  # tests/conftest.py
    with pytest.raises(TypeError, match="warp_factor"):
        RecordFile(str(tmp_path)).write_step(**step(0, 1.7e9), warp_factor=9)
    monkeypatch.delenv(STRICT_ENV)
    records = RecordFile(str(tmp_path))
    records.write_step(**step(0, 1.7e9), warp_factor=9)
    records.write_step(**step(1, 1.7e9 + 1), warp_factor=9)
    assert StepFile(tmp_path / f"{os.getpid()}.steps").count == 2
    errors = [r for r in read_records(tmp_path)[os.getpid()] if r["k"] == "error"]
    assert len(errors) == 1 and "warp_factor" in errors[0]["error"]


def sections_of(tmp_path, seconds: np.ndarray, **kwargs) -> dict:
    directory = tmp_path / f"p{len(seconds)}"
    directory.mkdir()
    bulk(directory / "100.steps", seconds, **kwargs)
    observed = analysis.Observed.read(directory)
    main = analysis.main_process(observed)
    summary = steptable.summarise(observed.stream(main)[1], 1.7e9, observed.steps[main].codes)
    steps = analysis.steps_section(observed, main, summary)
    return {"steps": steps, "anatomy": analysis.anatomy_section(steps, summary, None)}


def test_summary_stays_the_same_size_at_any_length_and_finds_the_slowdown(tmp_path):
    rng = np.random.default_rng(0)
    sizes = {}
    for n in (2_000, 200_000):
        seconds = rng.normal(0.010, 0.0005, n).clip(0.008)
        k = n * 3 // 5
        seconds[k:] *= 1.5  # the job slows down at step k, and stays slow
        seconds[n // 7] = 0.5  # one lone slow step: not a change, but the slowest
        found = sections_of(tmp_path, seconds)
        steps = found["steps"]
        sizes[n] = len(json.dumps(steps))
        assert steps["count"] == n
        assert [c["step"] for c in steps["change_points"]] == [k]
        change = steps["change_points"][0]
        assert change["after_ms"] / change["before_ms"] == pytest.approx(1.5, rel=0.05)
        assert steps["slowest"][0]["step"] == n // 7 and steps["slowest"][0]["ms"] == pytest.approx(500)
        assert steps["percentiles_ms"]["p50_ms"] == pytest.approx(np.median(seconds) * 1e3, rel=1e-3)
        assert len(steps["windows"]) == 100
        assert found["anatomy"]["percent"]["data"] == pytest.approx(20, abs=0.1)
    assert sizes[200_000] < 1.1 * sizes[2_000] and sizes[200_000] < 100_000


def place(tmp_path, name: str):
    (tmp_path / name).mkdir()
    return tmp_path / name


def test_a_change_point_names_the_part_it_is_in(tmp_path):
    """A slower input pipeline from step k: the change is in data; a step doing twice the work
    (every part twice as long): every part grew alike."""
    rng = np.random.default_rng(2)
    n, k = 4_000, 2_500
    seconds = rng.normal(0.010, 0.0003, n)
    data = seconds * 0.2
    forward = seconds * 0.3
    data[k:] += 0.008  # the loader slows down by 8 ms a batch; the rest of the step is unchanged
    seconds[k:] += 0.008
    found = sections_of(place(tmp_path, "loader"), seconds, data=data, forward=forward)
    change = found["steps"]["change_points"][0]
    assert abs(change["step"] - k) <= 1
    assert change["parts_ms"]["data"] == pytest.approx([2.0, 10.0], rel=0.05)
    assert change["parts_ms"]["forward"] == pytest.approx([3.0, 3.0], rel=0.05)
    assert change["parts_ms"]["other"] == pytest.approx([5.0, 5.0], rel=0.05)
    text = steps_section.change_parts(change)[0]
    assert text.startswith("the change is in data (data 2.00 → 10.00 ms, forward 3.00 → 3.00 ms")

    doubled = rng.normal(0.010, 0.0003, n)
    doubled[k:] *= 2.0
    forwards = np.full(n, 3)
    change = sections_of(place(tmp_path, "doubled"), doubled, forwards=forwards)["steps"]["change_points"][0]
    assert change["parts_ms"]["other"] == pytest.approx([5.0, 10.0], rel=0.05)
    assert change["forwards"] == [3, 3]
    text, more_work = steps_section.change_parts(change)
    assert text.startswith("every part grew alike (data 2.00 → 4.0") and not more_work
    assert "with the same forwards a step (3): each step did more of the same work" in text
    forwards[k:] = 6  # twice the forwards a step (an episode twice as long): more work, not slower
    change = sections_of(place(tmp_path, "episodes"), doubled, forwards=forwards)["steps"]["change_points"][0]
    text, more_work = steps_section.change_parts(change)
    assert "and each step ran more forwards (median 3 → 6): each step did more work" in text and more_work
    slower_loop = rng.normal(0.010, 0.0003, n)
    slower_loop[k:] *= 2.0
    data = slower_loop * 0.2
    data[k:] = 0.006  # data 2 → 6 ms, forward 3 → 6 (0.3 of the step), other 5 → 8: none carries it
    change = sections_of(place(tmp_path, "spread"), slower_loop, data=data)["steps"]["change_points"][0]
    assert steps_section.change_parts(change)[0].startswith("spread over several parts")


def test_the_profilers_own_window_is_no_change_point(tmp_path):
    """A short run whose profiled steps (2 warm-up, 10 active) took 1.6× longer, recording: the
    profiler's cost, not the job's; the slowdown after them still is a change."""
    n = 300
    seconds = np.random.default_rng(3).normal(0.004, 0.0001, n)
    seconds[0] = 0.02
    seconds[2:14] *= 1.6
    codes = bulk(tmp_path / "codes.steps", seconds[:1]).codes["profiled"]
    profiled = np.full(n, codes.index(None))
    profiled[1], profiled[2:4], profiled[4:14] = codes.index("wait"), codes.index("warmup"), codes.index("active")
    assert sections_of(place(tmp_path, "window"), seconds, profiled=profiled)["steps"]["change_points"] == []
    seconds[200:] *= 1.5
    change = sections_of(place(tmp_path, "slower"), seconds, profiled=profiled)["steps"]["change_points"]
    assert [c["step"] for c in change] == [200] and change[0]["before_ms"] == pytest.approx(4.0, rel=0.05)


def test_a_steady_run_has_no_change_point(tmp_path):
    seconds = np.random.default_rng(1).lognormal(np.log(0.01), 0.3, 50_000)
    assert sections_of(tmp_path, seconds)["steps"]["change_points"] == []


def test_verdict_facts_name_the_data_source_or_its_absence(tmp_path):
    seconds = np.full(500, 0.01)
    with_loader = sections_of(tmp_path, seconds, data_fraction=0.3)["anatomy"]["verdict"]
    assert (with_loader["key"], with_loader["level"], with_loader["data_pct"]) == ("input_bound", "highly", 30.0)
    assert with_loader["thresholds_pct"] == {"highly": analysis.INPUT_BOUND_PCT, "moderately": analysis.MODERATELY_PCT}
    no_loader = sections_of(tmp_path, np.full(501, 0.01), loader=False, data_fraction=0.3)["anatomy"]
    assert no_loader["verdict"]["key"] == "no_data_source" and "level" not in no_loader["verdict"]
    assert no_loader["verdict"]["gap_pct"] == pytest.approx(30.0) and no_loader["percent"]["data"] == 0


def test_the_step_file_reader_keeps_its_documented_import_path():
    from dlscope.observe.script.records import StepFile as documented

    assert documented is StepFile
