"""What `--trace-io` costs a short job as a whole: start-up, attach, detach, all of it.

Two measurements, each interleaved round by round so machine noise hits all variants alike:

1. bpftrace alone on the program dlscope generates for this kernel: seconds until it prints
   "ready" (every probe attached) and seconds from SIGINT until it has exited (probes detached).
2. A 100-step script (a small Linear model, SGD) run bare, under `dlscope run`, and under
   `dlscope run --trace-io --trace-backend B` for every available backend: the whole process's
   wall time, medians, and each variant minus bare (the fixed cost a user waits for).

    .venv/bin/python benchmarks/trace_startup.py [--rounds 5] [--steps 100]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from dlscope.options import TRACE_BACKENDS
from dlscope.supervise.iotrace import ebpf
from dlscope.supervise.iotrace.tracer import availability

SCRIPT = """
import sys, torch
torch.set_num_threads(1)
model = torch.nn.Linear(64, 8)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(32, 64), torch.randn(32, 8)
for step in range(int(sys.argv[1])):
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()
"""


def bpftrace_attach_detach(work: Path) -> tuple[float, float, int]:
    """(seconds to "ready", seconds from SIGINT to exit, probes attached) for dlscope's program."""
    script = work / "trace.bt"
    plan, _ = ebpf.write_program(script)
    start = time.perf_counter()
    tracer = subprocess.Popen(
        ebpf.command(script, 2**22 + 1),  # a pid no process has: nothing is traced
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=ebpf.environment(),
    )
    assert tracer.stdout is not None
    counters = ebpf.Counters()
    for line in tracer.stdout:
        ebpf.parse_line(line, counters, plan.names)
        if counters.ready:
            break
    ready = time.perf_counter()
    # bpftrace 0.17 can miss a SIGINT sent the instant it prints "ready" (seen once in three runs:
    # it then waits for an event that never comes); dlscope's own SIGINT comes after the command
    time.sleep(0.5)
    stopping = time.perf_counter()
    tracer.send_signal(signal.SIGINT)
    tracer.stdout.read()
    tracer.wait()
    return ready - start, time.perf_counter() - stopping, counters.attached_probes


def whole_process(variant: str, script: Path, steps: int, out: Path) -> float:
    argv = [sys.executable, str(script), str(steps)]
    if variant != "bare":
        cli = [sys.executable, "-m", "dlscope.cli", "run", "--out", str(out)]
        if variant != "run":
            cli += ["--trace-io", "--trace-backend", variant.removeprefix("run --trace-io ")]
        argv = [*cli, "--", *argv]
    start = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=100)
    args = parser.parse_args()
    usable = [b for b, why in availability().items() if why is None]
    for backend in TRACE_BACKENDS:
        if backend not in usable:
            print(f"{backend}: skipped ({availability()[backend]})")
    print(f"load: {os.getloadavg()[0]:.2f} (1-min average)")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        if "ebpf" in usable:
            runs = [bpftrace_attach_detach(work) for _ in range(args.rounds)]
            print(f"\nbpftrace on dlscope's program ({runs[0][2]} probes), {args.rounds} runs:")
            print("| phase | runs (s) | median (s) |\n|---|---|---:|")
            for name, i in (("start → ready", 0), ("SIGINT → exited", 1)):
                cells = ", ".join(f"{r[i]:.2f}" for r in runs)
                print(f"| {name} | {cells} | {statistics.median(r[i] for r in runs):.2f} |")
        script = work / "steps.py"
        script.write_text(SCRIPT)
        variants = ["bare", "run", *(f"run --trace-io {b}" for b in usable)]
        times: dict[str, list[float]] = {v: [] for v in variants}
        for round_ in range(args.rounds):
            for variant in variants:
                out = work / f"run-{round_}-{variant.replace(' ', '_')}"
                times[variant].append(whole_process(variant, script, args.steps, out))
                print(f"round {round_ + 1}: {variant:22} {times[variant][-1]:6.2f} s", file=sys.stderr, flush=True)
    base = statistics.median(times["bare"])
    print(f"\n{args.steps}-step script, whole process, {args.rounds} interleaved rounds:")
    print("| variant | runs (s) | median (s) | − bare (s) |\n|---|---|---:|---:|")
    for variant, runs in times.items():
        median = statistics.median(runs)
        print(f"| {variant} | {', '.join(f'{t:.2f}' for t in runs)} | {median:.2f} | {median - base:+.2f} |")
    print(f"load: {os.getloadavg()[0]:.2f} (1-min average)")


if __name__ == "__main__":
    main()
