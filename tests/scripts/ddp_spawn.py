"""DDP as PyTorch's tutorial starts it: `torch.multiprocessing.spawn`, the rank passed to
`init_process_group` (no torchrun, no RANK in the environment), gloo on the CPU."""

import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP


def train(rank: int, world_size: int, port: int, steps: int) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    torch.manual_seed(rank)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(10, 10), torch.nn.ReLU(), torch.nn.Linear(10, 5)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.001)
    for _ in range(steps):
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(torch.randn(20, 10)), torch.randn(20, 5)).backward()
        optimizer.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(train, args=(2, port, int(sys.argv[1])), nprocs=2, join=True)
