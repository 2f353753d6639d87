"""`dlscope run -- torchrun --nproc-per-node 2` on a DDP script written the usual way
(tests/scripts/ddp_mnist.py): every rank observed, the `distributed` section from their own Kineto
traces, a rank slowed on purpose named as the straggler, HTA loading the same traces, and the one
merged timeline with a process per rank. One real 2-rank gloo job serves the module."""

from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path

import pytest

from dlscope.analysis import kineto, timeline
from dlscope.analysis import ranks as distributed_analysis
from dlscope.analysis.ranks import analyze_ranks
from dlscope.cli import main
from dlscope.errors import DlscopeError
from dlscope.report.sections.distributed import WORDS
from dlscope.report.wording import worded
from dlscope.rundir import load_results
from test_run import check_timeline

SCRIPT = Path(__file__).parent / "scripts" / "ddp_mnist.py"
SLEEP_MS = 30
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
PROFILE = {"start_after": 1, "wait": 1, "warmup": 1, "profile_steps": 3}  # 8 steps per rank: 6 needed


@pytest.fixture(scope="module")
def slow_rank_1(tmp_path_factory, observe_script) -> tuple[dict, Path]:
    out = tmp_path_factory.mktemp("ddp") / "run"
    save = out.parent / "model.pt"  # rank 0 saves it with torch.save
    command = [*TORCHRUN, str(SCRIPT), "--train", "512", "--slow-rank", "1", "--slow-ms", str(SLEEP_MS)]
    results, code = observe_script([*command, "--save", str(save)], out, **PROFILE)
    assert code == 0
    return results["sections"], out


def test_results_carry_world_size_and_each_rank(slow_rank_1):
    sections, _ = slow_rank_1
    assert sections["run"]["world_size"] == 2 and sections["run"]["ranks"] == [0, 1]
    ranked = [p for p in sections["run"]["processes"] if p["rank"] is not None]
    assert sorted(p["rank"] for p in ranked) == [0, 1] and all(p["world_size"] == 2 for p in ranked)
    launcher = [p for p in sections["run"]["processes"] if p["rank"] is None]
    assert launcher and "--nproc-per-node" in launcher[0]["argv"]  # torchrun itself, in Python too
    # DDP's ranks communicate: no warning that they trained apart (test_ranks_apart.py)
    assert not any(f["key"] == "distributed.ranks_apart" for f in sections["run"].get("findings", []))
    saves = [r for r in sections["phases"]["rows"] if r["phase"] == "checkpoint_save"]
    rank0 = next(p["pid"] for p in ranked if p["rank"] == 0)
    assert [(r["pid"], Path(r["file"]).name) for r in saves] == [(rank0, "model.pt")]  # rank 0's torch.save only


def test_the_slowed_rank_is_named_the_straggler(slow_rank_1):
    section = slow_rank_1[0]["distributed"]
    assert (section["world_size"], section["backend"]) == (2, "gloo")
    straggler = section["stragglers"]["straggler"]
    # 2 buckets × 3 steps; a rank 0 descheduled for longer than the sleep on a loaded machine may be last once
    assert straggler["rank"] == 1 and straggler["of"] == 6 and straggler["last"] >= 5
    # it sleeps before backward, so before each launch; how much of the sleep shows as lead depends on how
    # the two ranks share 2 loaded cores (17–43 ms seen for 30 ms), far above the ~1 ms of no delay
    assert straggler["median_gap_ms"] >= 0.25 * SLEEP_MS
    found = {f["key"]: f for f in section["findings"]}
    assert found["distributed.straggler"]["level"] == "bad" and found["distributed.straggler"]["values"]["rank"] == 1
    assert "straggler" in worded(section["findings"], WORDS).items[0][1]
    # the sleep is no operator: it shows as the slow rank's idle time, and as the fast rank's wait in all-reduce
    rank0, rank1 = section["ranks"]
    assert rank1["idle_ms"] >= SLEEP_MS and rank1["idle_ms"] > rank0["idle_ms"]  # time.sleep runs no operator
    assert rank0["exposed_comm_ms"] > rank1["exposed_comm_ms"]
    for r in section["ranks"]:
        assert r["steps"] == 3 and 0 <= r["overlap_pct"] <= 100
        parts = r["compute_ms"] + r["exposed_comm_ms"] + r["data_ms"] + r["idle_ms"]
        assert math.isclose(parts, r["step_ms"], rel_tol=1e-3, abs_tol=0.01)  # the parts partition the step


def test_allreduce_bytes_per_step_are_the_models_gradient_bytes(slow_rank_1):
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        from ddp_mnist import Net
    finally:
        sys.path.remove(str(SCRIPT.parent))
    grad_bytes = sum(p.numel() * p.element_size() for p in Net().parameters())
    section = slow_rank_1[0]["distributed"]
    assert section["grad_bytes"] == grad_bytes and section["grad_bytes_source"] == "trace"
    assert all(r["comm_bytes_per_step"] == grad_bytes and r["collectives_per_step"] == 2 for r in section["ranks"])
    assert all(r["collective_kinds"] == {"allreduce": 2} for r in section["ranks"])  # DDP's two buckets


@pytest.mark.parametrize(
    ("launched", "kind"),
    [
        ("c10d::allreduce_", "allreduce"),
        ("c10d::_allgather_base_", "allgather"),  # FSDP's parameters
        ("c10d::_reduce_scatter_base_", "reduce_scatter"),  # FSDP's gradients
        ("_allgather_base", "allgather"),  # record_param_comms' "Collective name"
        ("c10d::broadcast_", "broadcast"),
    ],
)
def test_a_collective_is_named_by_its_kind_not_called_an_all_reduce(launched, kind):
    assert distributed_analysis.collective_kind(launched) == kind


def test_hta_loads_the_per_rank_traces_but_its_analyses_are_empty_on_gloo(slow_rank_1):
    """HTA's analysers are built on GPU kernels: on CPU/gloo traces they give NaN or fail (HTA #107)."""
    from hta.trace_analysis import TraceAnalysis

    sections, out = slow_rank_1
    traces = {out / path for path in sections["distributed"]["traces"].values()}
    assert len({p.parent for p in traces}) == 1
    folder = next(iter(traces)).parent
    # HTA takes every .json in the folder for a trace, one without a rank for rank 0's
    assert {p for p in folder.iterdir() if p.suffix in (".json", ".gz")} == traces
    analysis = TraceAnalysis(trace_dir=str(folder))
    assert sorted(analysis.t.get_ranks()) == [0, 1]
    overlap = analysis.get_comm_comp_overlap(visualize=False)
    assert overlap["comp_comm_overlap_pctg"].isna().all()
    with pytest.raises(ValueError):
        analysis.get_potential_stragglers()


def test_merged_timeline_has_a_process_per_rank(slow_rank_1):
    sections, out = slow_rank_1
    check_timeline(out, sections)  # valid, nested per track, the main rank's operators inside its steps
    document = json.loads((out / sections["run"]["timeline"]).read_text())
    names = {e["pid"]: e["args"]["name"] for e in document["traceEvents"] if e.get("name") == "process_name"}
    ranks = {p["pid"]: p["rank"] for p in sections["run"]["processes"] if p["rank"] is not None}
    assert {names[pid] for pid in ranks} == {"rank 0", "rank 1"}
    trace = timeline.load(out / sections["run"]["timeline"])
    for pid in ranks:
        assert len(trace.tracks_named(pid, "steps")) == 8
        work = [s for (p, _), slices in trace.slices.items() if p == pid for s in slices if s.name == "gloo:all_reduce"]
        assert len(work) == 6  # gloo's work items, on their own threads of that rank's process


@pytest.mark.slow
def test_cli_names_rank_0_when_rank_0_is_slowed(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DDP_SLOW_RANK", "0")
    monkeypatch.setenv("DDP_SLOW_MS", str(SLEEP_MS))
    monkeypatch.setenv("COLUMNS", "80")
    out = tmp_path / "run"
    # more active steps than the script has left: the profiler's stop at exit closes a last
    # ProfilerStep mark that holds no training step; the ranks' steps are the 5 it recorded (3-7),
    # so that mark is none of them (before, it was a span left out for its want of collectives)
    args = ["--start-after", "1", "--wait", "1", "--warmup", "1", "--profile-steps", "8"]
    assert main(["run", "--out", str(out), *args, "--", *TORCHRUN, str(SCRIPT), "--train", "512"]) == 0
    section = load_results(out)["sections"]["distributed"]
    assert section["stragglers"]["straggler"]["rank"] == 0
    assert section["left_out_steps"] == []
    assert all(r["steps"] == 5 and r["collectives_per_step"] == 2 for r in section["ranks"])
    # the summary, one screen at 80 columns (the ranks' own output goes to the file descriptor, not here)
    summary = capsys.readouterr().out
    assert len(summary.splitlines()) <= 40, summary
    assert re.search(r"[Rr]ank 0(?:'s pace| is the straggler)", " ".join(summary.split())), summary
    # the section whole, as the report has it
    assert main(["report", "--full", str(out)]) == 0
    printed = capsys.readouterr().out
    ours = printed[printed.index("Distributed: ranks") : printed.rindex("\nwrote ")]
    assert "straggler" in ours  # worded from the finding above (its rank is checked on the section)
    assert [line for line in ours.splitlines() if len(line) > 80] == []


def test_the_rank_whose_error_ended_the_job_is_said_first(tmp_path, capsys):
    """Rank 1 raises: rank 0 then fails in its next all-reduce (its peer gone) and torchrun after
    it. The summary opens with rank 1's error and its line, the cause, not the failures it caused;
    the others are in the report."""
    fail_line = next(n for n, line in enumerate(SCRIPT.read_text().splitlines(), 1) if "# FAIL" in line)
    out = tmp_path / "run"
    command = [*TORCHRUN, str(SCRIPT), "--fail-rank", "1"]
    assert main(["run", "--out", str(out), "--profile-steps", "0", "--", *command]) != 0
    errors = load_results(out)["sections"]["run"]["uncaught"]
    assert (errors[0]["rank"], errors[0]["type"], errors[0]["line"]) == (1, "ValueError", fail_line)
    assert {e["type"] for e in errors[1:]} >= {"ChildFailedError"}  # torchrun's, last
    assert all(Path(e["file"]).is_file() for e in errors)  # (torchrun's frames: its own, not "<frozen runpy>")
    # torchrun's message opens with a rule of "="s: its first line that says something instead
    assert all(any(c.isalnum() for c in e["message"]) for e in errors), errors
    summary = " ".join(capsys.readouterr().out.split())
    assert f"Rank 1 failed with ValueError at {SCRIPT.name}:{fail_line}" in summary, summary


def test_bad_traces_are_refused_naming_the_file(slow_rank_1, tmp_path):
    sections, out = slow_rank_1
    good = {int(rank): out / path for rank, path in sections["distributed"]["traces"].items()}
    cut = tmp_path / "cut.json"
    cut.write_bytes(good[1].read_bytes()[:5000])
    with pytest.raises(DlscopeError, match="not a Kineto JSON trace") as error:
        analyze_ranks({0: good[0], 1: cut})
    assert str(cut) in str(error.value)
    with pytest.raises(DlscopeError, match="rank 1's, given as rank 0's"):
        analyze_ranks({0: good[1], 1: good[0]})
    stepless = tmp_path / "stepless.json"
    document = json.loads(good[0].read_text())
    document["traceEvents"] = [e for e in document["traceEvents"] if not e.get("name", "").startswith("ProfilerStep")]
    stepless.write_text(json.dumps(document))
    with pytest.raises(DlscopeError, match="no ProfilerStep#N"):
        analyze_ranks({0: stepless, 1: good[1]})


def test_a_rank_trace_cut_short_becomes_a_note_not_a_lost_report(slow_rank_1, tmp_path):
    from dlscope.report.sections import distributed
    from dlscope.rundir import RunDir
    from dlscope.supervise.session import distributed_section

    sections, out = slow_rank_1
    good = {int(rank): out / path for rank, path in sections["distributed"]["traces"].items()}
    cut = tmp_path / "profile-killed.json"
    cut.write_bytes(good[1].read_bytes()[:4096])  # what a rank killed while exporting leaves
    run = RunDir.create(str(tmp_path / "run"), "run")
    section = distributed_section({0: good[0], 1: cut}, run)
    assert section["note"].startswith("no per-rank analysis:") and str(cut) in section["note"]
    (block,) = distributed.render(section)
    assert block.text == section["note"]


def test_traces_without_shapes_say_the_bytes_are_unknown(slow_rank_1, tmp_path):
    """A profiler run without record_shapes (the built-in job's) names no sizes: no bytes are guessed."""
    sections, out = slow_rank_1
    bare = {}
    for rank, path in sections["distributed"]["traces"].items():
        document = json.loads((out / path).read_text())
        for e in document["traceEvents"]:
            for key in ("Input Dims", "Input type", "Input Strides", "Concrete Inputs"):
                e.get("args", {}).pop(key, None)
        bare[int(rank)] = tmp_path / f"rank{rank}.json"
        bare[int(rank)].write_text(json.dumps(document))
    section = analyze_ranks(bare, grad_bytes=1000)
    assert all(r["comm_bytes_per_step"] is None and r["collectives_per_step"] == 2 for r in section["ranks"])
    assert "distributed.comm_bytes_unknown" in [f["key"] for f in section["findings"]]
    assert section["stragglers"]["straggler"]["rank"] == 1  # arrival times need no shapes


def test_ranks_started_by_multiprocessing_spawn_are_ranks(tmp_path, observe_script):
    # PyTorch's DDP tutorial: no torchrun, no RANK; each process gives its rank to init_process_group
    command = [sys.executable, str(SCRIPT.parent / "ddp_spawn.py"), "8"]
    results, code = observe_script(command, tmp_path / "run", **PROFILE)
    assert code == 0
    sections = results["sections"]
    assert sections["run"]["ranks"] == [0, 1] and sections["run"]["world_size"] == 2
    ranked = [p for p in sections["run"]["processes"] if p["rank"] is not None]
    assert len(ranked) == 2 and all(p["world_size"] == 2 for p in ranked)
    distributed = sections["distributed"]
    assert distributed["world_size"] == 2 and distributed["ranks_traced"] == [0, 1]
    for rank in distributed["ranks"]:  # shapes recorded as under torchrun: DDP all-reduces each gradient byte
        assert 0.99 <= rank["bytes_vs_grad"] <= 1.1


def test_a_ranks_steps_are_the_training_steps_it_recorded_not_torchs_marks(tmp_path):
    """A rank's ProfilerStep#1 runs from step 0's end over an evaluation to step 1's end: with the
    steps `dlscope run` recorded, the evaluation's compute is no step's (synthetic trace, its
    times µs after baseTimeNanoseconds as torch writes them)."""
    base_us = 1_000_000_000.0

    def op(name: str, ts: float, dur: float, cat: str = "cpu_op") -> dict:
        return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur, "args": {}}

    events = [
        op("ProfilerStep#0", 0, 100, "user_annotation"),
        op("ProfilerStep#1", 100, 400, "user_annotation"),
        op("aten::mm", 10, 50),
        op("c10d::allreduce_", 70, 10),
        op("aten::cdist", 150, 150),  # the evaluation, between the steps
        op("aten::mm", 360, 50),
        op("c10d::allreduce_", 420, 10),
    ]
    path = tmp_path / "rank0.json"
    path.write_text(json.dumps({"baseTimeNanoseconds": int(base_us * 1e3), "traceEvents": events}))
    recorded = [[0, 0, base_us / 1e6, (base_us + 100) / 1e6], [1, 1, (base_us + 350) / 1e6, (base_us + 500) / 1e6]]
    marks = distributed_analysis.step_rows(kineto.read_rank(path, 0))
    assert [r["compute_ms"] for r in marks] == [0.05, 0.2]  # the evaluation's 0.15 ms in step 1
    steps = distributed_analysis.step_rows(kineto.read_rank(path, 0, recorded))
    assert [(r["step"], r["ms"], r["compute_ms"]) for r in steps] == [(0, 0.1, 0.05), (1, 0.15, 0.05)]
