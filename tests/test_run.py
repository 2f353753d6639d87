"""`dlscope run` on real training scripts written the ways users write them (tests/scripts/):
step counts, anatomy, phases, top-10, exit status, and the one merged timeline checked with our
own loader. Each run is a real subprocess under the bootstrap; sizes are a few dozen steps."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from dlscope.analysis import timeline
from dlscope.analysis.stepfile import StepFile
from dlscope.analysis.steptable import open_stream
from dlscope.cli import main
from dlscope.contract.live import read_all
from dlscope.contract.records import clocks
from dlscope.report.blocks import Findings
from dlscope.report.sections import steps as steps_report
from dlscope.rundir import load_results
from dlscope.supervise import watching
from dlscope.supervise.iotrace import strace

SCRIPTS = Path(__file__).parent / "scripts"
FAST_PROFILE = ["--profile-steps", "2", "--wait", "1", "--warmup", "1"]


def dlscope_run(tmp_path: Path, script: str, *args: str, options: tuple[str, ...] = ()) -> tuple[int, dict, Path]:
    out = tmp_path / "run"
    code = main(["run", "--out", str(out), *FAST_PROFILE, *options, "--", sys.executable, str(SCRIPTS / script), *args])
    return code, load_results(out)["sections"], out


def phase_names(sections: dict) -> dict[str, dict]:
    return {t["phase"]: t for t in sections["phases"]["totals"]}


def check_timeline(out: Path, sections: dict) -> timeline.Trace:
    """Valid Trace Event Format, slices nest per track, operators inside steps (or eval)."""
    trace = timeline.load(out / sections["run"]["timeline"])
    assert timeline.nesting_errors(trace) == []
    pid = sections["steps"]["main_pid"]
    steps = trace.tracks_named(pid, "steps")
    assert len(steps) == sections["steps"]["count"]
    allowed = steps + [s for s in trace.tracks_named(pid, "phases") if s.name in ("eval", "checkpoint_save")]
    ops = [s for key, s in trace.all_slices("cpu_op") if key[0] == pid]
    assert ops, "the profiler's operators are on the timeline"
    outside = [s.name for s in ops if not timeline.inside(s.start, s.end, allowed, tolerance_us=1.0)]
    assert outside == []
    return trace


def check_markers(trace: timeline.Trace, pid: int) -> int:
    """Each marker syscall of a phase `dlscope run` found falls inside that phase's slice (markers the
    script emits itself — dlscope.load_mnist's data_load — have no slice of ours)."""
    phases = trace.tracks_named(pid, "phases")
    ours = {p.name for p in phases}
    markers = [
        m
        for key, ms in trace.instants.items()
        if key[0] == pid
        for m in ms
        if m.cat == "phase_marker" and m.args["phase"] in ours
    ]
    for m in markers:
        same = [p for p in phases if p.name == m.args["phase"]]
        assert timeline.inside(m.start, m.start, same), f"{m.name} at {m.start} outside its phase slice"
    return len(markers)


@pytest.mark.slow
def test_mnist_basic_style_script(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the script saves mnist_cnn.pt in its working directory
    args = ["--train", "256", "--test", "100", "--epochs", "2", "--batch-size", "32", "--workers", "1", "--save-model"]
    code, sections, out = dlscope_run(tmp_path, "mnist_basic.py", *args, options=("--tensorboard",))
    assert code == 0
    steps = sections["steps"]
    assert (steps["source"], steps["count"]) == ("optimizer", 16)  # 2 epochs × 256/32
    assert sections["anatomy"]["data_source"] == "loader"
    workers = [p for p in sections["run"]["processes"] if p["forked"]]
    assert len(workers) >= 2  # a DataLoader worker per epoch, forked: the bootstrap followed them
    assert all(p["ppid"] == steps["main_pid"] for p in workers)
    # the training loader: one worker, a new one per epoch; the test loader: none (the main process)
    batches = sections["batches"]
    assert batches["batches_taken"] == batches["joined"] and batches["in_steps"] == 16  # not the test batches
    assert [(w["worker"], w["processes"]) for w in batches["workers"]] == [(None, 1), (0, len(workers))]
    assert sections["anatomy"]["verdict"]["level"] in ("highly", "moderately", "not")
    phases = phase_names(sections)
    assert {"startup", "first_batch", "train_steps"} <= set(phases)
    assert phases["eval"]["count"] == 2  # test() after each epoch
    assert phases["checkpoint_save"]["files"] == ["mnist_cnn.pt"]
    top = sections["top10"]
    assert len(top["rows"]) == 10 and top["active_steps"] == 2
    assert [r["ops"] > 0 for r in top["ops_per_step"]] == [True, True]
    check_timeline(out, sections)
    assert list((out / "tensorboard").glob("events.out.tfevents.*"))
    assert (out / "report.html").exists() and "Step anatomy" in (out / "report.md").read_text()
    assert "Batches: the data flow" in (out / "report.md").read_text()


@pytest.mark.slow
@pytest.mark.skipif(strace.available() is not None, reason="strace is not installed (scripts/install-tracers)")
def test_memmap_loop_with_checkpoints_under_strace(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    args = [str(data), "--steps", "12", "--save-every", "5"]
    code, sections, out = dlscope_run(
        tmp_path, "memmap_loop.py", *args, options=("--trace-io", "--trace-backend", "strace")
    )
    assert code == 0
    assert (sections["steps"]["source"], sections["steps"]["count"]) == ("optimizer", 12)
    assert sections["anatomy"]["data_source"] == "none"  # no DataLoader: the gap before forward, not "data"
    assert sections["anatomy"]["verdict"]["key"] == "no_data_source"
    phases = phase_names(sections)
    assert phases["checkpoint_save"]["count"] == 2 and phases["checkpoint_load"]["count"] == 1
    assert phases["checkpoint_save"]["files"] == [str(data / "ckpt.pt")]
    assert sections["top10"]["rows"]
    assert sections["iotrace"]["backend"] == "strace"
    iotrace_phases = {p["phase"] for p in sections["iotrace"]["phases"]}
    assert {"checkpoint_save", "train_steps"} <= iotrace_phases  # the tracer saw our markers
    trace = check_timeline(out, sections)
    assert check_markers(trace, sections["steps"]["main_pid"]) >= 8
    writes = [s for key, s in trace.all_slices("write") if s.args.get("path", "").endswith("ckpt.pt")]
    saves = trace.tracks_named(sections["steps"]["main_pid"], "phases")
    assert writes and all(
        timeline.inside(w.start, w.start, [p for p in saves if p.name == "checkpoint_save"]) for w in writes
    )


# what `dlscope run` imports up to starting the command (the runner, the stage, the supervisor)
LAUNCH_IMPORTS = """
import sys
import dlscope.cli, dlscope.console, dlscope.report.sections, dlscope.report.terminal, dlscope.runner
import dlscope.stages.registry, dlscope.supervise.session
after = ["numpy", "matplotlib", *(f"dlscope.analysis.{m}" for m in ("observed", "steptable", "timeline", "batchflow"))]
print(sorted(m for m in sys.modules if m in after))
"""


def test_dlscope_starts_the_command_before_importing_its_analysis():
    """numpy and the analysis (0.1 s of imports on an idle machine, several times that on a busy
    one) are imported once the command has started, not before: the command's start-up does not
    wait for them. (The report's renderer is imported in a thread the runner starts.)"""
    out = subprocess.run([sys.executable, "-c", LAUNCH_IMPORTS], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["[]"]


@pytest.mark.slow
@pytest.mark.timing
def test_keras_fit_on_torch_counts_its_own_optimizer_steps(tmp_path, capfd):
    """Keras has its own optimizer, which its train_step runs under torch.no_grad() after
    backward(): each of its updates is the step's optimizer part, within the script's own clock
    around the optimizer's `apply` (before, it was "other" and the optimizer read 0%). Keras makes
    a new DataLoader for each epoch and each validation: the loaders table has a row for the
    training loaders and one for the validation's, named short at 80 columns."""
    args = ("--n", "160", "--batch-size", "32", "--epochs", "3", "--validation", "--truth")
    code, sections, out = dlscope_run(tmp_path, "keras_fit.py", *args)
    assert code == 0
    assert (sections["steps"]["source"], sections["steps"]["count"]) == ("update", 15)
    (place,) = sections["steps"]["update_places"]
    assert (Path(place["file"]).parts[-3:], place["function"]) == (("backend", "torch", "trainer.py"), "train_step")
    truth = dict(re.findall(r"(\w+)=(\S*)", capfd.readouterr().out.split("TRUTH ")[1].splitlines()[0]))
    apply_ms = [float(ms) for ms in truth["step_apply_ms"].split(",")]
    steps = StepFile(out / sections["steps"]["file"])
    optimizer_ms = [float(s["optimizer"]) * 1e3 for s in open_stream(steps)[1]]
    assert len(apply_ms) == len(optimizer_ms) == 15
    # the no_grad block around `apply` holds it: dlscope's clock at least the script's (rounded to
    # the µs), and little more than it in the median step (the block's own two calls)
    assert all(o >= a - 0.01 for o, a in zip(optimizer_ms, apply_ms, strict=True))
    ratios = sorted(o / a for o, a in zip(optimizer_ms, apply_ms, strict=True))
    assert ratios[len(ratios) // 2] <= 1.5, ratios
    assert sections["top10"]["rows"]
    assert [t["count"] for t in sections["phases"]["totals"] if t["phase"] == "eval"] == [3]
    loaders = sections["batches"]["loaders"]
    # (Keras's _symbolic_build draws one batch of a training loader of its own before the first epoch)
    assert [(lo["loaders"], lo["passes"], lo["in_steps"] > 0) for lo in loaders] == [(4, 4, True), (3, 3, False)]
    assert [lo["batches_taken"] for lo in loaders][1] == 3 * 2  # 64 images, 32 a batch, each validation
    report = (out / "report.md").read_text()
    assert "ArrayDataset (keras)" in report and "keras.src" not in report
    check_timeline(out, sections)


@pytest.mark.slow
def test_compiled_model_with_gradient_accumulation(tmp_path):
    args = ["--n", "192", "--batch-size", "16", "--accumulate", "2", "--backend", "aot_eager"]
    code, sections, out = dlscope_run(
        tmp_path, "compiled_accumulation.py", *args, options=("--trace-io", "--trace-backend", "proc")
    )
    assert code == 0
    assert (sections["steps"]["source"], sections["steps"]["count"]) == ("optimizer", 6)  # 12 micro-batches / 2
    assert sections["top10"]["rows"]
    assert sections["iotrace"]["backend"] == "proc"
    trace = check_timeline(out, sections)
    assert check_markers(trace, sections["steps"]["main_pid"]) >= 4


def test_exception_passes_its_exit_status_and_leaves_a_report(tmp_path):
    code, sections, out = dlscope_run(tmp_path, "raises.py")
    assert code == 1
    assert sections["steps"]["count"] == 8
    assert load_results(out)["run"]["status"] == "failed"
    assert "exited with status 1" in (out / "report.md").read_text()
    # the profile of steps 3-4 was delivered before the failure, and Meta's analyser reads it
    from hta.trace_analysis import TraceAnalysis

    trace = out / sections["top10"]["trace"]
    analysis = TraceAnalysis(trace_dir=str(trace.parent))
    events = analysis.t.get_trace(analysis.t.get_ranks()[0])
    names = set(analysis.t.symbol_table.sym_table)
    assert len(events) > 0 and {r["name"] for r in sections["top10"]["rows"]} <= names


# dlscope's own process, with the run's outcome and whether it ever imported torch
PARENT = """
import sys
from dlscope.cli import main
code = main(sys.argv[1:])
print(code, "torch" in sys.modules)
"""


def test_the_run_process_never_imports_torch(tmp_path):
    # the observed script uses torch and is profiled; dlscope's own process reads its records, top-10
    # and TensorBoard scalars included, without torch (~250 MiB of RSS and seconds of import on a long run's report)
    script = tmp_path / "loop.py"
    script.write_text(
        "import torch\nmodel = torch.nn.Linear(4, 2)\noptimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for _ in range(8):\n    optimizer.zero_grad()\n    model(torch.randn(8, 4)).sum().backward()\n"
        "    optimizer.step()\n"
    )
    out = tmp_path / "run"
    argv = ["run", "--out", str(out), "--tensorboard", *FAST_PROFILE, "--", sys.executable, str(script)]
    done = subprocess.run([sys.executable, "-c", PARENT, *argv], capture_output=True, text=True, check=True)
    assert done.stdout.split()[-2:] == ["0", "False"]
    sections = load_results(out)["sections"]
    assert sections["top10"]["rows"]  # the profile was read, without torch
    # and the scalars written with TensorBoard's own writer read back with its reader, one a step
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(out / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    scalars = events.Scalars("step/ms")
    assert len(scalars) == sections["steps"]["count"] and all(s.value > 0 for s in scalars)
    assert "anatomy/optimizer_ms" in events.Tags()["scalars"]


def test_sigkill_still_leaves_steps_and_a_report(tmp_path):
    code, sections, out = dlscope_run(tmp_path, "raises.py", "--kill", options=("--profile-steps", "0"))
    assert code == 137  # 128 + SIGKILL, as a shell reports it
    assert sections["steps"]["count"] == 8
    train = [r for r in sections["phases"]["rows"] if r["phase"] == "train_steps"]
    assert train and not train[0]["closed"]  # never closed by the process: ended at its last record
    timeline.load(out / sections["run"]["timeline"])


def test_bootstrap_chains_to_the_sitecustomize_it_shadows(tmp_path, observe_script):
    site = tmp_path / "site"
    site.mkdir()
    flag = tmp_path / "site-ran"
    (site / "sitecustomize.py").write_text(f"open({str(flag)!r}, 'w').write('yes')\n")
    script = tmp_path / "train.py"
    script.write_text(
        "import torch\nm = torch.nn.Linear(4, 1)\no = torch.optim.SGD(m.parameters(), lr=0.1)\n"
        "for _ in range(3):\n    o.zero_grad(); m(torch.ones(2, 4)).sum().backward(); o.step()\n"
        "import sitecustomize, sys\nprint(sitecustomize.__file__)\n"
    )
    env = {"PYTHONPATH": str(site), "RANK": "3", "WORLD_SIZE": "4"}
    results, code = observe_script([sys.executable, str(script)], tmp_path / "run", profile_steps=0, extra_env=env)
    assert code == 0 and flag.read_text() == "yes"
    assert results["sections"]["steps"]["count"] == 3
    process = results["sections"]["run"]["processes"][0]
    assert (process["rank"], process["world_size"]) == (3, 4)  # what torchrun sets, kept per process


def test_cli_rejects_bad_input_in_one_line(tmp_path, capsys):
    out = str(tmp_path / "run")
    assert main(["run", "--out", out, "--", "no-such-command-xyz"]) == 2
    assert main(["run", "--out", out]) == 2
    assert main(["run", "--out", out, "--profile-steps", "-1", "--", sys.executable, "-c", "pass"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all(line.startswith("dlscope: error:") for line in err)
    with pytest.raises(SystemExit) as exit_:
        main(["run", "--trace-i", "--", sys.executable, "-c", "pass"])  # no abbreviations
    assert exit_.value.code == 2


def test_clock_map_puts_boottime_and_realtime_stamps_on_one_clock():
    start = clocks()
    time.sleep(0.01)
    now = clocks()
    clock = timeline.ClockMap.sampled(start, clocks())
    from_boot = clock.boottime_s(now["boottime"] / 1e9)
    from_real = clock.realtime_s(now["realtime"] / 1e9)
    assert abs(from_boot - from_real) < 1000  # µs: the two stamps were taken back to back
    assert from_real > 9000  # ≥ the 10 ms slept, in µs from the start


def test_loader_rejects_bad_traces_and_finds_overlaps(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": [{"ph": "X", "name": "a", "pid": 1, "tid": 1, "ts": 0}]}))
    with pytest.raises(timeline.TraceFormatError, match="duration"):
        timeline.load(path)
    path.write_text(json.dumps({"traceEvents": [{"ph": "E", "name": "a", "pid": 1, "tid": 1, "ts": 0}]}))
    with pytest.raises(timeline.TraceFormatError, match="never began"):
        timeline.load(path)
    crossing = [
        {"ph": "X", "name": "a", "pid": 1, "tid": 1, "ts": 0, "dur": 10},
        {"ph": "X", "name": "b", "pid": 1, "tid": 1, "ts": 5, "dur": 10},
        {"ph": "X", "name": "c", "pid": 1, "tid": 2, "ts": 5, "dur": 10},
    ]
    path.write_text(json.dumps({"traceEvents": crossing}))
    errors = timeline.nesting_errors(timeline.load(path))
    assert len(errors) == 1 and "overlaps a" in errors[0]


def test_ctrl_c_stops_the_command_and_still_leaves_a_report(tmp_path):
    out = tmp_path / "run"
    argv = [sys.executable, "-m", "dlscope.cli", "run", "--out", str(out), "--profile-steps", "0"]
    dlscope = subprocess.Popen([*argv, "--", sys.executable, str(SCRIPTS / "endless.py")], stdout=subprocess.DEVNULL)
    records = out / "processes"
    deadline = time.monotonic() + 120
    while not any(StepFile(p).count for p in records.glob("*.steps")):
        assert time.monotonic() < deadline and dlscope.poll() is None, "no step recorded"
        time.sleep(0.2)
    dlscope.send_signal(signal.SIGINT)  # as the terminal does on Ctrl-C (the child gets it from dlscope)
    assert dlscope.wait(timeout=120) == 130
    results = load_results(out)
    assert results["run"]["status"] == "interrupted"
    assert results["sections"]["steps"]["count"] >= 1 and (out / "report.html").exists()


# a GAN's loop: the discriminator's optimizer, then the generator's, each iteration
IN_TURN = """
import torch
g, d = torch.nn.Linear(2, 4), torch.nn.Linear(4, 1)
opt_d, opt_g = torch.optim.Adam(d.parameters()), torch.optim.SGD(g.parameters(), lr=0.1)
for _ in range(ITERATIONS):
    fake = g(torch.randn(8, 2))
    opt_d.zero_grad()
    d(fake.detach()).mean().backward()
    opt_d.step()
    opt_g.zero_grad()
    (-d(fake).mean()).backward()
    opt_g.step()
"""


@pytest.mark.parametrize("optimizers", [2, 1])
def test_optimizers_stepping_in_turn_are_named_with_their_steps(tmp_path, optimizers):
    script = tmp_path / "gan.py"
    text = IN_TURN.replace("ITERATIONS", "9")
    script.write_text(text if optimizers == 2 else text.replace("    opt_g.step()\n", ""))
    out = tmp_path / "run"
    assert main(["run", "--out", str(out), "--profile-steps", "0", "--", sys.executable, str(script)]) == 0
    steps = load_results(out)["sections"]["steps"]
    if optimizers == 2:
        assert steps["count"] == 18
        in_turn = [{"class": "Adam", "steps": 9, "first": 0}, {"class": "SGD", "steps": 9, "first": 1}]
        assert steps["optimizers_in_turn"] == in_turn
        assert "2 torch optimizers stepped in turn: Adam (9 steps), SGD (9 steps)" in (out / "report.md").read_text()
    else:
        assert steps["count"] == 9 and "optimizers_in_turn" not in steps


# a sweep: a model and an optimizer made anew for each size, each trained in turn, the later
# steps slower (a larger model); the optimizers are freed as they go (a new one may take the
# address of one freed: no optimizer is taken for another)
IN_SEQUENCE = """
import torch
torch.set_num_threads(1)  # OpenMP threads spinning against a busy neighbour hid the change in their scatter
def train(width, steps):
    model = torch.nn.Sequential(torch.nn.Linear(64, width), torch.nn.ReLU(), torch.nn.Linear(width, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(256, 64)
    for _ in range(steps):
        optimizer.zero_grad()
        model(x).square().mean().backward()
        optimizer.step()
for width in (WIDTHS):
    train(width, STEPS)
"""


def test_optimizers_stepping_one_after_another_are_named_with_their_step_ranges(tmp_path):
    script = tmp_path / "sweep.py"
    # (80 steps each, the last model 8192 wide: the change stands out of a loaded machine's scatter,
    # which at 40 steps and 4096 once hid it from the change-point test)
    script.write_text(IN_SEQUENCE.replace("WIDTHS", "8, 8, 8, 8192").replace("STEPS", "80"))
    out = tmp_path / "run"
    assert main(["run", "--out", str(out), "--profile-steps", "0", "--", sys.executable, str(script)]) == 0
    steps = load_results(out)["sections"]["steps"]
    assert steps["count"] == 320 and "optimizers_in_turn" not in steps
    assert [(o["first"], o["steps"]) for o in steps["optimizers_in_sequence"]] == [
        (0, 80),
        (80, 80),
        (160, 80),
        (240, 80),
    ]
    report = (out / "report.md").read_text()
    assert "4 torch optimizers stepped one after another" in report and "SGD (steps 240–319)" in report
    # the 64→8192→1 model's steps are many times slower: a change where the 4th optimizer takes over
    assert any(abs(c["step"] - 240) <= 1 for c in steps["change_points"]), steps["change_points"]
    assert "where optimizer 4 (SGD) takes over" in report


EPISODES = """
import torch
torch.set_num_threads(1)
policy = torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.Tanh(), torch.nn.Linear(64, 2))
optimizer = torch.optim.Adam(policy.parameters(), lr=1e-3)
for episode in range(240):
    log_probs = []
    for t in range(4 if episode < 120 else 24):  # the policy survives longer: episodes grow 6x
        log_probs.append(torch.log_softmax(policy(torch.randn(1, 8)), -1)[0, 0])
    optimizer.zero_grad()
    torch.stack(log_probs).sum().backward()
    optimizer.step()
"""


def test_a_step_time_change_from_longer_episodes_is_more_forwards_not_slower_work(tmp_path):
    """REINFORCE's shape: one step an episode, a forward per action, and episodes that grow as the
    policy learns. The step time changes where they grow; dlscope counts the forwards a step and
    says the step does more work, rather than that the job slowed down."""
    script = tmp_path / "episodes.py"
    script.write_text(EPISODES)
    out = tmp_path / "run"
    assert main(["run", "--out", str(out), "--profile-steps", "0", "--", sys.executable, str(script)]) == 0
    changes = load_results(out)["sections"]["steps"]["change_points"]
    change = next(c for c in changes if abs(c["step"] - 120) <= 1)
    assert change["forwards"] == [4, 24]
    # information, not a warning, where the step took no more than ALIKE × 6 the time for 6x the
    # work (3-4x here at quiet; on a loaded machine 3 ms steps are preempted where 0.9 ms ones are
    # not, and the ratio reached 8-12): the verdict follows the run's own medians
    explained = change["after_ms"] / change["before_ms"] <= steps_report.ALIKE * 24 / 4
    assert ("\n- From step 120 " in (out / "report.md").read_text()) == explained  # (a warning reads "- ⚠ From")
    assert "each step ran more forwards (median 4 → 24)" in (out / "report.md").read_text()
    # had other processes trained beside it on too few cores, the change would say so too
    steps = load_results(out)["sections"]["steps"]
    assert "contention comes and goes" not in " ".join((out / "report.md").read_text().split())
    steps["sharing"] = {"pids": [1, 2], "threads": {"1": 2, "2": 2}, "threads_total": 4, "cores": 2,
                        "alone_ms": None, "shared_ms": 5.0, "alone_steps": 0, "shared_steps": len(changes)}  # fmt: skip
    said = [text for b in steps_report.render(steps) if isinstance(b, Findings) for _, text in b.items]
    assert any(t.startswith("From step 120 ") and t.endswith("contention comes and goes.") for t in said)


HOGWILD = """
import sys, time, torch, torch.multiprocessing as mp
from torch.utils.data import DataLoader, TensorDataset
def train(rank, model, started):
    if len(sys.argv) > 1:  # each trainer's intra-op threads
        torch.set_num_threads(int(sys.argv[1]))
    x = torch.randn(640, 16)
    loader = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=32, num_workers=1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for i, (x, y) in enumerate(loader):
        if i == 0:  # both train at once, however late a loader's worker started (a loaded machine)
            started.wait()
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
        time.sleep(0.005)
if __name__ == "__main__":
    mp.set_start_method("fork")
    model = torch.nn.Linear(16, 1)
    model.share_memory()
    started = mp.Barrier(2)
    trainers = [mp.Process(target=train, args=(r, model, started)) for r in range(2)]
    [p.start() for p in trainers]
    [p.join() for p in trainers]
"""


def test_forked_processes_that_train_are_not_called_dataloader_workers(tmp_path):
    """pytorch/examples' mnist_hogwild: forked processes train a shared model, each with its own
    DataLoader worker. The trainers are forked processes with steps; only the DataLoader's are
    workers — in the report, the live files `dlscope watch` and the hang watchdog read, and watch's
    main process (before: the parent, which never steps)."""
    script = tmp_path / "hogwild.py"
    script.write_text(HOGWILD)
    out = tmp_path / "run"
    assert main(["run", "--out", str(out), "--", sys.executable, str(script)]) == 0
    results = load_results(out)["sections"]
    assert results["top10"]["why_empty"] == "forked"  # (not "the profiler had not finished")
    processes = {p["pid"]: p for p in results["run"]["processes"]}
    trainers = [p["pid"] for p in results["steps"]["processes"] if p["count"] == 20]
    assert len(trainers) == 2 and len(processes) == 5
    assert all(processes[t]["forked"] and processes[t]["loader_worker"] is None for t in trainers)
    workers = [p for p in processes.values() if p["loader_worker"] is not None]
    assert sorted(p["ppid"] for p in workers) == sorted(trainers) and all(p["loader_worker"] == 0 for p in workers)
    views = {v.pid: v for v in read_all(out / "processes")}
    assert [views[t].loader_worker for t in trainers] == [False, False]
    assert all(views[p["pid"]].loader_worker for p in workers)
    assert watching.snapshot(out / "processes", 5)["main_pid"] in trainers
    assert "loader worker 0" in (out / "report.md").read_text()
    # the two trained at once, each with the threads they inherited from their parent
    sharing = results["steps"]["sharing"]
    cores, threads = len(os.sched_getaffinity(0)), torch.get_num_threads()
    assert sorted(sharing["pids"]) == sorted(trainers) and sharing["cores"] == cores
    assert sharing["threads_total"] == 2 * threads
    report = " ".join((out / "report.md").read_text().split())
    assert "2 processes trained at once on this machine" in report
    assert ("oversubscribed" in report) == (2 * threads > cores)
    if 2 * threads > cores:
        assert f"torch.set_num_threads({max(cores // 2, 1)}) in each" in report


def test_processes_that_train_at_once_with_a_core_each_are_not_oversubscribed(tmp_path):
    """The hogwild trainers set one intra-op thread each (after the fork: their own records, not
    their parent's count): 2 threads, on a machine of at least 2 cores no warning."""
    script = tmp_path / "hogwild.py"
    script.write_text(HOGWILD)
    out = tmp_path / "run"
    assert main(["run", "--out", str(out), "--profile-steps", "0", "--", sys.executable, str(script), "1"]) == 0
    sharing = load_results(out)["sections"]["steps"]["sharing"]
    assert sharing["threads_total"] == 2 and set(sharing["threads"].values()) == {1}
    report = " ".join((out / "report.md").read_text().split())
    assert "with 2 intra-op threads (1 each, torch.get_num_threads)" in report
    assert "oversubscribed" not in report or len(os.sched_getaffinity(0)) < 2


def test_no_operator_profile_says_why(tmp_path):
    """A run too short for the profiler's window, and one with the profiler off, say so (before,
    both read "the profiler had not finished when the command ended")."""
    script = tmp_path / "three.py"
    script.write_text(
        "import torch\nmodel = torch.nn.Linear(4, 2)\noptimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for _ in range(3):\n    optimizer.zero_grad()\n    model(torch.randn(8, 4)).sum().backward()\n"
        "    optimizer.step()\n"
    )
    for options, why in (
        (["--start-after", "1", "--wait", "1", "--warmup", "1"], "too_few"),
        (["--profile-steps", "0"], "off"),
    ):
        out = tmp_path / why
        assert main(["run", "--out", str(out), *options, "--", sys.executable, str(script)]) == 0
        assert load_results(out)["sections"]["top10"]["why_empty"] == why
    assert "the run ended after 3 steps, before the profiler's window had ended (it needs " in " ".join(
        (tmp_path / "too_few" / "report.md").read_text().split()
    )
    assert (
        "No operator profile: the profiler was off (--profile-steps 0)." in (tmp_path / "off" / "report.md").read_text()
    )


def test_a_run_directory_given_again_holds_only_the_new_runs_processes(tmp_path):
    script = tmp_path / "loop.py"
    script.write_text(IN_TURN.replace("ITERATIONS", "3"))
    out = tmp_path / "run"
    argv = ["run", "--out", str(out), "--profile-steps", "0", "--", sys.executable, str(script)]
    assert main(argv) == 0
    first = load_results(out)["sections"]["steps"]["main_pid"]
    assert main(argv) == 0
    steps = load_results(out)["sections"]["steps"]
    assert steps["main_pid"] != first
    assert [p["pid"] for p in steps["processes"] if p["count"]] == [steps["main_pid"]]
