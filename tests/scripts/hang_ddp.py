"""A small DDP job on gloo for the watchdog's tests: a Linear model on random data, an explicit
all_reduce of the loss every step (the Python API) besides DDP's own gradient all-reduce (from
C++). `--stop-rank R --stop-step S`: rank R sleeps "forever" at step S, before its forward, so
the other ranks wait in a collective it never enters; `--exit-rank R`: rank R dies there instead
(`--wait-for FILE`: rank 0 then polls for a file rank R would have written, as a job waiting for
another rank's checkpoint shard does)."""

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--stop-rank", type=int, default=-1)
    parser.add_argument("--stop-step", type=int, default=5)
    parser.add_argument("--exit-rank", type=int, default=-1)
    parser.add_argument("--exit-code", type=int, default=3)
    parser.add_argument("--wait-for", default="", help="rank 0, at --stop-step: wait for this file (a shard)")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(rank)
    model = DDP(torch.nn.Linear(32, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(args.steps):
        if rank == args.stop_rank and step == args.stop_step:
            time.sleep(3600)  # the hang the watchdog must find
        if rank == args.exit_rank and step == args.stop_step:
            os._exit(args.exit_code)  # a rank that dies: no Python exit, no atexit
        if rank == 0 and args.wait_for and step == args.stop_step:
            while not os.path.exists(args.wait_for):  # the other rank's shard, which never comes
                time.sleep(0.05)
        loss = model(torch.randn(16, 32)).square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        dist.all_reduce(loss.detach())
        time.sleep(0.02)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
