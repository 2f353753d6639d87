"""A script launched by torchrun that never makes its ranks data-parallel: each trains a model of
its own. --join: it joins the process group (gloo) but never wraps the model in DDP nor
all-reduces. Each rank prints the truth it knows: its rank, whether a process group is initialised,
its steps."""

import argparse
import os

import torch
import torch.distributed as dist
from torch import nn


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--join", action="store_true")
    args = parser.parse_args()
    if args.join:
        dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(16, 32), torch.randint(0, 2, (16,))
    for _ in range(args.steps):
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
    joined = dist.is_initialized()
    print(f"TRUTH rank={os.environ.get('RANK', '0')} distributed={joined} steps={args.steps}", flush=True)
    if joined:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
