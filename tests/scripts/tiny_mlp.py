"""A tiny MLP trained for --seconds on the default intra-op threads (steps of ~1 ms on a quiet
core). --workers N: its batches come from a DataLoader of N worker processes that busy-decode
each sample for --decode-ms, started again at each pass of --batches batches (their CPU time
reaches this process once each pass's workers are joined). Prints the truth it knows: its steps,
their wall and CPU time (its own and its ended workers'), its threads."""

import argparse
import resource
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Decoded(Dataset):
    def __init__(self, n: int, ms: float) -> None:
        self.n, self.ms = n, ms

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        end = time.perf_counter() + self.ms / 1e3
        while time.perf_counter() < end:
            pass
        return torch.randn(64), torch.tensor(i % 10)


def children_cpu() -> float:
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--decode-ms", type=float, default=1.0)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(64, 64), torch.randint(0, 10, (64,))
    loader = DataLoader(Decoded(args.batches * 16, args.decode_ms), batch_size=16, num_workers=args.workers)
    steps, start, cpu, workers = 0, time.perf_counter(), time.process_time(), children_cpu()
    while time.perf_counter() - start < args.seconds:
        for batch in loader if args.workers else [(x, y)]:
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(batch[0]), batch[1]).backward()
            optimizer.step()
            steps += 1
    wall = time.perf_counter() - start
    cpu = time.process_time() - cpu + children_cpu() - workers
    print(
        f"TRUTH steps={steps} step_ms={1e3 * wall / steps:.4f} cpu_ms={1e3 * cpu / steps:.4f} "
        f"threads={torch.get_num_threads()}",
        flush=True,
    )


if __name__ == "__main__":
    main()
