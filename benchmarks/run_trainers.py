"""`dlscope run` on the ecosystem's scripts (tests/scripts/: LBFGS closures, optimizer.step(closure),
Lightning, the HF Trainer): wall time and peak RSS bare vs observed, interleaved script by script,
against issue 22's bounds (peak RSS ≤ 2× bare + 512 MB, wall ≤ 2× bare + 20 s). Then the always-on
hooks' own cost per step on a tiny loop (Linear 16→4, batch 32, SGD, 1 thread; CPU time): bare, hooked with
the step records written as today, and hooked with the record writer stubbed out (the step machine
and the torch layer alone: what the binary step store will add to is the sink's cost).

    .venv/bin/python benchmarks/run_trainers.py [--rounds 1] [--skip-scripts] [--steps 20000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "tests" / "scripts"
TINY_LOOP = """
import os, statistics, sys, tempfile, time
import torch
torch.set_num_threads(1)
mode = sys.argv[1]
if mode != "bare":
    from dlscope.injob import hooks
    from dlscope.injob import recorder
    store = recorder.RecordFile(tempfile.mkdtemp())
    if mode == "hooked-no-sink":
        store.write_step = lambda *values: None  # the machine passes STEP_ARGS positionally
    hooked = hooks.TorchHooks(store, (1, 0, 0, 0))  # profiler off, as `--profile-steps 0`
    hooked.begin_process(forked=False)
    hooked.attach_torch(torch)
model = torch.nn.Linear(16, 4)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(32, 16), torch.randn(32, 4)
bursts = []
for _ in range(int(sys.argv[2]) // 1000):
    start = time.thread_time_ns()  # CPU time: on a loaded machine wall time is mostly waiting
    for _ in range(1000):
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
    bursts.append((time.thread_time_ns() - start) / 1000)
print(statistics.median(bursts) / 1000)
"""


def measured(argv: list[str]) -> tuple[float, float]:
    """Wall seconds and the peak RSS (MB) of the process tree's largest process."""
    start = time.perf_counter()
    child = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tempfile.mkdtemp())
    _, status, usage = os.wait4(child.pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, argv
    return time.perf_counter() - start, usage.ru_maxrss / 1024


def scripts(rounds: int) -> None:
    cases = {
        "lbfgs_closure": ["lbfgs_closure.py"],
        "closure_step": ["closure_step.py", "{tmp}"],
        "lightning_fit": ["lightning_fit.py", "{tmp}"],
        "hf_trainer": ["hf_trainer.py", "{tmp}"],
    }
    print("| script | bare s | run s | wall bound s | bare MB | run MB | RSS bound MB | within |")
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    for name, args in cases.items():
        bare, observed = [], []
        for _ in range(rounds):
            for sink in (bare, observed):
                argv = [sys.executable, str(SCRIPTS / args[0]), *(a.format(tmp=tempfile.mkdtemp()) for a in args[1:])]
                if sink is observed:
                    out = tempfile.mkdtemp()
                    argv = [str(Path(sys.executable).parent / "dlscope"), "run", "--out", f"{out}/run", "--", *argv]
                sink.append(measured(argv))
        wall_b, wall_r = statistics.median(w for w, _ in bare), statistics.median(w for w, _ in observed)
        rss_b, rss_r = statistics.median(m for _, m in bare), statistics.median(m for _, m in observed)
        ok = wall_r <= 2 * wall_b + 20 and rss_r <= 2 * rss_b + 512
        print(
            f"| {name} | {wall_b:.1f} | {wall_r:.1f} | {2 * wall_b + 20:.1f} | {rss_b:.0f} | {rss_r:.0f} "
            f"| {2 * rss_b + 512:.0f} | {'yes' if ok else 'NO'} |"
        )


def tiny_loop(steps: int, rounds: int) -> None:
    modes = ("bare", "hooked", "hooked-no-sink")
    results: dict[str, list[float]] = {m: [] for m in modes}
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    for _ in range(rounds):
        for mode in modes:
            out = subprocess.run(
                [sys.executable, "-c", TINY_LOOP, mode, str(steps)], capture_output=True, text=True, env=env
            )
            results[mode].append(float(out.stdout.strip()))
    bare = statistics.median(results["bare"])
    print(f"\ntiny loop, {steps} steps, CPU time, median of 1,000-step bursts, {rounds} interleaved rounds")
    print("| mode | µs/step | cost µs/step |")
    print("|---|---:|---:|")
    for mode in modes:
        value = statistics.median(results[mode])
        print(f"| {mode} | {value:.1f} | {value - bare:+.1f} |")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--steps", type=int, default=20000)
    parser.add_argument("--skip-scripts", action="store_true")
    args = parser.parse_args()
    print(f"load: {os.getloadavg()[0]:.1f}")
    tiny_loop(args.steps, max(args.rounds, 3))
    if not args.skip_scripts:
        scripts(args.rounds)
    print(f"load: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
