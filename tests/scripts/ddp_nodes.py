"""A small DDP job for `dlscope run -- torchrun --nnodes 2 ...` on one machine (two launchers, a c10d
rendezvous on 127.0.0.1): a tiny model on gloo, so that a step is mostly what the test plants. Each
launcher passes its own arguments to its ranks, so one launcher can slow or stop one of its own:
`--slow-local-rank L --slow-ms MS`: its local rank L sleeps MS before each backward, reaching every
all-reduce that late (a straggler); `--hang-local-rank L --hang-step S`: its local rank L stops in
its own code at step S and never returns (the others wait in the all-reduce)."""

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset


def stop_here_forever():
    while True:
        time.sleep(1)  # the line a hang's verdict names


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--slow-local-rank", type=int, default=-1)
    parser.add_argument("--slow-ms", type=float, default=0.0)
    parser.add_argument("--hang-local-rank", type=int, default=-1)
    parser.add_argument("--hang-step", type=int, default=-1)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    local = int(os.environ["LOCAL_RANK"])
    torch.manual_seed(dist.get_rank())
    data = TensorDataset(torch.randn(16 * args.steps, 32), torch.randn(16 * args.steps, 1))
    loader = DataLoader(data, batch_size=16)
    model = DDP(nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step, (x, y) in enumerate(loader):
        if local == args.hang_local_rank and step == args.hang_step:
            stop_here_forever()
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        if local == args.slow_local_rank:
            time.sleep(args.slow_ms / 1000)
        loss.backward()
        optimizer.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
