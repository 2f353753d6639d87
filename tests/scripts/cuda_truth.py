"""A CUDA training loop that measures its own truth with CUDA events, by hand, at the points dlscope
hooks (the batch drawn, the model's forward, backward, the optimizer's step), and writes each part's
share of the GPU's step time (JSON) to the path in argv[1]. Needs a CUDA GPU.

    cuda_truth.py TRUTH.json --mode item      a loss.item() after every step (the host waits on the GPU)
    cuda_truth.py TRUTH.json --mode pageable  batches from a DataLoader over unpinned CPU tensors,
                                              copied to the GPU in the loop body (blocking copies)
    cuda_truth.py TRUTH.json --mode compute   a compute-bound MLP on batches resident on the GPU,
                                              no synchronisation inside the loop

The truth of a part is the GPU time between its two events, summed over the steps after the first
WARMUP; a step is the time between one step's first event and the next's.
"""

import argparse
import itertools
import json

import torch
from torch import nn
from torch.utils.data import BatchSampler, DataLoader, Dataset, RandomSampler

WARMUP = 10
PARTS = ("data", "before_forward", "forward", "backward", "optimizer")


class Rows(Dataset):
    """Whole batches from unpinned CPU tensors: one gather per batch, no per-sample collation."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, rows: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        index = torch.tensor(rows)
        return self.x[index], self.y[index]


def batches(mode: str, features: int, batch: int, steps: int, device: torch.device):
    if mode == "pageable":
        n = batch * 8
        data = Rows(torch.randn(n, features), torch.randint(0, 10, (n,)))
        sampler = BatchSampler(RandomSampler(data, replacement=True, num_samples=batch * steps), batch, False)
        return DataLoader(data, sampler=sampler, batch_size=None)
    resident = [(torch.randn(batch, features, device=device), torch.randint(0, 10, (batch,), device=device))] * 4
    return (resident[i % 4] for i in range(steps))


parser = argparse.ArgumentParser()
parser.add_argument("truth")
parser.add_argument("--mode", choices=["item", "pageable", "compute"], required=True)
parser.add_argument("--steps", type=int, default=80)
args = parser.parse_args()

device = torch.device("cuda")
torch.manual_seed(0)
features, hidden, batch = {"item": (1024, 1024, 512), "pageable": (2048, 1024, 4096), "compute": (4096, 8192, 4096)}[
    args.mode
]
layers = [nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 10)]
model = nn.Sequential(*layers).to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
marks: list[dict[str, torch.cuda.Event]] = []


def mark(step: dict[str, torch.cuda.Event], name: str) -> None:
    event = torch.cuda.Event(enable_timing=True)
    event.record()
    step[name] = event


losses = []
it = iter(batches(args.mode, features, batch, args.steps, device))
for _ in range(args.steps):
    step: dict[str, torch.cuda.Event] = {}
    mark(step, "data_begin")
    x, y = next(it)
    mark(step, "data_end")
    x, y = x.to(device), y.to(device)  # COPY: from unpinned memory, a blocking copy
    mark(step, "forward_begin")
    out = model(x)
    mark(step, "forward_end")
    loss = nn.functional.cross_entropy(out, y)
    mark(step, "backward_begin")
    loss.backward()
    mark(step, "backward_end")
    mark(step, "optimizer_begin")
    optimizer.step()
    mark(step, "optimizer_end")
    optimizer.zero_grad()
    if args.mode == "item":
        losses.append(loss.item())  # SYNC: the line that synchronises
    marks.append(step)
torch.cuda.synchronize()

measured = marks[WARMUP:]
ms = {p: 0.0 for p in PARTS}
total = 0.0
for step, following in itertools.pairwise(measured):
    total += step["data_begin"].elapsed_time(following["data_begin"])
    ms["data"] += step["data_begin"].elapsed_time(step["data_end"])
    ms["before_forward"] += step["data_end"].elapsed_time(step["forward_begin"])
    ms["forward"] += step["forward_begin"].elapsed_time(step["forward_end"])
    ms["backward"] += step["backward_begin"].elapsed_time(step["backward_end"])
    ms["optimizer"] += step["optimizer_begin"].elapsed_time(step["optimizer_end"])
truth = {
    "mode": args.mode,
    "steps": args.steps,
    "step_ms": total / (len(measured) - 1),
    "percent": {p: 100 * v / total for p, v in ms.items()},
    "syncs_per_step": 1 if args.mode == "item" else (2 if args.mode == "pageable" else 0),
}
with open(args.truth, "w") as f:
    json.dump(truth, f, indent=1)
