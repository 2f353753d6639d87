"""A loop whose steps slow down for good at a known step (prints the truth it knows):
subnormal  from step --at on, its inputs are scaled by 1e-39: subnormal floats, which the CPU
           multiplies in microcode (the matmul of each forward and backward slows many times)
flush      the same, with torch.set_flush_denormal(True) first: the scaled inputs are zeros
busy       from step --at on, each step also busy-waits 25 ms: many times the CPU, no subnormal
sleep      from step --at on, each step also sleeps 25 ms: slower, no more CPU (a busier machine)"""

import argparse
import statistics
import time

import torch
from torch import nn


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=("subnormal", "flush", "busy", "sleep"))
    parser.add_argument("--steps", type=int, default=640)
    parser.add_argument("--at", type=int, default=600)
    args = parser.parse_args()
    torch.set_num_threads(1)  # steady on a loaded machine: no intra-op threads to wait for
    if args.mode == "flush":
        torch.set_flush_denormal(True)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 256), nn.Linear(256, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)  # lr 0: the weights stay as they are
    x, y = torch.randn(256, 256), torch.randint(0, 10, (256,))
    step_ms: list[float] = []
    for step in range(args.steps):
        start = time.perf_counter()
        slowed = step >= args.at
        inputs = x * 1e-39 if slowed and args.mode in ("subnormal", "flush") else x
        loss = nn.functional.cross_entropy(model(inputs), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if slowed and args.mode == "sleep":
            time.sleep(0.025)
        elif slowed and args.mode == "busy":
            end = time.perf_counter() + 0.025
            while time.perf_counter() < end:
                pass
        step_ms.append(1e3 * (time.perf_counter() - start))
    before, after = statistics.median(step_ms[5 : args.at]), statistics.median(step_ms[args.at + 5 :])
    print(f"TRUTH steps={args.steps} at={args.at} before_ms={before:.3f} after_ms={after:.3f}")


if __name__ == "__main__":
    main()
