"""A training loop whose time shares are known: it times itself, the way dlscope should time it,
and writes its own truth (JSON) to the path in argv[1]. Every "cost" is a busy-wait of a known
number of milliseconds, so it holds wall time as real work would.

    known_truth.py TRUTH.json --loader decode --decode-ms 1 --workers 2
    --loader decode      a DataLoader whose samples each take --decode-ms to "decode"
    --loader none        no data source: each batch is built in the loop body (--decode-ms a sample)
    --loader prefetched  every batch built before the loop, then drawn from a list
    --loader thread      a DataLoader drawn by a prefetching thread into a queue, the loop taking
                         its batches from the queue (prefetch_generator's BackgroundGenerator)
    --sleep-ms X         a sleep after each optimizer step (logging, a barrier) in the loop body
    --read-ms X          a sleep per sample in __getitem__ before its decoding (reading it from slow
                         storage): workers overlap it even when the machine's cores are all busy
    --teacher-ms X       each step, a frozen module's forward under no_grad before the model's (a
                         teacher in distillation, a target network in DQN): X ms of busy-wait
    --direct-forward     the loop calls model.forward(x), not model(x) (past `__call__`: only the
                         Linear inside is a module call)
    --forward-waits      the forward sleeps its --forward-ms instead of busy-waiting (a host waiting
                         for its GPU): the CPU is left to the DataLoader's workers (dlscope diff's test)
"""

import argparse
import json
import queue
import threading
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


def busy(ms: float) -> None:
    end = time.perf_counter() + ms / 1e3
    while time.perf_counter() < end:
        pass


class Decoded(Dataset):
    def __init__(self, n: int, ms: float, read_ms: float = 0.0) -> None:
        self.n, self.ms, self.read_ms = n, ms, read_ms

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        if self.read_ms:
            time.sleep(self.read_ms / 1e3)
        busy(self.ms)
        return torch.full((16,), float(i))


class Model(nn.Module):
    """A forward of known cost: FORWARD_MS of busy-wait around a small layer."""

    def __init__(self, forward_ms: float, waits: bool) -> None:
        super().__init__()
        self.layer = nn.Linear(16, 4)
        self.forward_ms = forward_ms
        self.waits = waits

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.waits:
            time.sleep(self.forward_ms / 1e3)
        else:
            busy(self.forward_ms)
        return self.layer(x)


parser = argparse.ArgumentParser()
parser.add_argument("truth")
parser.add_argument("--loader", choices=["decode", "none", "prefetched", "thread"], default="decode")
parser.add_argument("--decode-ms", type=float, default=1.0)
parser.add_argument("--workers", type=int, default=0)
parser.add_argument("--batch-size", type=int, default=4)
parser.add_argument("--steps", type=int, default=40)
parser.add_argument("--forward-ms", type=float, default=4.0)
parser.add_argument("--sleep-ms", type=float, default=0.0)
parser.add_argument("--forward-waits", action="store_true")
parser.add_argument("--read-ms", type=float, default=0.0)
parser.add_argument("--teacher-ms", type=float, default=0.0)
parser.add_argument("--direct-forward", action="store_true")
args = parser.parse_args()

torch.manual_seed(0)
model = Model(args.forward_ms, args.forward_waits)
teacher = Model(args.teacher_ms, False).requires_grad_(False)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
n = args.steps * args.batch_size
if args.loader == "decode":
    batches = iter(
        DataLoader(Decoded(n, args.decode_ms, args.read_ms), batch_size=args.batch_size, num_workers=args.workers)
    )
elif args.loader == "thread":
    ready: queue.Queue = queue.Queue(maxsize=4)
    loader = DataLoader(Decoded(n, args.decode_ms), batch_size=args.batch_size)
    threading.Thread(target=lambda: [*map(ready.put, loader), ready.put(None)], daemon=True).start()
    batches = iter(ready.get, None)
elif args.loader == "prefetched":
    dataset = Decoded(n, args.decode_ms)
    batches = iter(
        [torch.stack([dataset[i + j] for j in range(args.batch_size)]) for i in range(0, n, args.batch_size)]
    )
else:
    dataset = Decoded(n, args.decode_ms)
    batches = (torch.stack([dataset[i + j] for j in range(args.batch_size)]) for i in range(0, n, args.batch_size))

# per step: the time to get a batch, to reach the first forward (the teacher's: in the gap with no
# data source), in forwards (the teacher's too: no grad, inside the step), outside the batch and the
# training work (zero_grad, the sleep: dlscope's "other"), and the whole step
data, before_forward, forward, outside, total = [], [], [], [], []
while True:
    start = time.perf_counter()
    try:
        x = next(batches)  # "none": the generator builds the batch here, in the loop body
    except StopIteration:
        break
    got = time.perf_counter()
    optimizer.zero_grad()
    taught = time.perf_counter()
    if args.teacher_ms:
        with torch.no_grad():
            teacher(x)
    reached = time.perf_counter()
    out = model.forward(x) if args.direct_forward else model(x)
    forwarded = time.perf_counter()
    loss = out.pow(2).mean()  # outside the module's call: dlscope's "other", as zero_grad is
    lossed = time.perf_counter()
    loss.backward()
    optimizer.step()
    stepped = time.perf_counter()
    if args.sleep_ms:
        time.sleep(args.sleep_ms / 1e3)
    end = time.perf_counter()
    data.append(got - start)
    before_forward.append(reached - start)
    forward.append(forwarded - taught)
    outside.append(end - stepped + taught - got + lossed - forwarded)
    total.append(end - start)

steady = slice(1, None)  # the first step holds start-up (workers forked), as dlscope leaves it out


def share(part: list[float]) -> float:
    return 100.0 * sum(part[steady]) / sum(total[steady])


truth = {
    "data_pct": share(data),
    "before_forward_pct": share(before_forward),
    "forward_pct": share(forward),
    "other_pct": share(outside),
}
with open(args.truth, "w") as f:
    json.dump({**truth, "steps": len(total)}, f)
