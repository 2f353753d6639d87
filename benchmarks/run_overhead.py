"""Overhead of `dlscope run` on a training script: the script bare vs under `dlscope run` with
the default profiler schedule (8 profiled steps after the first, then the profiler is off),
interleaved round by round so machine noise hits both alike. Medians and ratios for two spans:
  - command: the script's own wall time (bare: the subprocess; observed: results.json's
    run.wall_seconds, start to exit of the command under the bootstrap and hooks);
  - whole: the whole `dlscope run` process, analysis, timeline and report included.
Then the hooks' own cost per step, which start-up noise hides far less: the median of 40 timed
training steps inside the process (the handout's Net, batch 64), bare and under the bootstrap
with the profiler off, interleaved. And their cost per call, which noise hides least: a tiny
module's forward and a tiny backward + optimizer step, timed in bursts, bare and hooked.

With --tiny-steps N (issue 23's Done-when: 200,000): a tiny loop (Linear 16→4, batch 32, SGD,
1 thread) bare and under `dlscope run --profile-steps 0`, in interleaved pairs; each run times its
own loop, so (observed − bare) / N is the always-on cost per step.
With --hook-pairs N: the hooks installed and removed between bursts of the same tiny loop in one
process, N pairs (DLSCOPE_FASTPATH=0 in the environment: the Python step machine).
With --instructions N: machine instructions per tiny step under valgrind's callgrind, bare and
through the hooks (and --baseline's): counts, which a loaded machine does not blur.
--loop update makes the tiny step of --tiny-steps and --instructions one with no torch optimizer:
backward() then a hand-written SGD under torch.no_grad() (its steps end at backward() before
dlscope knew such an update, at the update's end since: injob/updates.py); --loop bare, the same
update outside no_grad through `.data` (`p.data.add_(p.grad, alpha=-lr)`).
With --long-steps N (1,000,000): one `dlscope run` of N minimal steps (an optimizer step on one
parameter); the run directory's size, results.json's size, dlscope's own peak RSS (its
RUSAGE_SELF, the command not included) and the seconds from the job's last step to the report.

    .venv/bin/python benchmarks/run_overhead.py [--rounds 3] [--train 1920] [--epochs 1] [--skip-script]
    .venv/bin/python benchmarks/run_overhead.py --skip-script --step-rounds 0 --tiny-steps 200000 --long-steps 1000000
    .venv/bin/python benchmarks/run_overhead.py --skip-script --rounds 0 --tiny-steps 20000 --baseline /work/main
    .venv/bin/python benchmarks/run_overhead.py --skip-script --rounds 0 --ops --instructions 300 --baseline /work/main
    .venv/bin/python benchmarks/run_overhead.py --skip-script --rounds 0 --loop update --instructions 300 --baseline B
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

SCRIPT = Path(__file__).resolve().parent.parent / "tests" / "scripts" / "mnist_basic.py"
STEP_TIMER = f"""
import statistics, sys, time
import torch
import torch.nn.functional as F
sys.path.insert(0, {str(SCRIPT.parent)!r})
from mnist_basic import Net
torch.manual_seed(0)
model = Net()
optimizer = torch.optim.Adadelta(model.parameters())
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(50 * 64, 1, 28, 28),
                                     torch.randint(0, 10, (50 * 64,))), batch_size=64)
times = []
for x, y in loader:
    start = time.perf_counter()
    optimizer.zero_grad()
    F.nll_loss(model(x), y).backward()
    optimizer.step()
    times.append(time.perf_counter() - start)
print(statistics.median(times[10:]))
"""


def timed(argv: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


PER_CALL = """
import statistics, sys, time
import torch
model = torch.nn.Linear(1, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
x = torch.ones(1, 1)
def burst(n=2000):
    start = time.perf_counter()
    for _ in range(n):
        optimizer.zero_grad()
        model(x).sum().backward()
        optimizer.step()
    return (time.perf_counter() - start) / n
burst(200)
print(statistics.median(burst() for _ in range(15)))
"""


def per_call(env: dict[str, str] | None) -> float:
    done = subprocess.run([sys.executable, "-c", PER_CALL], env=env, check=True, capture_output=True, text=True)
    return float(done.stdout.strip().splitlines()[-1])


def step_median(env: dict[str, str] | None) -> float:
    done = subprocess.run([sys.executable, "-c", STEP_TIMER], env=env, check=True, capture_output=True, text=True)
    return float(done.stdout.strip().splitlines()[-1])


def hook_cost(rounds: int, step_rounds: int) -> None:
    from dlscope.injob.hooks import PROFILE_ENV
    from dlscope.supervise.bootstrap_env import with_bootstrap

    bare, hooked = [], []
    with tempfile.TemporaryDirectory() as records:
        env = with_bootstrap(None, DLSCOPE_RUN_DIR=records, **{PROFILE_ENV: "1:0:0:0"})
        for i in range(step_rounds):
            bare.append(step_median(None))
            hooked.append(step_median(env))
            print(f"round {i + 1}: step median bare {bare[-1] * 1e3:.2f} ms, hooked {hooked[-1] * 1e3:.2f} ms")
        median = statistics.median
        if step_rounds:
            ratio, extra_ms = median(hooked) / median(bare), (median(hooked) - median(bare)) * 1e3
            print(f"hooks per step: {ratio:.3f}× ({extra_ms:+.2f} ms)")
        tiny_bare, tiny_hooked = [], []
        for _ in range(rounds):
            tiny_bare.append(per_call(None))
            tiny_hooked.append(per_call(env))
    extra = (median(tiny_hooked) - median(tiny_bare)) * 1e6
    print(
        f"tiny step (1 forward, backward, optimizer step): bare {median(tiny_bare) * 1e6:.1f} µs, "
        f"hooked {median(tiny_hooked) * 1e6:.1f} µs: the hooks add {extra:.1f} µs per step"
    )


# the tiny step, with a torch optimizer or with the update written by hand under no_grad (a
# script with no torch optimizer: Keras on torch, a hand-written SGD): `--loop`
TINY_STEP = """
import torch
torch.set_num_threads(1)
model = torch.nn.Linear(16, 4)
params = list(model.parameters())
x = torch.randn(32, 16)
if LOOP == "optimizer":
    optimizer = torch.optim.SGD(params, lr=0.01)

    def step():
        optimizer.zero_grad()
        model(x).sum().backward()
        optimizer.step()
elif LOOP == "update":
    def step():
        model(x).sum().backward()
        with torch.no_grad():
            for p in params:
                p -= 0.01 * p.grad
                p.grad = None
else:  # "bare": the old style outside no_grad (pytorch/examples' word_language_model)
    def step():
        model(x).sum().backward()
        for p in params:
            p.data.add_(p.grad, alpha=-0.01)
            p.grad = None
"""
TINY_LOOP = (
    """
import sys, time
LOOP = sys.argv[3]
"""
    + TINY_STEP
    + """
steps = int(sys.argv[1])
start, cpu = time.perf_counter(), time.thread_time()
for _ in range(steps):
    step()
open(sys.argv[2], "w").write(repr((time.perf_counter() - start, time.thread_time() - cpu)))
"""
)
LONG_LOOP = """
import sys, time
import torch
p = torch.nn.Parameter(torch.zeros(1))
optimizer = torch.optim.SGD([p], lr=0.0)
for _ in range(int(sys.argv[1])):
    optimizer.step()
open(sys.argv[2], "w").write(repr(time.time()))
"""
# dlscope in this process (its RUSAGE_SELF peak is dlscope's alone), then the peak and the end time
IN_PROCESS = """
import resource, sys, time
from dlscope.cli import main
code = main(sys.argv[1:])
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, time.time(), code)
"""


def loop_seconds(argv: list[str], written: Path, env: dict[str, str] | None = None) -> tuple[float, float]:
    """Run `argv`; the loop's own wall and CPU seconds, as the tiny loop wrote them to `written`."""
    subprocess.run(argv, check=True, capture_output=True, env=env)
    wall, cpu = ast.literal_eval(written.read_text())
    return float(wall), float(cpu)


def tiny_steps(steps: int, pairs: int, baseline: Path | None, loop: str = "optimizer") -> None:
    """Wall time, and the loop thread's CPU time (on a shared machine the wall time also holds
    the waits for a core, which the CPU time does not). With `baseline` (another checkout), a
    third run in each round: `dlscope run` from that checkout's src, for a before/after side by side."""
    arms = {"bare": None, "dlscope run": Path(__file__).resolve().parent.parent / "src"}
    if baseline is not None:
        arms["baseline run"] = baseline / "src"
    seconds: dict[str, list[tuple[float, float]]] = {arm: [] for arm in arms}
    calibrated: dict[str, list[float]] = {arm: [] for arm in arms if arms[arm] is not None}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(pairs):
            for arm, src in arms.items():
                written = Path(tmp) / f"seconds-{i}"
                command = [sys.executable, "-c", TINY_LOOP, str(steps), str(written), loop]
                if src is None:
                    seconds[arm].append(loop_seconds(command, written))
                    continue
                out = Path(tmp) / f"tiny-{i}-{len(calibrated[arm])}-{arm[0]}"
                dlscope = [sys.executable, "-m", "dlscope.cli", "run", "--out", str(out), "--profile-steps", "0"]
                env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), os.environ.get("PYTHONPATH", "")])}
                seconds[arm].append(loop_seconds([*dlscope, "--", *command], written, env))
                anatomy = json.loads((out / "results.json").read_text())["sections"]["anatomy"]
                calibrated[arm].append(anatomy["dlscope_us_per_step"])
            line = ", ".join(
                f"{arm} {seconds[arm][-1][0] / steps * 1e6:.1f} µs/step ({seconds[arm][-1][1] / steps * 1e6:.1f} CPU)"
                for arm in arms
            )
            print(f"round {i + 1}: {line}; calibrated: {', '.join(f'{a} {c[-1]}' for a, c in calibrated.items())}")
    median = statistics.median
    for arm in calibrated:
        for n, name in enumerate(("wall", "CPU")):
            extra = [(o[n] - b[n]) / steps * 1e6 for o, b in zip(seconds[arm], seconds["bare"], strict=True)]
            print(
                f"{steps} tiny steps ({loop}), {arm}, {name} time: always-on cost {median(extra):.1f} µs/step "
                f"(median of {pairs} interleaved rounds: {', '.join(f'{e:.1f}' for e in extra)})"
            )
        print(f"{arm}: calibrated in the process, median {median(calibrated[arm])} µs/step")


def tiny_loop() -> tuple[Any, Any, Callable[[], None]]:
    """(torch, the optimizer, one tiny step): Linear 16→4, batch 32, SGD, 1 thread."""
    import torch

    torch.set_num_threads(1)
    model, x = torch.nn.Linear(16, 4), torch.randn(32, 16)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def step() -> None:
        optimizer.zero_grad()
        model(x).sum().backward()
        optimizer.step()

    return torch, optimizer, step


def hook_pairs(rounds: int, burst: int = 200) -> None:
    """The hooks' cost per tiny step in this process: the hooks installed and removed between
    bursts of the same loop (a real SGD), `rounds` pairs, the thread's CPU time, the median of
    the pairs' differences. Run it with DLSCOPE_FASTPATH=0 in the environment for the Python machine."""
    from dlscope.contract.live import LiveStatus
    from dlscope.injob.hooks import TorchHooks
    from dlscope.injob.recorder import RecordFile

    torch, optimizer, step = tiny_loop()

    def cpu_us() -> float:
        start = time.thread_time()
        for _ in range(burst):
            step()
        return (time.thread_time() - start) / burst * 1e6

    with tempfile.TemporaryDirectory() as scratch:
        hooks = TorchHooks(RecordFile(scratch), (1, 0, 0, 0))
        hooks.torch, hooks.is_compiling = torch, torch.compiler.is_compiling
        hooks.machine.on_step = LiveStatus(scratch, None).step_ended
        for _ in range(burst):
            step()
        differences = []
        for _ in range(rounds):
            bare = cpu_us()
            remove = hooks.step_hooks(torch)
            hooks.time_optimizer(type(optimizer))
            step()  # the module called at top level found, as a job's first step does
            differences.append(cpu_us() - bare)
            remove()
        taken = hooks.machine.fast_taken if hooks.machine.fast else 0
    print(
        f"hooks' cost per tiny step in the process ({'C path' if taken else 'Python machine'}): "
        f"{statistics.median(differences):.1f} µs (median of {rounds} pairs of {burst}-step bursts; "
        f"{taken} steps taken in C)"
    )


def count_ops(steps: int = 50) -> None:
    """What a tiny step executes in Python, bare and through the hooks (a scratch observer, as the
    calibration drives it): bytecodes and calls per step, dlscope's and torch's apart, and
    dlscope's by function. Counts, not times: the same on a loaded machine as on an idle one."""
    import collections
    import tempfile

    from dlscope.contract.live import LiveStatus
    from dlscope.injob.hooks import TorchHooks
    from dlscope.injob.recorder import RecordFile

    torch, optimizer, step = tiny_loop()

    ops: collections.Counter = collections.Counter()
    calls: collections.Counter = collections.Counter()

    def tracer(frame, event, arg):  # sys.settrace signature
        code = frame.f_code
        owner = "dlscope" if "/dlscope/" in code.co_filename else "torch and the loop"
        if event == "call":
            frame.f_trace_opcodes = True
            calls[owner] += 1
        elif event == "opcode":
            ops[owner] += 1
            if owner == "dlscope":
                ops[f"{Path(code.co_filename).name}:{code.co_name}"] += 1
        return tracer

    def per_step() -> tuple[dict, dict]:
        ops.clear()
        calls.clear()
        sys.settrace(tracer)
        for _ in range(steps):
            step()
        sys.settrace(None)
        return {k: v / steps for k, v in ops.items()}, {k: v / steps for k, v in calls.items()}

    with tempfile.TemporaryDirectory() as scratch:
        hooks = TorchHooks(RecordFile(scratch), (1, 0, 0, 0))
        hooks.torch, hooks.is_compiling = torch, torch.compiler.is_compiling
        hooks.machine.on_step = LiveStatus(scratch, None).step_ended
        hooks.machine.memory = None  # sampled every 100 ms: tracing slows the steps past that
        step()
        bare_ops, bare_calls = per_step()
        hooks.step_hooks(torch)
        hooks.time_optimizer(type(optimizer))  # as the optimizer's creation does in a job
        step()
        hooked_ops, hooked_calls = per_step()
    owner = "torch and the loop"
    print(
        f"per tiny step, bare: {bare_ops[owner]:.0f} bytecodes, {bare_calls[owner]:.0f} Python calls; hooked: "
        f"torch and the loop {hooked_ops[owner]:.0f} bytecodes ({hooked_ops[owner] - bare_ops[owner]:+.0f}), "
        f"{hooked_calls[owner]:.0f} calls ({hooked_calls[owner] - bare_calls[owner]:+.0f}); "
        f"dlscope {hooked_ops['dlscope']:.0f} bytecodes, {hooked_calls['dlscope']:.0f} calls"
    )
    functions = sorted((k for k in hooked_ops if ":" in k), key=lambda k: -hooked_ops[k])
    print("  " + ", ".join(f"{k} {hooked_ops[k]:.0f}" for k in functions))


# a tiny step run under callgrind, counted only over the timed steps (callgrind_control toggles the
# counting on and off from outside the loop): bare, through a scratch observer as `--ops` drives it,
# (with DLSCOPE_FASTPATH=0 in its environment: every event through the Python step machine)
COUNTED_STEPS = (
    """
import os, subprocess, sys, tempfile
LOOP = sys.argv[3]
"""
    + TINY_STEP
    + """
if sys.argv[1] == "hooked":
    from dlscope.contract.live import LiveStatus
    from dlscope.injob.hooks import TorchHooks
    from dlscope.injob.recorder import RecordFile
    scratch = tempfile.mkdtemp()
    hooks = TorchHooks(RecordFile(scratch), (1, 0, 0, 0))
    hooks.torch, hooks.is_compiling = torch, torch.compiler.is_compiling
    hooks.machine.on_step = LiveStatus(scratch, None).step_ended
    hooks.machine.memory = None  # read every 100 ms: under valgrind that is every few steps
    hooks.step_hooks(torch)
    if LOOP != "optimizer":  # no torch optimizer: no_grad and .data watched, as attaching does in a job
        if hasattr(hooks, "updates"):  # (a baseline from before: steps end at backward())
            hooks.updates.attach(torch)
    elif hasattr(hooks, "time_optimizer"):  # as the optimizer's creation does in a job
        hooks.time_optimizer(type(optimizer))
    elif hasattr(hooks, "time_step_calls"):  # a baseline from before: global hooks and this wrapper
        hooks.time_step_calls(type(optimizer))
for _ in range(20):
    step()
subprocess.run(["callgrind_control", "-i", "on", str(os.getpid())], capture_output=True)
for _ in range(int(sys.argv[2])):
    step()
subprocess.run(["callgrind_control", "-i", "off", str(os.getpid())], capture_output=True)
"""
)


def count_instructions(steps: int, baseline: Path | None, loop: str = "optimizer") -> None:
    """Machine instructions per tiny step (valgrind's callgrind): bare, through this checkout's
    hooks and, with `baseline`, through that checkout's. Counts, the same at any load; the hooks'
    Python runs at fewer instructions a nanosecond than torch's kernels, so read ratios, not µs.
    The "Python machine" arm is this checkout with its C fast path off (DLSCOPE_FASTPATH=0): the
    common step's events, its row and its live-file count through stepmachine.py."""
    import re
    import shutil

    if shutil.which("valgrind") is None:
        raise SystemExit("--instructions needs valgrind (apt-get install valgrind)")
    src = Path(__file__).resolve().parent.parent / "src"
    arms = {"bare": ("bare", None), "dlscope run": ("hooked", src), "Python machine": ("python", src)}
    if baseline is not None:
        arms["baseline run"] = ("hooked", baseline / "src")
    per_step = {}
    with tempfile.TemporaryDirectory() as tmp:
        for arm, (mode, src) in arms.items():
            env = dict(os.environ)
            if src is not None:
                env["PYTHONPATH"] = os.pathsep.join([str(src), os.environ.get("PYTHONPATH", "")])
            if mode == "python":
                env["DLSCOPE_FASTPATH"] = "0"
            out = Path(tmp) / f"callgrind-{len(per_step)}"
            argv = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}"]
            script = [sys.executable, "-c", COUNTED_STEPS, "bare" if mode == "bare" else "hooked", str(steps), loop]
            done = subprocess.run([*argv, *script], capture_output=True, text=True, env=env)
            collected = re.search(r"Collected : (\d+)", done.stderr)
            if collected is None:
                raise SystemExit(f"callgrind counted nothing for {arm}: {done.stderr[-500:]}")
            per_step[arm] = int(collected.group(1)) / steps
    bare = per_step["bare"]
    print(
        f"instructions per tiny step ({loop}; {steps} steps counted): "
        + ", ".join(
            f"{arm} {n:,.0f}" + (f" ({n - bare:+,.0f})" if arm != "bare" else "") for arm, n in per_step.items()
        )
    )


def long_run(steps: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        out, ended = Path(tmp) / "long", Path(tmp) / "ended"
        command = [sys.executable, "-c", LONG_LOOP, str(steps), str(ended)]
        argv = ["run", "--out", str(out), "--profile-steps", "0", "--", *command]
        started = time.perf_counter()
        done = subprocess.run([sys.executable, "-c", IN_PROCESS, *argv], check=True, capture_output=True, text=True)
        wall = time.perf_counter() - started
        peak, finished, _ = done.stdout.strip().splitlines()[-1].split()
        size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
        results = (out / "results.json").stat().st_size
        count = json.loads((out / "results.json").read_text())["sections"]["steps"]["count"]
        after = float(finished) - float(ended.read_text())
    print(
        f"{count} steps in {wall:.0f} s: run directory {size / 1e6:.1f} MB, results.json {results / 1e6:.3f} MB, "
        f"dlscope peak RSS {int(peak) / 2**20:.0f} MiB, report done {after:.1f} s after the job's last step"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--train", type=int, default=1920, help="training images (default 1920: 30 steps of 64)")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--step-rounds", type=int, default=3, help="rounds of the 50-step in-process timing")
    parser.add_argument("--skip-script", action="store_true", help="only the hooks' cost per step")
    parser.add_argument("--tiny-steps", type=int, default=0, help="tiny steps per run of the interleaved pairs")
    parser.add_argument("--pairs", type=int, default=3, help="interleaved rounds of --tiny-steps runs")
    parser.add_argument("--hook-pairs", type=int, default=0, help="in-process pairs of bursts, hooks off and on")
    parser.add_argument("--baseline", type=Path, help="another checkout: its `dlscope run` in each round too")
    parser.add_argument("--ops", action="store_true", help="bytecodes and calls per tiny step (counts, not times)")
    parser.add_argument(
        "--instructions", type=int, default=0, help="tiny steps counted in instructions under valgrind (300 will do)"
    )
    parser.add_argument("--long-steps", type=int, default=0, help="steps of the long run (size, RSS, report time)")
    parser.add_argument(
        "--loop",
        choices=("optimizer", "update", "bare"),
        default="optimizer",
        help="the tiny step of --tiny-steps and --instructions: a torch optimizer's, or a hand-written update",
    )
    args = parser.parse_args()
    if args.ops and args.hook_pairs:  # both time the same classes in this process: one or the other
        parser.error("--hook-pairs runs without --ops")
    if args.ops:
        count_ops()
    if args.hook_pairs:
        hook_pairs(args.hook_pairs)
    if args.instructions:
        count_instructions(args.instructions, args.baseline, args.loop)
    if args.tiny_steps:
        tiny_steps(args.tiny_steps, args.pairs, args.baseline, args.loop)
    if args.long_steps:
        long_run(args.long_steps)
    if args.rounds:
        hook_cost(args.rounds, args.step_rounds)
    if args.skip_script:
        return
    script = [sys.executable, str(SCRIPT), "--train", str(args.train), "--test", "500", "--epochs", str(args.epochs)]
    bare, command, whole, steps = [], [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.rounds):
            bare.append(timed(script))
            out = Path(tmp) / f"run-{i}"
            whole.append(timed([sys.executable, "-m", "dlscope.cli", "run", "--out", str(out), "--", *script]))
            results = json.loads((out / "results.json").read_text())
            command.append(results["sections"]["run"]["wall_seconds"])
            steps.append(results["sections"]["steps"]["count"])
            cost = results["sections"]["top10"]["profiled_cost"]
            print(
                f"round {i + 1}: bare {bare[-1]:.2f} s, command {command[-1]:.2f} s, whole {whole[-1]:.2f} s; "
                f"{steps[-1]} steps, profiled step {cost.get('ratio')}× an unprofiled one"
            )
    median = statistics.median
    print(f"bare median {median(bare):.2f} s over {args.rounds} rounds ({steps[0]} steps)")
    print(f"command under dlscope run: {median(command):.2f} s = {median(command) / median(bare):.3f}× bare")
    print(f"whole dlscope run process: {median(whole):.2f} s = {median(whole) / median(bare):.3f}× bare")


if __name__ == "__main__":
    main()
