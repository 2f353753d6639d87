"""A DDP training script written the usual way, for `dlscope run -- torchrun --nproc-per-node 2`:
init_process_group("gloo"), DistributedSampler over dlscope's embedded MNIST subset, DDP, rank 0
saves with torch.save. `--slow-rank R --slow-ms MS` (or DDP_SLOW_RANK / DDP_SLOW_MS) sleeps in
rank R's every step before backward, so that rank reaches each all-reduce late: a straggler.
`--fail-rank R` raises a ValueError in rank R at its fifth step (the others then fail in their
next all-reduce, torchrun after them)."""

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

import dlscope


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, 1)
        self.conv2 = nn.Conv2d(16, 32, 3, 1)
        self.fc1 = nn.Linear(4608, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = F.relu(self.fc1(torch.flatten(x, 1)))
        return F.log_softmax(self.fc2(x), dim=1)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--train", type=int, default=512, help="first N training images")
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--slow-rank", type=int, default=int(os.environ.get("DDP_SLOW_RANK", "-1")))
    parser.add_argument("--slow-ms", type=float, default=float(os.environ.get("DDP_SLOW_MS", "0")))
    parser.add_argument("--save", default="")
    parser.add_argument("--fail-rank", type=int, default=-1)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(1)
    mnist = dlscope.load_mnist()
    x = mnist.train_images[: args.train].unsqueeze(1).float().div(255).sub(0.1307).div(0.3081)
    data = TensorDataset(x, mnist.train_labels[: args.train])
    sampler = DistributedSampler(data, shuffle=True, seed=1)
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler)
    model = DDP(Net())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for batch_idx, (images, labels) in enumerate(loader):
            optimizer.zero_grad()
            loss = F.nll_loss(model(images), labels)
            if rank == args.slow_rank:
                time.sleep(args.slow_ms / 1000)
            loss.backward()
            optimizer.step()
            if rank == args.fail_rank and batch_idx == 4:
                raise ValueError(f"rank {rank} found a bad batch at step {batch_idx}")  # FAIL
            if rank == 0 and batch_idx % 4 == 0:
                print(f"epoch {epoch} batch {batch_idx} loss {loss.item():.4f}")
    if rank == 0 and args.save:
        torch.save(model.module.state_dict(), args.save)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
