"""A plain PyTorch training loop with one known bottleneck, for benchmarks/side_by_side.py. It times
its own steps and prints them, with its truth, as one line at the end:

    BOTTLENECK_TRUTH {"step_s": [...], "cpu_s": [...], "data_s": [...], "compute_s": [...],
                      "shares": {"data": %, "compute": %, "other": %}, "truth": "data"}

(per step: its time, its CPU time in the loop's thread, which a machine busy with other jobs leaves
as it is, and its data and compute parts; the shares over the steps after the first).

    --kind input    a Dataset whose samples each take --read-ms of sleep (slow storage) and
                    --decode-ms of busy CPU (decoding), 2 DataLoader workers, a tiny MLP: the
                    loop waits on next(loader)
    --kind compute  the MNIST CNN (two convolutions), batch 16, from tensors in memory (a
                    DataLoader, no workers): forward, backward and the optimizer step take the step
    --kind wait     a small MLP, batch 32, from tensors in memory, then a --wait-ms sleep each step after the
                    optimizer step (a host wait: a barrier, a synchronous log write); the step is
                    mostly outside the data, the forward, backward and the optimizer

    --traceml       wrap each step in TraceML's traceml.trace_step(model) (its documented setup for
                    a plain loop: a code change); without it the script knows of no tool

A step is from asking for the batch to the end of what follows the optimizer step; "data" is the
wait in next(), "compute" zero_grad through optimizer.step(), "other" the rest. The first step
(workers forked, first pass of everything) is left out of the shares, as the tools leave it out.
"""

import argparse
import contextlib
import json
import time

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset


def busy(ms: float) -> None:
    end = time.perf_counter() + ms / 1e3
    while time.perf_counter() < end:
        pass


class SlowSamples(Dataset):
    def __init__(self, n: int, read_ms: float, decode_ms: float) -> None:
        self.n, self.read_ms, self.decode_ms = n, read_ms, decode_ms

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(self.read_ms / 1e3)
        busy(self.decode_ms)
        return torch.randn(64), torch.tensor(i % 10)


class Net(nn.Module):
    """The MNIST CNN of pytorch/examples."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv2(F.relu(self.conv1(x)))), 2)
        return self.fc2(F.relu(self.fc1(torch.flatten(x, 1))))


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))


parser = argparse.ArgumentParser()
parser.add_argument("--kind", choices=["input", "compute", "wait"], required=True)
parser.add_argument("--steps", type=int, default=80)
parser.add_argument("--read-ms", type=float, default=4.0)
parser.add_argument("--decode-ms", type=float, default=1.0)
parser.add_argument("--wait-ms", type=float, default=20.0)
parser.add_argument("--traceml", action="store_true")
args = parser.parse_args()

torch.manual_seed(0)
torch.set_num_threads(1)  # the same threads bare and under every tool, on a shared machine
if args.kind == "input":
    model = mlp()
    loader = DataLoader(SlowSamples(args.steps * 8, args.read_ms, args.decode_ms), batch_size=8, num_workers=2)
elif args.kind == "compute":
    model = Net()
    loader = DataLoader(
        TensorDataset(torch.randn(args.steps * 16, 1, 28, 28), torch.randint(0, 10, (args.steps * 16,))), batch_size=16
    )
else:
    model = mlp()
    loader = DataLoader(
        TensorDataset(torch.randn(args.steps * 32, 64), torch.randint(0, 10, (args.steps * 32,))), batch_size=32
    )
optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

if args.traceml:
    import traceml_ai as traceml

    traceml.init(mode="auto")

    def step_scope() -> contextlib.AbstractContextManager:
        return traceml.trace_step(model)
else:

    def step_scope() -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()


steps, cpu, data, compute = [], [], [], []
batches = iter(loader)
while True:
    start, start_cpu = time.perf_counter(), time.thread_time()
    try:
        x, y = next(batches)
    except StopIteration:
        break
    got = time.perf_counter()
    with step_scope():  # TraceML's step: the loop's body, from zero_grad on (its documented placement)
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
        computed = time.perf_counter()
        if args.kind == "wait":
            time.sleep(args.wait_ms / 1e3)
    end = time.perf_counter()
    cpu.append(time.thread_time() - start_cpu)
    steps.append(end - start)
    data.append(got - start)
    compute.append(computed - got)

per_step = {"step_s": steps, "cpu_s": cpu, "data_s": data, "compute_s": compute}
total = sum(steps[1:])
shares = {"data": 100 * sum(data[1:]) / total, "compute": 100 * sum(compute[1:]) / total}
shares["other"] = 100 - shares["data"] - shares["compute"]
truth = {name: [round(t, 6) for t in times] for name, times in per_step.items()}
print("BOTTLENECK_TRUTH " + json.dumps({**truth, "shares": shares, "truth": max(shares, key=shares.get)}))
