"""A Dataset of images held in memory (as torchvision's CIFAR-10 holds them), each sample seeded
for a deterministic augmentation: `torch.manual_seed(i)` in `__getitem__`, then a random flip.
torch then formats the stack for its lazy CUDA, XPU and MTIA seeding — a stat() of every frame's
file (and a read, the first time), dlscope's wrappers of the fetch and the worker loop included.
Sample SLOW sleeps 0.2 s. No sample reads a file. Writes its truth (JSON) to argv[1].

    seeded_samples.py TRUTH.json --workers 2 --samples 96
"""

import argparse
import json
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

SLOW = 37


class Seeded(Dataset):
    def __init__(self, images: torch.Tensor) -> None:
        self.images = images

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        torch.manual_seed(1000 + i)  # the same flip for sample i at every epoch
        x = self.images[i]
        if torch.rand(()) < 0.5:
            x = x.flip(-1)
        if i == SLOW:
            time.sleep(0.2)
        return x.flatten(), i % 4


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("truth")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--samples", type=int, default=96)
    args = parser.parse_args()
    loader = DataLoader(Seeded(torch.randn(args.samples, 3, 8, 8)), batch_size=16, num_workers=args.workers)
    model = nn.Linear(192, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    steps = 0
    for x, y in loader:
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        steps += 1
    with open(args.truth, "w") as f:
        json.dump({"steps": steps, "slow_sample": SLOW}, f)


if __name__ == "__main__":
    main()
