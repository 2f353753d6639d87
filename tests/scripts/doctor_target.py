"""A small training loop for `dlscope doctor`'s known-truth tests: busy-wait "decoding" in each
sample (--decode-ms), a forward of known cost (--forward-ms of busy-wait around a linear layer),
a DataLoader with --workers, and a log it writes relative to its working directory (--log), or at
an absolute path (an absolute --log): what a trial must not clobber. With --like-nanogpt, files
named in the code, relative to the working directory, as nanoGPT's train.py has them: it reads
settings.txt first (its configurator.py), then saves out/ckpt.pt and appends to out/history.log
at every step.

    doctor_target.py --decode-ms 2 --decode busy --workers 0 --log train.log
"""

import argparse
import os
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


def busy(ms: float) -> None:
    end = time.perf_counter() + ms / 1e3
    while time.perf_counter() < end:
        pass


def decode(ms: float) -> None:
    """--decode busy: CPU work (a decoder); sleep: a wait (a read from a slow disk or the network)."""
    (busy if args.decode == "busy" else lambda ms: time.sleep(ms / 1e3))(ms)


class Decoded(Dataset):
    def __init__(self, n: int, ms: float) -> None:
        self.n, self.ms = n, ms

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        decode(self.ms)
        return torch.full((16,), float(i % 7)), torch.tensor(float(i % 3))


class Model(nn.Module):
    def __init__(self, forward_ms: float) -> None:
        super().__init__()
        self.layer = nn.Linear(16, 1)
        self.forward_ms = forward_ms

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        busy(self.forward_ms)
        return self.layer(x).squeeze(1)


parser = argparse.ArgumentParser()
parser.add_argument("--decode-ms", type=float, default=2.0)
parser.add_argument("--decode", choices=["busy", "sleep"], default="busy")
parser.add_argument("--forward-ms", type=float, default=2.0)
parser.add_argument("--workers", type=int, default=0)
parser.add_argument("--batch-size", type=int, default=4)
parser.add_argument("--steps", type=int, default=200)
parser.add_argument("--log", default="train.log")
parser.add_argument("--like-nanogpt", action="store_true")
parser.add_argument("--makedirs", action="append", default=[])  # as a library makes its config directory
args = parser.parse_args()
for directory in args.makedirs:
    os.makedirs(directory, exist_ok=True)
if args.like_nanogpt:
    with open("settings.txt") as f:
        args.forward_ms = float(f.read())

torch.manual_seed(0)
model = Model(args.forward_ms)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
dataset = Decoded(args.steps * args.batch_size, args.decode_ms)
loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=True, num_workers=args.workers)
with open(args.log, "w") as log:
    for step, (x, y) in enumerate(loader):
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        log.write(f"{step} {loss.item():.6f}\n")
        if args.like_nanogpt:
            torch.save(model.state_dict(), "out/ckpt.pt")
            with open("out/history.log", "a") as history:
                history.write(f"{step}\n")
