"""`dlscope doctor` on scripts whose truth is known (tests/scripts/doctor_target.py): an input-bound
loop is prescribed more DataLoader workers, measured faster; a compute-bound one gets no data-loader
prescription and is told it is at its best; the script is never changed and nothing it writes is
clobbered (relative outputs land in a scratch directory, absolute ones are refused). The machine is
shared: the assertions are on the ranking and the prescription, the precise ratios are in
BENCHMARKS.md. The prediction and gain arithmetic is tested on its own, on fixed numbers."""

from __future__ import annotations

import hashlib
import shutil
import sys
from pathlib import Path

import pytest

from dlscope.analysis import prescribe
from dlscope.cli import main
from dlscope.injob import change as trial
from dlscope.options import DoctorOptions, RunOptions, StepOptions
from dlscope.report.sections import doctor as doctor_words
from dlscope.report.terminal import print_blocks
from dlscope.runner import Plan, run_command
from dlscope.stages import doctor as doctor_step

SCRIPT = Path(__file__).parent / "scripts" / "doctor_target.py"
LOADER_LINE = next(n for n, line in enumerate(SCRIPT.read_text().splitlines(), 1) if "DataLoader(dataset" in line)


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def doctor(tmp_path, monkeypatch):
    """The doctor through the runner, from a working directory holding the user's own train.log."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.log").write_text("the user's own log\n")

    def run(*args: str, budget: float = 40.0, rounds: int = 2) -> dict:
        options = DoctorOptions([sys.executable, str(SCRIPT), *args], budget_s=budget, max_steps=12, rounds=rounds)
        plan = Plan(
            "doctor",
            ["doctor"],
            options=RunOptions(out=str(tmp_path / "run")),
            step_options=StepOptions(doctor=options),
        )
        section = run_command(plan, render=False)["sections"]["doctor"]
        print_blocks(doctor_words.render(section))  # the words render from the facts, whatever they are
        return section

    return run


@pytest.mark.timing
def test_an_input_bound_script_is_prescribed_more_workers(doctor, tmp_path):
    # a 10 ms read per sample (sleep: it parallelises whatever else the shared cores run), 4 per batch,
    # against a 2 ms forward: ~90% of the step waits for input
    before = sha(SCRIPT)
    section = doctor("--decode", "sleep", "--decode-ms", "10", "--forward-ms", "2", "--workers", "0", budget=60)
    assert section["verdict"]["key"] == "prescribe" and section["verdict"]["order"][0] == "workers"
    workers = next(c for c in section["candidates"] if c["key"] == "workers")
    assert workers["measured"]["verdict"] == "faster" and workers["numerics"]["key"] == "same"
    assert workers["predicted"] > 1.5  # from the anatomy, before any trial
    assert workers["site"]["file"] == str(SCRIPT) and workers["site"]["line"] == LOADER_LINE
    edit = doctor_words.snippet(workers)
    chosen = workers["change"]["loader"]["num_workers"]
    assert f"{SCRIPT}:{LOADER_LINE}" in edit and "+ loader = DataLoader(" in edit and f"num_workers={chosen}" in edit
    # the training thread waited in __next__ (a sleep, as a read would): more workers than cores overlap it
    assert workers["basis"]["loader_cpu_frac"] < 0.5 and chosen > section["cores"]
    assert "input_free" not in section["verdict"]["order"]  # the ceiling is a bound, not a change
    # where the time went, by dlscope diff's comparison: the data part, beyond its noise
    went = {r["part"]: r for r in section["diff"]["parts"]}
    assert went["data"]["significant"] and went["data"]["high_ms"] < 0
    assert section["diff"]["b"]["path"].startswith("trials/workers-")
    ceiling = next((c for c in section["candidates"] if c["key"] == "input_free"), None)
    # tried last, when the budget leaves room (a busy machine starts each trial slowly)
    assert (
        ceiling["ceiling"]
        if ceiling
        else {"key": "input_free", "reason": "budget", "budget_s": 60} in section["not_tried"]
    )
    # side effects: the script unchanged, the user's log untouched, the trials' logs written elsewhere
    assert sha(SCRIPT) == before and all(f["unchanged"] for f in section["script_files"])
    assert (tmp_path / "train.log").read_text() == "the user's own log\n"
    assert all(t["wrote"]["files"] == [{"file": "train.log", "bytes": t["wrote"]["bytes"]}] for t in section["trials"])
    assert not any((tmp_path / "run" / "trials" / t["name"] / "cwd").exists() for t in section["trials"])
    assert section["elapsed_s"] <= section["budget_s"]
    assert {t["name"] for t in section["trials"]} >= {"baseline-1", "workers-1"}


@pytest.mark.timing
def test_a_compute_bound_script_gets_no_loader_prescription_and_is_at_its_best(doctor):
    # a 40 ms forward: fetching 4 ready samples (well under a millisecond, a few on a loaded machine) stays under 5%
    section = doctor("--decode-ms", "0", "--forward-ms", "40", "--workers", "0", budget=90)  # ends after its baseline
    assert section["verdict"]["key"] == "at_best"
    skipped = {s["key"]: s["reason"] for s in section["not_tried"]}
    assert skipped["workers"] == skipped["input_free"] == "input_cheap"
    assert skipped["threads"] == "threads_at_cores"  # torch's default: one thread a core
    assert not any(c["key"] in ("workers", "input_free") for c in section.get("candidates", []))
    findings = doctor_words.findings(section)
    assert findings[0]["key"] == "doctor.at_best"


def test_an_absolute_output_path_is_refused_not_clobbered_and_a_directory_made_again_is_no_write(doctor, tmp_path):
    # matplotlib makes ~/.config/matplotlib with os.makedirs(exist_ok=True) at every import: where
    # it exists nothing is written (karpathy/makemore's trials were refused for it). A directory
    # outside the system's temporary one and ~/.cache: the script's own; the log outside ends it
    outside = tmp_path / "elsewhere.log"
    outside.write_text("written by the user's last real run\n")
    ends_at_once = ["--makedirs", str(SCRIPT.parent), "--log", str(outside)]
    section = doctor("--decode-ms", "0", "--forward-ms", "1", *ends_at_once, budget=90)
    assert outside.read_text() == "written by the user's last real run\n"
    assert section["verdict"]["key"] == "baseline_failed" and section["refused"] == [str(outside)]
    assert section["exit_code"] != 0
    assert any(f["key"] == "doctor.refused" for f in doctor_words.findings(section))


@pytest.mark.timing
def test_relative_inputs_are_read_and_relative_outputs_of_a_last_run_left_alone(doctor, tmp_path):
    """nanoGPT's way: a file read by a name in the code, relative to the working directory, and
    out/ckpt.pt overwritten (torch.save, from C++) and out/history.log appended to at every step."""
    (tmp_path / "settings.txt").write_text("40")  # a 40 ms forward: at its best after the baseline
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "ckpt.pt").write_bytes(b"the user's trained model")
    (tmp_path / "out" / "history.log").write_text("the user's history\n")
    section = doctor("--decode-ms", "0", "--workers", "0", "--like-nanogpt", budget=90)
    assert section["verdict"]["key"] == "at_best" and section["trials"][0]["ok"]
    assert (tmp_path / "out" / "ckpt.pt").read_bytes() == b"the user's trained model"
    assert (tmp_path / "out" / "history.log").read_text() == "the user's history\n"
    wrote = {f["file"]: f["bytes"] for f in section["trials"][0]["wrote"]["files"]}
    assert set(wrote) == {"train.log", "out/ckpt.pt", "out/history.log"}  # the mirror's symlinks are not listed
    assert wrote["out/history.log"] > len("the user's history\n") + 12  # appended to a copy of the user's


def test_writes_through_the_scratch_mirror_never_reach_the_users_tree(tmp_path):
    """What the audit hook does before each write (trial.own_in_scratch), write by write."""
    user, scratch = tmp_path / "user", tmp_path / "scratch"
    (user / "data" / "deep").mkdir(parents=True)
    (user / "data" / "deep" / "a.txt").write_text("user's")
    (user / "data" / "b.txt").write_text("user's")
    scratch.mkdir()
    (scratch / "data").symlink_to(user / "data")
    mirrored = scratch / "data" / "deep" / "a.txt"
    trial.own_in_scratch(str(scratch), str(mirrored), whole=True, keep_content=True)  # an open to append
    assert not mirrored.is_symlink() and mirrored.read_text() == "user's"
    mirrored.write_text("the trial's")
    trial.own_in_scratch(str(scratch), str(scratch / "data" / "b.txt"), whole=False, keep_content=False)  # remove
    (scratch / "data" / "b.txt").unlink()
    trial.own_in_scratch(str(scratch), str(scratch / "data" / "deep"), whole=True, keep_content=False)  # rmtree
    shutil.rmtree(scratch / "data" / "deep")
    assert (user / "data" / "deep" / "a.txt").read_text() == (user / "data" / "b.txt").read_text() == "user's"


def test_a_command_that_cannot_start_is_one_line(tmp_path, capsys):
    assert main(["doctor", "--out", str(tmp_path / "run"), "--", "no-such-command-here"]) == 2
    assert "command not found" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


# --- the arithmetic, on fixed facts ----------------------------------------------------------


def baseline(data_pct: float, step_ms: float = 10.0, workers: int = 0, threads: int = 2) -> dict:
    site = {"what": "DataLoader", "file": "/x/train.py", "line": 9, "source": "DataLoader(d)"}
    return {
        "median_ms": step_ms,
        "anatomy": {
            "percent": {"data": data_pct, "forward": 100 - data_pct},
            "mean_ms": {"data": step_ms * data_pct / 100, "forward": step_ms * (1 - data_pct / 100)},
            "step_ms": step_ms,
            "data_source": "loader",
        },
        "facts": {"sites": [{**site, "arguments": {"num_workers": workers}}], "threads": threads, "zero_grad_s": None},
    }


def test_predictions_follow_the_anatomy():
    tried, skipped = prescribe.candidates(baseline(80.0), cores=2)
    by_key = {c["key"]: c for c in tried}
    assert by_key["input_free"]["predicted"] == pytest.approx(1 / (1 - 0.8), rel=1e-3)  # 5×
    # 8 ms of fetching on 2 workers beside 2 ms of compute, 10 ms of work on 2 cores: 5 ms a step
    assert by_key["workers"]["predicted"] == pytest.approx(2.0, rel=1e-3)
    assert by_key["workers"]["change"] == {"loader": {"num_workers": 2}}
    tried, skipped = prescribe.candidates(baseline(2.0), cores=2)
    assert not tried and {"workers", "input_free"} <= {s["key"] for s in skipped if s["reason"] == "input_cheap"}
    waiting = baseline(80.0)
    waiting["facts"]["loader_cpu_frac"] = 0.1  # fetching mostly waits: workers overlap it beyond the cores
    by_key = {c["key"]: c for c in prescribe.candidates(waiting, cores=2)[0]}
    assert by_key["workers"]["change"] == {"loader": {"num_workers": 4}}
    assert by_key["workers"]["predicted"] == pytest.approx(10 / max(2, 8 / 4, (0.8 + 2) / 2), rel=1e-3)
    tried, _ = prescribe.candidates(baseline(80.0, workers=2), cores=2)
    assert [c["key"] for c in tried] == ["input_free"]
    tried, _ = prescribe.candidates(baseline(2.0, threads=1), cores=2)
    assert prescribe.scaled_prediction(tried[0], scaling=2.0) == pytest.approx(1 / (0.02 + 0.98 / 2), rel=1e-3)


def test_processes_training_at_once_past_the_cores_are_given_their_share_and_it_is_predicted():
    """Two training processes with 2 threads each on 2 cores: the threads candidate asks 1 each
    (not "already 2 threads for 2 cores"), predicted from matmuls run beside another process."""
    shared = baseline(2.0, threads=2)
    shared["facts"]["sharing"] = {"pids": [11, 12], "threads_total": 4, "cores": 2}
    tried, skipped = prescribe.candidates(shared, cores=2)
    [threads] = [c for c in tried if c["key"] == "threads"]
    assert threads["change"] == {"threads": 1} and threads["basis"]["processes"] == 2
    assert not any(s["key"] == "threads" for s in skipped)
    speedup = doctor_step.shared_matmul_speedup(2, 2, 1, rounds=3)  # the others run beside it, then stop
    assert speedup > 0
    assert prescribe.scaled_prediction(threads, speedup) > 1 if speedup > 1 else True
    # one thread each on 2 cores: their share already (not 2 each, which would oversubscribe again)
    fair = baseline(2.0, threads=1)
    fair["facts"]["sharing"] = {"pids": [11, 12], "threads_total": 2, "cores": 2}
    tried, skipped = prescribe.candidates(fair, cores=2)
    assert not any(c["key"] == "threads" for c in tried)
    [why] = [s for s in skipped if s["key"] == "threads"]
    assert why["reason"] == "threads_at_share"
    assert doctor_words.REASONS["threads_at_share"](why) == (
        "already 1 thread(s) in each of the 2 training processes, for 2 cores"
    )


def test_the_workers_prediction_counts_the_hand_over_and_the_cores_it_gets():
    # 8 ms of CPU fetching, 2 ms of compute a step, 2 workers on 2 idle cores
    workers = next(c for c in prescribe.candidates(baseline(80.0), cores=2)[0] if c["key"] == "workers")
    assert workers["basis"]["cores_busy"] == [1.0, 2.0, 2.0]  # nominal, until measured
    # each batch handed over: 0.5 ms of a worker's CPU, 0.5 ms of the training thread's: 11 ms of
    # CPU a step on 2 cores
    workers["basis"].update(handover_send_ms=0.5, handover_recv_ms=0.5)
    assert prescribe.workers_prediction(workers["basis"]) == pytest.approx(10 / 5.5, rel=1e-3)
    # other jobs held the cores: the training thread got half a core (the same 10 ms step was 4 ms of
    # fetching CPU and 1 of compute), and 2 or 3 busy processes of ours got 0.75 cores between them:
    # the 5 ms of CPU a step at 0.75 cores against 0.5
    busy = baseline(80.0)
    busy["facts"]["thread_share"] = 0.5
    workers = next(c for c in prescribe.candidates(busy, cores=2)[0] if c["key"] == "workers")
    workers["basis"]["cores_busy"] = [0.5, 0.75, 0.75]
    assert prescribe.workers_prediction(workers["basis"]) == pytest.approx(0.75 / 0.5, rel=1e-3)
    # a scheduler that shares the CPUs by session: more processes of ours get no more cores, and the
    # hand-over makes workers slower
    workers["basis"].update(cores_busy=[0.5, 0.5, 0.5], handover_send_ms=0.5, handover_recv_ms=0.5)
    assert prescribe.workers_prediction(workers["basis"]) == pytest.approx(5 / 6, rel=1e-3)


def test_a_gain_counts_only_beyond_its_noise():
    steady = [0.010 + 0.0001 * (i % 3) for i in range(20)]
    half = [s / 2 for s in steady]
    assert prescribe.measured([(steady, half), (steady, half)])["verdict"] == "faster"
    assert prescribe.measured([(steady, steady)])["verdict"] == "same"
    # rounds that disagree (the load moved): their spread is the noise
    noisy = prescribe.measured([(steady, [s / 1.3 for s in steady]), (steady, [s * 1.2 for s in steady])])
    assert noisy["verdict"] == "same" and noisy["noise_pct"] > 20
    assert prescribe.measured([(steady, [s * 2 for s in steady])])["verdict"] == "slower"


def test_a_load_that_moved_between_a_trial_and_its_baseline_widens_the_band():
    steady = [0.010 + 0.0001 * (i % 3) for i in range(20)]
    faster = [s / 1.2 for s in steady]
    assert prescribe.measured([(steady, faster)])["verdict"] == "faster"
    # on a shared machine the change's trial had 1.5 cores left where its baseline had 1.2: 20% of the gain
    quiet, busy = {"shared": False, "free_cores": 1.95}, {"shared": True, "free_cores": 1.2}
    moved = doctor_step.load_moved(busy, {"shared": True, "free_cores": 1.5})
    assert moved == pytest.approx(0.2)
    widened = prescribe.measured([(steady, faster)], [moved])
    assert (widened["verdict"], widened["noise_pct"], widened["load_moved_pct"]) == ("same", 20.0, 20.0)
    # on a quiet machine the cores left move too (dlscope's own poll, a daemon): no widening
    assert doctor_step.load_moved(quiet, {"shared": False, "free_cores": 1.8}) == 0.0
    assert doctor_step.load_moved(None, busy) == 0.0  # a trial by an older dlscope: nothing read


@pytest.mark.slow
def test_a_baseline_on_a_shared_machine_has_its_predictions_withheld(doctor):
    """Beside two busy loops the first run's times are the loaded machine's: the prediction made
    from them is withheld (each change measured whatever it predicted), and the report says first
    that the machine was shared."""
    from test_machine_share import Loops

    loops = Loops()
    try:
        # one round: what is withheld is the prediction, whatever the noise band the rounds would give
        section = doctor("--decode", "sleep", "--decode-ms", "10", "--forward-ms", "2", "--workers", "0", rounds=1)
    finally:
        loops.stop()
    machine = section["machine"]
    assert machine["baseline_shared"] and "baseline-1" in machine["shared"], machine
    assert section["candidates"] and all(c["withheld"] for c in section["candidates"])
    assert not any(s["reason"] == "no_gain" for s in section["not_tried"])
    shared = next(f for f in doctor_words.findings(section) if f["key"] == "doctor.shared")
    said = doctor_words.WORDS["doctor.shared"](shared["values"])
    assert f"took up to {machine['others_pct_max']:.0f}% of the 2 cores" in said and "withheld" in said
    rows = doctor_words.render(section)
    table = next(b for b in rows if getattr(b, "columns", None) and "predicted ×" in b.columns)
    assert all(row[1] is None for row in table.rows)  # no predicted figure shown


def test_numerics_compare_the_first_losses():
    assert prescribe.numerics([[1.0, 0.9, 0.8]], [1.0, 0.9, 0.8])["key"] == "same"
    assert prescribe.numerics([[1.0, 0.9, 0.8]], [1.0, 0.95, 0.8])["key"] == "differs"
    # unseeded baselines differ among themselves: that spread is the tolerance
    assert prescribe.numerics([[1.0, 0.9], [1.0, 0.96]], [1.0, 0.95])["key"] == "same"
    assert prescribe.numerics([[1.0]], [])["key"] == "unknown"


def test_the_edit_names_the_line_and_changes_only_the_argument():
    def workers(source: str | None, built_by: str | None = None) -> str:
        site = {"file": "/x/train.py", "line": 9, "source": source, "what": "DataLoader", "built_by": built_by}
        return doctor_words.snippet({"key": "workers", "argument": ("num_workers", 2), "site": site})

    assert workers("loader = DataLoader(d, num_workers=0, shuffle=True)").endswith(
        "+ loader = DataLoader(d, num_workers=2, shuffle=True)"
    )
    assert workers("loader = DataLoader(d)").endswith("+ loader = DataLoader(d, num_workers=2)")
    assert "add num_workers=2" in workers("loader = DataLoader(")  # a call over several lines
    hf = workers("trainer.train()", built_by="/venv/site-packages/transformers/trainer.py:1100")
    assert "/x/train.py:9" in hf and "TrainingArguments(dataloader_num_workers=2)" in hf


def test_no_change_faster_while_input_made_free_is_is_not_called_at_its_best():
    """skorch's classifier: 44% of its step in its DataLoader, workers 0.32× (a new loader each
    epoch starts them again), input made free 1.74×: the input side still holds the gain, so
    doctor does not say the script is at its best."""
    measured = {"noise_pct": 36.3, "rounds": [1.0, 1.7, 2.3]}
    section = {
        "verdict": {"key": "at_best", "tried": ["workers"]},
        "candidates": [
            {"key": "workers", "predicted": 1.02, "measured": {**measured, "gain": 0.324, "verdict": "slower"}},
            {
                "key": "input_free",
                "predicted": 1.79,
                "ceiling": True,
                "measured": {**measured, "gain": 1.736, "verdict": "faster"},
            },
        ],
        "cores": 2,
    }
    found = doctor_words.findings(section)
    assert found[0]["key"] == "doctor.input_left" and found[0]["level"] != "good"
    text = doctor_words.WORDS["doctor.input_left"](found[0]["values"])
    assert text.startswith(
        "No change doctor tried made it faster (DataLoader num_workers: 0.32×), yet input made free runs 1.74×"
    )
    section["candidates"][1]["measured"]["verdict"] = "same"  # within the noise: nothing left on the input side
    assert doctor_words.findings(section)[0]["key"] == "doctor.at_best"


def copies(calls: int, pinned: int, blocking: int, seconds: float, steps: int = 10) -> dict:
    """change.py's "copies" record of a baseline's counted steps."""
    return {
        "steps": steps,
        "calls": calls,
        "bytes": calls * 4_000_000,
        "pinned": pinned,
        "blocking": blocking,
        "seconds": seconds,
    }


def test_on_a_gpu_blocking_pageable_copies_are_a_pinned_candidate_predicted_from_the_hosts_wait():
    """The copies held the host 4 ms of a 10 ms step: pinned memory and non-blocking copies are
    tried, predicted at most 10 / 6; copies already pinned and non-blocking, none to make, or none
    from a DataLoader to pin are said why not; without a GPU, no GPU."""
    gpu = baseline(2.0)
    gpu["facts"]["copies"] = copies(calls=20, pinned=0, blocking=20, seconds=0.04)
    tried, _ = prescribe.candidates(gpu, cores=2, cuda=True)
    (pinned,) = [c for c in tried if c["key"] == "pin_memory"]
    assert pinned["change"] == {"loader": {"pin_memory": True}, "non_blocking": True}
    assert pinned["predicted"] == pytest.approx(10 / 6, rel=1e-3)
    assert (pinned["basis"]["copies_per_step"], pinned["basis"]["mb_per_step"]) == (2, 8)
    edit = doctor_words.snippet({**pinned, "site": {**pinned["site"], "source": "loader = DataLoader(d)"}})
    assert "+ loader = DataLoader(d, pin_memory=True)" in edit and "non_blocking=True" in edit
    words = doctor_words.pinned_basis(pinned["basis"])
    assert "4 ms of the 10 ms step" in words and "0% from pinned memory" in words

    def reason(facts_copies: dict | None, loader: bool = True, cuda: bool = True) -> str:
        b = baseline(2.0)
        b["facts"]["copies"] = facts_copies
        if not loader:
            b["facts"]["sites"] = []
        _, skipped = prescribe.candidates(b, cores=2, cuda=cuda)
        return next(s["reason"] for s in skipped if s["key"] == "pin_memory")

    assert reason(copies(calls=20, pinned=20, blocking=0, seconds=0.001)) == "copies_async"
    assert reason(None) == reason(copies(calls=0, pinned=0, blocking=0, seconds=0.0)) == "no_copies"
    assert reason(copies(calls=20, pinned=0, blocking=20, seconds=0.04), loader=False) == "no_loader_to_pin"
    assert reason(copies(calls=20, pinned=0, blocking=20, seconds=0.04), cuda=False) == "no_gpu"


def test_on_a_gpu_autocast_is_tried_on_the_gpu_from_the_products_device_time():
    """On a GPU the matrix products' share is their device time (their CPU time is the launches'),
    and the trial's autocast is the GPU's; on the CPU, the CPU's."""
    top10 = {
        "active_steps": 2,
        "profiled_cost": {"active_step_ms": 10.0},
        "rows": [
            {"name": "aten::mm", "self_cpu_us": 200.0, "self_device_us": 12_000.0},
            {"name": "aten::relu", "self_cpu_us": 100.0, "self_device_us": 1_000.0},
        ],
    }
    assert prescribe.gemm_pct(top10) == pytest.approx(1.0)  # 0.1 ms of CPU a step
    assert prescribe.gemm_pct(top10, device=True) == pytest.approx(60.0)
    b = baseline(2.0)
    b["gemm_pct"] = prescribe.gemm_pct(top10, device=True)
    (gpu,) = [c for c in prescribe.candidates(b, cores=2, bf16=True, cuda=True)[0] if c["key"] == "autocast"]
    (cpu,) = [c for c in prescribe.candidates(b, cores=2, bf16=True)[0] if c["key"] == "autocast"]
    assert gpu["change"] == {"autocast": "bf16", "autocast_device": "cuda"} and gpu["compute_share"] == 0.6
    assert cpu["change"]["autocast_device"] == "cpu"
    assert "torch.autocast('cuda', dtype=torch.bfloat16)" in doctor_words.snippet(gpu)
    _, skipped = prescribe.candidates(b, cores=2, bf16=False, cuda=True)
    no_bf16 = next(s for s in skipped if s["key"] == "autocast")
    assert "this GPU" in doctor_words.REASONS[no_bf16["reason"]](no_bf16)


def test_a_copy_to_the_gpu_is_told_from_any_other_move():
    """The device a `Tensor.to` call moves to, however it is named (positional or keyword, a
    device, its name, an index); a dtype alone moves nowhere."""
    import torch

    cuda = torch.device("cuda")
    for args, kwargs in [
        (("cuda",), {}),
        ((cuda,), {}),
        (("cuda:1", torch.float16), {}),
        ((), {"device": "cuda"}),
        ((0,), {}),
    ]:
        assert trial.copy_target(torch, args, kwargs).type == "cuda", (args, kwargs)
    assert trial.copy_target(torch, ("cpu",), {}).type == "cpu"
    assert trial.copy_target(torch, (torch.zeros(1),), {}).type == "cpu"  # another tensor's device
    assert trial.copy_target(torch, (torch.float16,), {}) is None
    assert trial.copy_target(torch, ("not a device",), {}) is None


def test_a_trials_copies_to_the_gpu_are_counted_and_made_non_blocking_when_it_says_so():
    """The wrapper of `Tensor.to`/`.cuda` in a trial (on a CPU, around a stand-in for the copy):
    copies to the GPU counted with their bytes and blocking ones; with the change, made
    non-blocking unless the script passed non_blocking itself; other moves left as they were."""
    import torch

    calls: list[dict] = []

    def move(tensor, *args, **kwargs):  # stands for the copy torch makes on a machine with a GPU
        calls.append(kwargs)
        return tensor

    x = torch.zeros(1000)
    for force in (False, True):
        counted = [0, 0, 0, 0, 0.0]
        to = trial.copying(torch, move, True, force, counted)
        cuda = trial.copying(torch, move, False, force, counted)
        calls.clear()
        to(x, "cuda"), to(x, torch.float16), to(x, "cuda", torch.float16, False), cuda(x), to(x, "cpu")
        assert counted[:4] == [3, 12_000, 0, 3 if not force else 1]
        assert [c.get("non_blocking") for c in calls] == ([None] * 5 if not force else [True, None, None, True, None])
