"""An image classifier's loop as trainers write it: each epoch trains, validates (`model.eval()`,
`torch.no_grad()`) and saves a checkpoint (`torch.save`). Only the validation runs `torch.cdist`
and `torch.topk` (a nearest-neighbour accuracy against a bank of embeddings), heavier than the
training steps' matmuls: operators training never runs. Writes its truth (JSON) to argv[1]: each
training step's, validation's and save's (start, end) on time.time().

    epoch_eval_save.py TRUTH.json --epochs 3 --steps 4
    --step-sleep S   each step's forward also sleeps S seconds (dlscope's 5 s recording cap)
"""

import argparse
import json
import os
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Slow(nn.Module):
    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))
        self.seconds = seconds

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.seconds and self.training:
            time.sleep(self.seconds)
        return self.body(x)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("truth")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=4, help="training steps per epoch")
    parser.add_argument("--step-sleep", type=float, default=0.0)
    args = parser.parse_args()
    torch.manual_seed(0)
    n = args.steps * 32
    train = DataLoader(TensorDataset(torch.randn(n, 64), torch.randint(0, 10, (n,))), batch_size=32)
    val = DataLoader(TensorDataset(torch.randn(192, 64), torch.randint(0, 10, (192,))), batch_size=64)
    bank = torch.randn(8000, 64)
    model = Slow(args.step_sleep)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = nn.CrossEntropyLoss()
    checkpoint = os.path.join(os.path.dirname(os.path.abspath(args.truth)), "last.pt")
    truth: dict[str, list] = {"steps": [], "evals": [], "saves": []}
    for _ in range(args.epochs):
        model.train()
        start = time.time()
        for x, y in train:
            loss = loss_fn(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            truth["steps"].append([start, time.time()])
            start = time.time()
        start = time.time()
        model.eval()
        with torch.no_grad():
            for x, _ in val:
                model(x)
                torch.topk(torch.cdist(x, bank), 50, dim=1, largest=False)
        model.train()
        truth["evals"].append([start, time.time()])
        start = time.time()
        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, checkpoint)
        truth["saves"].append([start, time.time()])
    with open(args.truth, "w") as f:
        json.dump(truth, f)


if __name__ == "__main__":
    main()
