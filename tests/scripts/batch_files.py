"""A loop whose batches are known: samples read real files (os.read in CHUNK-byte calls, so the
read calls and bytes are known from the files' sizes), and some samples or the collate take a
known time. Writes its truth (JSON) to argv[1]: its steps and its own timing of the waits,
the fetches and the collates.

    batch_files.py TRUTH.json DATA_DIR --workers 2 --sleep-index 9 --sleep-ms 150
    --iterable          an IterableDataset (each worker reads its own share of the files)
    --persistent --epochs 2 --start-method spawn --pin-memory
    --busy-ms X --collate-ms Y --step-ms Z   busy-waits: each sample, the collate, each step
    --subset            the files through torch's random_split (a Subset: its __getitems__)
    --sampler repeat    a batch sampler that repeats some indices in a batch and skips others
    --whole-loader      then one pass of a second loader (num_workers=0) whose dataset fetches a
                        batch whole by its own __getitems__ (outside any step)
    --noise-thread F    each worker also reads file F in a thread of its own, every millisecond
    --fetched-log DIR   each process appends the file index of every sample it reads to DIR/<pid>
    --lab-loader        dlscope's own DataLoader path (dlscope.data.loaders.TorchLoaderBatches, a
                        new DataLoader every epoch) on synthetic MNIST-shaped images
"""

import argparse
import json
import os
import random
import threading
import time

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, Sampler, get_worker_info, random_split

CHUNK = 65536
SPENT = {"fetch_s": 0.0, "collate_s": 0.0}  # timed by the script itself (with --workers 0: this process)
ALIVE: list = []  # iterators kept to the end of the process (--stop-after)


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

    def slept_before(self) -> bool:
        """With --sleep-once, whether any process slept already (a mark in the data directory)."""
        if not self.args.sleep_once:
            return False
        mark = os.path.join(self.args.data, "slept")
        if os.path.exists(mark):
            return True
        open(mark, "w").close()
        return False

    def __getitem__(self, i: int) -> torch.Tensor:
        start = time.perf_counter()
        if self.args.fetched_log:
            with open(os.path.join(self.args.fetched_log, str(os.getpid())), "a") as log:
                log.write(f"{i}\n")
        n = read_file(self.paths[i])
        if i == self.args.sleep_index and not self.slept_before():
            time.sleep(self.args.sleep_ms / 1e3)
        busy(self.args.busy_ms)
        sample = torch.tensor([float(n)])
        SPENT["fetch_s"] += time.perf_counter() - start
        return sample


class WholeFiles(Files):
    """A dataset that fetches a batch whole (`__getitems__`): DataLoader calls it, not __getitem__."""

    def __getitems__(self, indices: list[int]) -> list[torch.Tensor]:
        return [torch.tensor([float(read_file(self.paths[i]))]) for i in indices]


class RepeatSkip(Sampler):
    """Batches of `size` indices drawn with replacement (seeded): some repeated, some never drawn;
    the batches are known before the loop (`batches`)."""

    def __init__(self, n: int, size: int, count: int, seed: int, must: int) -> None:
        rng = random.Random(seed)
        self.batches = [[rng.randrange(n // 2) for _ in range(size)] for _ in range(count)]
        self.batches[2][1] = self.batches[2][3] = must  # twice in batch 2, and only there
        for b in self.batches[:2] + self.batches[3:]:
            b[:] = [i if i != must else 0 for i in b]

    def __iter__(self):
        return iter([list(b) for b in self.batches])

    def __len__(self) -> int:
        return len(self.batches)


def noise(path: str) -> None:
    while True:
        read_file(path)
        time.sleep(0.001)


def start_noise(args: argparse.Namespace):
    def init(_: int) -> None:
        threading.Thread(target=noise, args=(args.noise_thread,), daemon=True).start()

    return init if args.noise_thread else None


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
    parser.add_argument("--sleep-once", action="store_true", help="sleep at the first fetch of --sleep-index only")
    parser.add_argument("--busy-ms", type=float, default=0.0)
    parser.add_argument("--collate-ms", type=float, default=0.0)
    parser.add_argument("--step-ms", type=float, default=0.0)
    parser.add_argument("--iterable", action="store_true")
    parser.add_argument("--persistent", action="store_true")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--start-method", default=None)
    parser.add_argument("--pin-memory", action="store_true")  # without an accelerator torch warns, pins nothing
    parser.add_argument("--subset", action="store_true")
    parser.add_argument("--sampler", choices=("sequential", "repeat"), default="sequential")
    parser.add_argument("--whole-loader", action="store_true")
    parser.add_argument("--noise-thread", default=None)
    parser.add_argument("--fetched-log", default=None)
    parser.add_argument("--lab-loader", action="store_true")
    parser.add_argument("--stop-after", type=int, default=0)  # steps, then exit with the iterator alive
    args = parser.parse_args()
    if args.lab_loader:
        return lab_loader(args)
    paths = sorted(os.path.join(args.data, f) for f in os.listdir(args.data))
    dataset = FileStream(paths, args) if args.iterable else Files(paths, args)
    extra = {}
    if args.subset:  # random_split's halves: the one with the sleeping file; position p is file subset[p]
        halves = random_split(
            dataset, [len(paths) // 2, len(paths) - len(paths) // 2], torch.Generator().manual_seed(5)
        )
        dataset = next((h for h in halves if args.sleep_index in h.indices), halves[0])
        extra["subset"] = list(dataset.indices)
    batch_sampler = None
    if args.sampler == "repeat":  # the sleeping file's subset position, repeated in batch 2 only
        must = extra["subset"].index(args.sleep_index) if args.subset else args.sleep_index
        batch_sampler = RepeatSkip(len(dataset), args.batch_size, 6, 11, must)
        extra["batches"] = batch_sampler.batches
    loader = make_loader(args, dataset, batch_sampler)
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
            if steps == args.stop_after:  # as an endless loader's loop stops (makemore): the workers
                ALIVE.append(it)  # are still up at exit, and multiprocessing terminates them
                break
    if args.whole_loader:  # an evaluation-like pass outside any step
        for _ in DataLoader(WholeFiles(paths, args), batch_size=args.batch_size, collate_fn=Collate(0.0)):
            pass
    truth = {"steps": steps, "waited_s": waited, "loop_s": stepped - (began or stepped), **SPENT, **extra}
    with open(args.truth, "w") as f:
        json.dump(truth, f)


def make_loader(args: argparse.Namespace, dataset: Dataset, batch_sampler: Sampler | None) -> DataLoader:
    """The loader is made in a function of its own, as a library would make it."""
    return DataLoader(
        dataset,
        batch_size=1 if batch_sampler is not None else args.batch_size,
        batch_sampler=batch_sampler,
        num_workers=args.workers,
        persistent_workers=args.persistent and args.workers > 0,
        collate_fn=Collate(args.collate_ms),
        multiprocessing_context=args.start_method if args.workers else None,
        pin_memory=args.pin_memory,
        worker_init_fn=start_noise(args),
    )


def lab_loader(args: argparse.Namespace) -> None:
    """Two epochs of dlscope's own DataLoader path, a training step per batch; the truth is each
    epoch's sample order, as the lab computes it."""
    from dlscope.data.loaders import TorchLoaderBatches

    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (48, 28, 28), dtype=torch.uint8, generator=g)
    batches = TorchLoaderBatches(images, torch.arange(48) % 10, args.batch_size, seed=3, workers=args.workers)
    model = torch.nn.Linear(28 * 28, 10)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    orders, steps = [], 0
    for epoch in range(args.epochs):
        batches.set_epoch(epoch)
        orders.append(batches.order().tolist())
        for x, y in batches:
            torch.nn.functional.cross_entropy(model(x.flatten(1)), y).backward()
            optimizer.step()
            optimizer.zero_grad()
            steps += 1
    with open(args.truth, "w") as f:
        json.dump({"steps": steps, "orders": orders}, f)


if __name__ == "__main__":
    main()
