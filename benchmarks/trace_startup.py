"""The fixed cost of `dlscope run` and `dlscope run --trace-io` on a short job, and the exit after
Ctrl-C: start-up, attach, detach, analysis, report, all of it (issue 44's lines: start-up ≤ bare
+ 2 s, with --trace-io ≤ bare + 4 s, exit after Ctrl-C ≤ bare + 2 s).

Each measurement interleaved round by round, so machine noise hits all variants alike:

1. bpftrace alone on the program dlscope generates for this kernel: seconds until it prints
   "ready" (every probe attached) and seconds from SIGINT until it has exited (probes detached).
2. A 100-step script (a small Linear model, SGD) run bare, under `dlscope run`, and under
   `dlscope run --trace-io --trace-backend B` for every available backend: the whole process's
   wall time and the CPU time of the whole tree (dlscope, tracer, job), medians, and each
   variant minus bare (the fixed cost a user waits for). On a shared machine the wall time holds
   the waits for a core too; the CPU time does not.
3. With --ctrl-c: a job that trains until interrupted (2 DataLoader workers) started bare and
   under `dlscope run`, sent SIGINT once it trains, as a terminal sends it (to the foreground
   process group: bare, the job and its workers; under dlscope, dlscope, which hands it to the
   job's group): seconds from SIGINT to the exit of the command typed.

--baseline CHECKOUT adds the same `dlscope run` variants from another checkout's src to each
round (a before/after side by side).

    .venv/bin/python benchmarks/trace_startup.py [--rounds 5] [--steps 100] [--ctrl-c] [--baseline B]
"""

from __future__ import annotations

import argparse
import os
import resource
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
    output = work / "bpftrace.lines"
    output.write_bytes(b"")
    start = time.perf_counter()
    tracer = subprocess.Popen(
        ebpf.command(script, 2**22 + 1, output, os.getpid()),  # a pid no process has: nothing is traced
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=ebpf.environment(),
    )
    counters = ebpf.Counters()
    pending = ""
    with open(output, encoding="utf-8", errors="replace") as f:  # followed as dlscope's reader does
        while not counters.ready and tracer.poll() is None:
            pending += f.read()
            *lines, pending = pending.split("\n")
            for line in lines:
                ebpf.parse_line(line, counters, plan.names)
            time.sleep(0.005)
    ready = time.perf_counter()
    # bpftrace 0.17 can miss a SIGINT sent the instant it prints "ready" (seen once in three runs:
    # it then waits for an event that never comes); dlscope's own SIGINT comes after the command
    time.sleep(0.5)
    stopping = time.perf_counter()
    tracer.send_signal(signal.SIGINT)
    tracer.wait()
    return ready - start, time.perf_counter() - stopping, counters.attached_probes


# trains until interrupted, on a DataLoader with 2 workers (an image classifier's shape); says
# when it trains (its first line) and when its KeyboardInterrupt came
ENDLESS = """
import sys, time
import torch
from torch.utils.data import DataLoader, TensorDataset
def main():
    loader = DataLoader(TensorDataset(torch.randn(4096, 20), torch.randn(4096, 2)), batch_size=32, num_workers=2)
    model = torch.nn.Linear(20, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    print("training", flush=True)
    try:
        while True:
            for x, y in loader:
                opt.zero_grad()
                (model(x) - y).pow(2).mean().backward()
                opt.step()
    except KeyboardInterrupt:
        print(f"interrupted {time.time()}", file=sys.stderr, flush=True)
        raise
if __name__ == "__main__":
    main()
"""
TRAINING_S = 3.0  # how long the endless job trains before the SIGINT
# a Ctrl-C that lands while the job runs a __del__ (DataLoader's worker shutdown) is swallowed: the job
# trains on, bare or not (docs/commands/run.md); after this long, a second one, as a user would press it
SECOND_CTRL_C_S = 20.0


def command(variant: str, job: list[str], out: Path, src: Path | None) -> tuple[list[str], dict[str, str] | None]:
    """The argv and environment of `variant`: "bare", "run", "run --trace-io B", with " (baseline)"
    for the same from the baseline checkout's src."""
    if variant == "bare":
        return job, None
    cli = [sys.executable, "-m", "dlscope.cli", "run", "--out", str(out)]
    backend = variant.removesuffix(" (baseline)").removeprefix("run").removeprefix(" --trace-io ")
    if backend:
        cli += ["--trace-io", "--trace-backend", backend]
    env = None
    if src is not None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), os.environ.get("PYTHONPATH", "")])}
    return [*cli, "--", *job], env


def whole_process(argv: list[str], env: dict[str, str] | None) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the whole tree) of one run."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime


def _default_sigint() -> None:
    """The command starts with Ctrl-C's default action, as one typed at a terminal does (this
    benchmark may run where SIGINT is ignored: a shell's background job)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def interrupted(argv: list[str], env: dict[str, str] | None) -> float | None:
    """Seconds from SIGINT to the exit of `argv`, SIGINT sent to its process group once it trains;
    None where the job swallowed it (then ended by a second one)."""
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
        process_group=0,
        preexec_fn=_default_sigint,
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("training"):
            break
    time.sleep(TRAINING_S)
    sent = time.perf_counter()
    os.killpg(proc.pid, signal.SIGINT)  # the foreground group, as a terminal's Ctrl-C
    try:
        proc.communicate(timeout=SECOND_CTRL_C_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGINT)
        proc.communicate()
        return None
    return time.perf_counter() - sent


def table(title: str, seconds: dict[str, list[float]], unit: str = "s") -> None:
    base = statistics.median(seconds["bare"])
    print(f"\n{title}:\n| variant | runs ({unit}) | median ({unit}) | − bare ({unit}) |\n|---|---|---:|---:|")
    for variant, runs in seconds.items():
        median = statistics.median(runs)
        print(f"| {variant} | {', '.join(f'{t:.2f}' for t in runs)} | {median:.2f} | {median - base:+.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--ctrl-c", action="store_true", help="also the exit after Ctrl-C of an endless job")
    parser.add_argument("--backends", default=",".join(TRACE_BACKENDS), help="the --trace-io backends to run")
    parser.add_argument("--baseline", type=Path, help="another checkout: its `dlscope run` variants too")
    parser.add_argument("--no-bpftrace", action="store_true", help="skip bpftrace's own attach and detach")
    args = parser.parse_args()
    usable = [b for b, why in availability().items() if why is None and b in args.backends.split(",")]
    for backend in TRACE_BACKENDS:
        if backend not in usable:
            print(f"{backend}: skipped ({availability()[backend] or 'not asked'})")
    print(f"load: {os.getloadavg()[0]:.2f} (1-min average)")
    dlscope_variants = ["run", *(f"run --trace-io {b}" for b in usable)]
    variants = ["bare", *dlscope_variants]
    if args.baseline is not None:
        variants += [f"{v} (baseline)" for v in dlscope_variants]
    walls: dict[str, list[float]] = {v: [] for v in variants}
    cpus: dict[str, list[float]] = {v: [] for v in variants}
    exits: dict[str, list[float]] = {v: [] for v in ("bare", "run", "run (baseline)") if v in variants}
    swallowed = dict.fromkeys(exits, 0)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        if "ebpf" in usable and not args.no_bpftrace:
            runs = [bpftrace_attach_detach(work) for _ in range(args.rounds)]
            print(f"\nbpftrace on dlscope's program ({runs[0][2]} probes), {args.rounds} runs:")
            print("| phase | runs (s) | median (s) |\n|---|---|---:|")
            for name, i in (("start → ready", 0), ("SIGINT → exited", 1)):
                cells = ", ".join(f"{r[i]:.2f}" for r in runs)
                print(f"| {name} | {cells} | {statistics.median(r[i] for r in runs):.2f} |")
        script, endless = work / "steps.py", work / "endless.py"
        script.write_text(SCRIPT)
        endless.write_text(ENDLESS)
        for round_ in range(args.rounds):
            for variant in variants:
                out = work / f"run-{round_}-{len(walls[variant])}-{variant.replace(' ', '_')}"
                src = args.baseline / "src" if variant.endswith("(baseline)") else None
                argv, env = command(variant, [sys.executable, str(script), str(args.steps)], out, src)
                wall, cpu = whole_process(argv, env)
                walls[variant].append(wall)
                cpus[variant].append(cpu)
                print(f"round {round_ + 1}: {variant:34} {wall:6.2f} s, CPU {cpu:6.2f} s", file=sys.stderr, flush=True)
            if not args.ctrl_c:
                continue
            for variant in exits:
                out = work / f"endless-{round_}-{variant.replace(' ', '_')}"
                src = args.baseline / "src" if variant.endswith("(baseline)") else None
                argv, env = command(variant, [sys.executable, str(endless)], out, src)
                seconds = interrupted(argv, env)
                if seconds is None:
                    swallowed[variant] += 1
                else:
                    exits[variant].append(seconds)
                said = "swallowed: a second Ctrl-C" if seconds is None else f"{seconds:6.2f} s"
                print(f"round {round_ + 1}: Ctrl-C, {variant:24} {said}", file=sys.stderr, flush=True)
    print(f"\n{args.steps}-step script, {args.rounds} interleaved rounds")
    table("whole process, wall", walls)
    table("whole tree, CPU (user + system)", cpus)
    if args.ctrl_c:
        table(f"SIGINT {TRAINING_S:.0f} s into an endless job (2 DataLoader workers) → exit, wall", exits)
        print("swallowed (the job trained on; left out above): " + ", ".join(f"{v} {n}" for v, n in swallowed.items()))
    print(f"load: {os.getloadavg()[0]:.2f} (1-min average)")


if __name__ == "__main__":
    main()
