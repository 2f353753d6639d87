"""A loop whose steps change for good at a known step (prints the truth it knows):
subnormal  from then on, its inputs are scaled by 1e-39: subnormal floats, which many CPUs compute
           in microcode (the matmul of each forward and backward slows many times) and others at
           full speed (an AMD EPYC: a 512×512 matmul with a subnormal input took 3.6 ms against
           3.9 ms): `penalty` says which this CPU is
flush      the same, with torch.set_flush_denormal(True) first: the scaled inputs are zeros
busy       from then on, each step also busy-waits for 10× a step's CPU time (25 ms at least):
           many times the CPU, no subnormal
sleep      from then on, each step also sleeps for 10× a step's time (25 ms at least): slower, no
           more CPU (a busier machine)

The change comes at step --at, or later, once --before-s seconds of steps have passed: the watch
needs ~0.5 s of steps to know what a step costs, however fast this CPU runs them. It lasts --after
steps and --after-s seconds at least (several of the watch's 0.1 s intervals). `penalty` is the
median CPU time of this thread a step after the change over the median before it."""

import argparse
import statistics
import time

import torch
from torch import nn


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=("subnormal", "flush", "busy", "sleep"))
    parser.add_argument("--at", type=int, default=600)
    parser.add_argument("--before-s", type=float, default=1.0)
    parser.add_argument("--after", type=int, default=20)
    parser.add_argument("--after-s", type=float, default=1.0)
    args = parser.parse_args()
    torch.set_num_threads(1)  # steady on a loaded machine: no intra-op threads to wait for
    if args.mode == "flush":
        torch.set_flush_denormal(True)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 256), nn.Linear(256, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)  # lr 0: the weights stay as they are
    x, y = torch.randn(256, 256), torch.randint(0, 10, (256,))
    step_ms: list[float] = []
    cpu_ms: list[float] = []
    first = time.perf_counter()
    at, changed, extra_s = 0, 0.0, 0.0  # the step the change came at (0: not yet), when, its added wait
    while not at or len(step_ms) < at + args.after or time.perf_counter() < changed + args.after_s:
        start, start_cpu = time.perf_counter(), time.thread_time()
        if not at and len(step_ms) >= args.at and start >= first + args.before_s:
            at, changed = len(step_ms), start
            extra_s = max(0.025, 10 * statistics.median(cpu_ms[5:] if args.mode == "busy" else step_ms[5:]) / 1e3)
        inputs = x * 1e-39 if at and args.mode in ("subnormal", "flush") else x
        loss = nn.functional.cross_entropy(model(inputs), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if at and args.mode == "sleep":
            time.sleep(extra_s)
        elif at and args.mode == "busy":
            end = time.thread_time() + extra_s  # CPU time: a busier machine stretches the wait, never shortens it
            while time.thread_time() < end:
                pass
        step_ms.append(1e3 * (time.perf_counter() - start))
        cpu_ms.append(1e3 * (time.thread_time() - start_cpu))
    before, after = statistics.median(step_ms[5:at]), statistics.median(step_ms[at + 5 :])
    before_cpu, after_cpu = statistics.median(cpu_ms[5:at]), statistics.median(cpu_ms[at + 5 :])
    print(
        f"TRUTH steps={len(step_ms)} at={at} before_ms={before:.3f} after_ms={after:.3f} "
        f"before_cpu_ms={before_cpu:.3f} after_cpu_ms={after_cpu:.3f} penalty={after_cpu / before_cpu:.3f}"
    )


if __name__ == "__main__":
    main()
