"""A loop whose batches are known: samples read real files (os.read in CHUNK-byte calls, so the
read calls and bytes are known from the files' sizes), and some samples or the collate take a
known time. Writes its truth (JSON) to argv[1]: its steps and its own timing of the waits,
the fetches and the collates.

    batch_files.py TRUTH.json DATA_DIR --workers 2 --sleep-index 9 --sleep-ms 150
    --iterable          an IterableDataset (each worker reads its own share of the files)
    --persistent --epochs 2 --start-method spawn --pin-memory
    --busy-ms X --collate-ms Y --step-ms Z   busy-waits: each sample, the collate, each step
"""

import argparse
import json
import os
import time

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info

CHUNK = 65536
SPENT = {"fetch_s": 0.0, "collate_s": 0.0}  # timed by the script itself (with --workers 0: this process)


def busy(ms: float) -> None:
    end = time.perf_counter() + ms / 1e3
    while time.perf_counter() < end:
        pass


def read_file(path: str) -> int:
    fd = os.open(path, os.O_RDONLY)
    n = 0
    try:
        while True:
            chunk = os.read(fd, CHUNK)
            if not chunk:
                return n
            n += len(chunk)
    finally:
        os.close(fd)


class Files(Dataset):
    def __init__(self, paths: list[str], args: argparse.Namespace) -> None:
        self.paths, self.args = paths, args

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> torch.Tensor:
        start = time.perf_counter()
        n = read_file(self.paths[i])
        if i == self.args.sleep_index:
            time.sleep(self.args.sleep_ms / 1e3)
        busy(self.args.busy_ms)
        sample = torch.tensor([float(n)])
        SPENT["fetch_s"] += time.perf_counter() - start
        return sample


class FileStream(IterableDataset):
    def __init__(self, paths: list[str], args: argparse.Namespace) -> None:
        self.paths, self.args = paths, args

    def __iter__(self):
        info = get_worker_info()
        share = self.paths if info is None else self.paths[info.id :: info.num_workers]
        for path in share:
            yield torch.tensor([float(read_file(path))])


class Collate:
    def __init__(self, ms: float) -> None:
        self.ms = ms

    def __call__(self, samples: list[torch.Tensor]) -> torch.Tensor:
        start = time.perf_counter()
        busy(self.ms)
        batch = torch.stack(samples)
        SPENT["collate_s"] += time.perf_counter() - start
        return batch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("truth")
    parser.add_argument("data")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--sleep-index", type=int, default=-1)
    parser.add_argument("--sleep-ms", type=float, default=0.0)
    parser.add_argument("--busy-ms", type=float, default=0.0)
    parser.add_argument("--collate-ms", type=float, default=0.0)
    parser.add_argument("--step-ms", type=float, default=0.0)
    parser.add_argument("--iterable", action="store_true")
    parser.add_argument("--persistent", action="store_true")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--start-method", default=None)
    parser.add_argument("--pin-memory", action="store_true")  # without an accelerator torch warns, pins nothing
    args = parser.parse_args()
    paths = sorted(os.path.join(args.data, f) for f in os.listdir(args.data))
    dataset = FileStream(paths, args) if args.iterable else Files(paths, args)
    loader = DataLoader(
        dataset,
        batch_size=args.batch_size,
        num_workers=args.workers,
        persistent_workers=args.persistent and args.workers > 0,
        collate_fn=Collate(args.collate_ms),
        multiprocessing_context=args.start_method if args.workers else None,
        pin_memory=args.pin_memory,
    )
    model = torch.nn.Linear(1, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    # the steps' time as a step is defined: from the first batch asked for to the last optimizer step
    steps, waited, began, stepped = 0, 0.0, None, 0.0
    for _ in range(args.epochs):
        it = iter(loader)
        while True:
            asked = time.perf_counter()
            began = asked if began is None else began
            try:
                x = next(it)
            except StopIteration:
                break
            waited += time.perf_counter() - asked
            model(x).sum().backward()
            optimizer.step()
            stepped = time.perf_counter()
            optimizer.zero_grad()
            busy(args.step_ms)
            steps += 1
    truth = {"steps": steps, "waited_s": waited, "loop_s": stepped - (began or stepped), **SPENT}
    with open(args.truth, "w") as f:
        json.dump(truth, f)


if __name__ == "__main__":
    main()
