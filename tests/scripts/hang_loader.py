"""A training loop whose DataLoader worker (num_workers=1) reads its samples from a file; given a
FIFO that nobody writes, the worker blocks in read() and the main process waits for the batch.
`--slow-after K --slow-factor F`: every step after step K sleeps F times longer (a job that
slows down, not a hung one). `--long-step K --long-s S`: step K computes for S seconds."""

import argparse
import time

import torch
from torch.utils.data import DataLoader, Dataset


class FileSamples(Dataset):
    def __init__(self, path, stop_at):
        self.path, self.stop_at = path, stop_at

    def __len__(self):
        return 10_000

    def __getitem__(self, i):
        if self.path and i == self.stop_at:
            with open(self.path, "rb") as f:
                f.read(64)  # blocks: nobody writes the FIFO
        return torch.randn(8), torch.tensor(0.0)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--fifo", default="")
    parser.add_argument("--stop-at", type=int, default=64)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--step-ms", type=float, default=20)
    parser.add_argument("--slow-after", type=int, default=-1)
    parser.add_argument("--slow-factor", type=float, default=3)
    parser.add_argument("--long-step", type=int, default=-1)  # this step computes for --long-s seconds
    parser.add_argument("--long-s", type=float, default=0.0)
    args = parser.parse_args()
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(FileSamples(args.fifo, args.stop_at), batch_size=8, num_workers=1 if args.fifo else 0)
    for step, (x, y) in enumerate(loader):
        if step == args.steps:
            break
        slow = args.slow_factor if 0 <= args.slow_after < step else 1
        time.sleep(args.step_ms * slow / 1000)
        if step == args.long_step:  # on a core all along, as a step of many LBFGS closures is
            until = time.perf_counter() + args.long_s
            while time.perf_counter() < until:
                pass
        (model(x).squeeze(1) - y).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()


if __name__ == "__main__":
    main()
