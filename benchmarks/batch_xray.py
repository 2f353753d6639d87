"""The batch x-ray's recording cost (injob/batches.py) against a batch's fetch time, in
one process, bare and recorded interleaved round by round (the same DataLoader, torch's own
fetcher swapped in and out), in CPU time: the median of the rounds' paired differences, and the
minimum over rounds of each (on a shared machine the minimum is the less noisy estimate of a cost
of a few µs).

  main     a DataLoader with num_workers=0: everything the x-ray does is paid in the training
           loop (the timed fetcher, the built and taken records written by the loader hook's
           `delivered` call, made by hand as hooks.py makes it; the bare rounds make none)
  worker   what a worker pays for the same batches (num_workers ≥ 1): the index queue's wrapper
           (it counts resumed epochs), the timed fetcher with the worker's per-sample rule, and
           the built record written as the batch is put on the data queue (stub queues), against
           torch's fetch and the same get and put

Datasets, from cheap to realistic:
  memory   a 28×28 float tensor sliced from memory (~µs a sample: the worst case)
  file     each sample read from its own 4 KiB file (open, read, close)
  decode   a file read, then 20 µs of decoding work (a small image's decode)

Then the training process's side alone with workers (num_workers ≥ 1: the worker pays the rest):
the `_get_data`/`_process_data` wrappers and the taken record, against the bare calls on stubs.

--compare REF also runs batches.py as it was at git revision REF (its own patches of torch, swapped
in the same way), interleaved with the bare loader and this tree's: its cost beside this one's.

--per-sample measures only what a sample timed one by one costs a worker's fetch: its stamp
(_batchpack.Stamps, and PyStamps where no C compiler was found), ns a sample.

--instructions N counts instead, under valgrind's callgrind with its cache model (the same at any
load): machine instructions and first-level cache misses a batch of the memory dataset, N batches
drawn by the training process with num_workers=0 and N built by a worker (its stub queues), bare,
through this tree's x-ray and with --compare through REF's; then "timed", the worker with every
batch's samples timed one by one (its rule for samples of ≥ 5 µs), against the same bare count.

    .venv/bin/python benchmarks/batch_xray.py [--rounds 15] [--batches 40] [--batch-size 64]
        [--compare 696200e] [--instructions 40] [--per-sample]
"""

from __future__ import annotations

import argparse
import atexit
import importlib.util
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, SequentialSampler, dataloader, default_collate
from torch.utils.data._utils import fetch, worker
from torch.utils.data._utils import pin_memory as pinning
from torch.utils.data._utils.fetch import _MapDatasetFetcher

from dlscope.injob import batches
from dlscope.injob.hooks import _wrap


class Memory(Dataset):
    def __init__(self, n: int) -> None:
        self.data = torch.randn(n, 28, 28)

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.data[i]


class Files(Dataset):
    def __init__(self, directory: Path, n: int, decode_us: float = 0.0) -> None:
        self.paths = []
        for i in range(n):
            path = directory / f"{i:05d}.bin"
            path.write_bytes(os.urandom(4096))
            self.paths.append(str(path))
        self.decode_s = decode_us / 1e6

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> torch.Tensor:
        with open(self.paths[i], "rb") as f:
            raw = f.read()
        if self.decode_s:
            end = time.perf_counter() + self.decode_s
            while time.perf_counter() < end:
                pass
        return torch.frombuffer(bytearray(raw), dtype=torch.uint8)


BARE_FETCH = _MapDatasetFetcher.fetch
STUB_QUEUE = SimpleNamespace(put=lambda item: None)


class StubIndexQueue:
    """A worker's index queue, handing out a round's batches as `(idx, indices)`."""

    def __init__(self) -> None:
        self.sent: Any = iter(())

    def get(self, timeout: float | None = None) -> tuple[int, list[int]]:
        return next(self.sent)


PATCHED = (
    (fetch._MapDatasetFetcher, "fetch"),
    (fetch._IterableDatasetFetcher, "fetch"),
    (worker, "_worker_loop"),
    (dataloader._SingleProcessDataLoaderIter, "_next_data"),
    (dataloader._MultiProcessingDataLoaderIter, "_get_data"),
    (dataloader._MultiProcessingDataLoaderIter, "_process_data"),
    (dataloader._MultiProcessingDataLoaderIter, "_reset"),
    (pinning, "pin_memory"),
    (dataloader.DataLoader, "__iter__"),  # the loader record and pass count: the bare rounds run without them
)


def state() -> list:
    return [getattr(owner, name) for owner, name in PATCHED]


def put(values: list) -> None:
    for (owner, name), value in zip(PATCHED, values, strict=True):
        setattr(owner, name, value)


def batches_at(ref: str, directory: Path) -> Any:  # a module
    """injob/batches.py as it was at git revision `ref`, imported as a module of its own."""
    source = subprocess.run(
        ["git", "show", f"{ref}:src/dlscope/injob/batches.py"], check=True, capture_output=True, text=True
    ).stdout
    path = directory / f"batches_{ref}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(f"batches_{ref}", path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules[spec.name] = module  # type: ignore[union-attr]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def epoch_seconds(loader: DataLoader, delivered: Any, batches_n: int) -> float:
    """CPU seconds of this thread to draw `batches_n` batches, with the loader hook's clock reads
    and its `delivered` call (None: bare) made as hooks.py makes them. CPU time, not wall time: the
    cost is CPU work, and on a shared machine the time this thread waits for a core would drown a
    few µs."""
    it = iter(loader)
    start = time.thread_time()
    draw(it, delivered, batches_n)
    return time.thread_time() - start


def draw(it: Any, delivered: Any, batches_n: int) -> None:
    """`batches_n` batches from the loader iterator `it`, each between two clock reads and handed
    to `delivered` (None: bare), as hooks.loader_next does."""
    for _ in range(batches_n):
        t0 = time.time()
        next(it)
        t1 = time.time()
        if delivered is not None:
            delivered(it, t0, t1)


def worker_seconds(dataset: Dataset, fetch: Any, queues: tuple[Any, Any], indices: list[list[int]]) -> float:
    """CPU seconds of this thread to build `indices`' batches as a worker builds them: taken from
    its index queue as (idx, indices), fetched, then put on its data queue as (idx, batch);
    `queues`: (the stub index queue, as the worker's loop sees it; the data queue)."""
    fetcher = _MapDatasetFetcher(dataset, True, default_collate, False)
    stub, index_queue, data_queue = queues
    stub.sent = iter(list(enumerate(indices)))
    start = time.thread_time()
    for _ in indices:
        idx, index = index_queue.get(timeout=5.0)
        data_queue.put((idx, fetch(fetcher, index)))
    return time.thread_time() - start


def worker_recorder(module: Any, directory: Path) -> tuple[Any, tuple[Any, Any, Any]]:
    """The timed map fetcher of `module` (a batches.py) and the queues its `worker_loop` hands the
    worker's loop (the stub index queue, then it as the loop sees it, and the data queue)."""
    recorder = module.BatchRecorder(str(directory))
    stub = StubIndexQueue()

    def loop(index_queue: Any, data_queue: Any, worker_id: int) -> tuple[Any, Any, Any]:
        return stub, index_queue, data_queue

    # where the loop's arguments stand: (data_queue, worker_id); a batches.py with an IndexQueue
    # (a0ed266's) wraps the index queue too, and takes (index_queue, data_queue, worker_id)
    positions = (0, 1, 2) if hasattr(module, "IndexQueue") else (1, 2)
    return recorder.map_fetcher(BARE_FETCH), recorder.worker_loop(loop, positions, stub, STUB_QUEUE, 0)


def rotated(order: list, r: int) -> list:
    """Round r's order: each mode takes each place equally often. (Reversing the order every
    other round, as this did, left the middle one of three in the middle always: the one after
    the worker's rounds, or before them, pays for what they evicted, and --compare's REF never
    did, which flattered it.)"""
    k = r % len(order)
    return order[k:] + order[:k]


def paired(recorded: list[float], bare: list[float]) -> float:
    return statistics.median(x - b for x, b in zip(recorded, bare, strict=True))


def report(name: str, side: str, bare: list[float], recorded: list[float]) -> None:
    """One line: bare median ms a batch; the cost, median of paired rounds and min against min."""
    b, b_min = statistics.median(bare), min(bare)
    cost, cost_min = paired(recorded, bare), min(recorded) - b_min
    print(
        f"{name:8} {side:10} {b * 1e3:9.3f} {cost * 1e6:9.1f} {100 * cost / b:7.2f}%"
        f" {b_min * 1e3:9.3f} {cost_min * 1e6:9.1f} {100 * cost_min / b_min:7.2f}%"
    )


def taken_side_us(recorder: batches.BatchRecorder, rounds: int, calls: int = 5000) -> float:
    """µs of CPU a batch taken from a worker costs the training process: the iterator wrappers and
    the taken record (stub iterator and queue; the record file's buffer dropped, not written)."""
    it = SimpleNamespace(_rcvd_idx=1, _in_order=True, _workers=[SimpleNamespace(pid=1)], _dlscope_pass=(0, 0))

    def get(iterator: Any) -> tuple[int, str]:
        return 0, "batch"

    def process(iterator: Any, data: Any, worker_idx: int) -> Any:
        return data

    wrapped_get, wrapped_process = _wrap(get, recorder.get_data), _wrap(process, recorder.process_data)

    def bare() -> None:
        process(it, get(it)[1], 0)

    def recorded() -> None:
        wrapped_process(it, wrapped_get(it)[1], 0)
        recorder.delivered(it, 1.0, 2.0)

    spent: dict[str, list[float]] = {"bare": [], "recorded": []}
    order = [("bare", bare), ("recorded", recorded)]
    for r in range(rounds):
        for name, call in order if r % 2 else order[::-1]:
            start = time.thread_time()
            for _ in range(calls):
                call()
            spent[name].append((time.thread_time() - start) / calls * 1e6)
    return statistics.median(x - b for x, b in zip(spent["recorded"], spent["bare"], strict=True))


# N batches of the memory dataset drawn with num_workers=0 under callgrind, counted only over
# those batches (callgrind_control toggles the counting from outside the loop): bare, through
# this tree's x-ray ("xray") or through REF's (its git revision)
COUNTED_BATCHES = """
import os, subprocess, sys, tempfile, time
from pathlib import Path
sys.path.insert(0, sys.argv[3])
import torch
from torch.utils.data import BatchSampler, DataLoader, SequentialSampler
import batch_xray as bench
torch.set_num_threads(1)
mode, n, side = sys.argv[1], int(sys.argv[2]), sys.argv[4]
dataset = bench.Memory(64 * (n + 20))
module = None
if mode != "bare":
    module = bench.batches if mode == "xray" else bench.batches_at(mode, Path(tempfile.mkdtemp()))
recorder = None
if side == "main":
    loader = DataLoader(dataset, batch_size=64)
    delivered = None
    if module is not None:
        from dlscope.injob.hooks import _wrap
        recorder = module.attach(torch, tempfile.mkdtemp(), _wrap)
        delivered = recorder.delivered
    it = iter(loader)
    def draw(k):
        bench.draw(it, delivered, k)
else:  # a worker's side, its stub queues as in the timed rounds
    indices = iter(list(BatchSampler(SequentialSampler(dataset), 64, False)))
    stub = bench.StubIndexQueue()
    fetch, queues = bench.BARE_FETCH, (stub, stub, bench.STUB_QUEUE)
    if module is not None:
        fetch, queues = bench.worker_recorder(module, Path(tempfile.mkdtemp()))
        recorder = queues[2].recorder
        # its rule as at native speed (under callgrind every sample looks slow): these ~1.5 µs
        # samples are under its line, so one batch in SAMPLE_EVERY has its samples timed; on
        # the side "timed", every batch's are (as for samples of ≥ 5 µs: a file read each)
        recorder.sample_min_s = 0.0 if side == "timed" else 3600.0
    def draw(k):
        bench.worker_seconds(dataset, fetch, queues, [next(indices) for _ in range(k)])
draw(20)
if recorder is not None:  # its file opened and its header written before the count
    recorder.file.flush()
subprocess.run(["callgrind_control", "-i", "on", str(os.getpid())], capture_output=True)
draw(n)
subprocess.run(["callgrind_control", "-i", "off", str(os.getpid())], capture_output=True)
"""


KEPT = ("Ir", "I1mr", "D1mr")  # callgrind's events: instructions, I1 misses, D1 read misses


def count_instructions(batches_n: int, compare: str | None) -> None:
    """Instructions and first-level cache misses (callgrind's model of this host's caches) a
    batch of 64 tensors sliced from memory, in the training process (num_workers=0) and in a
    worker: bare, this tree's x-ray, and REF's."""
    if shutil.which("valgrind") is None:
        raise SystemExit("--instructions needs valgrind (apt-get install valgrind)")
    here = str(Path(__file__).resolve().parent)
    modes = ["bare", "xray", *([compare] if compare else [])]
    print(f"a batch of 64 tensors from memory, {batches_n} batches counted (callgrind, cache model)")
    print(f"{'':19} {'instructions':>20} {'I1 misses':>16} {'D1 read misses':>16}")
    with tempfile.TemporaryDirectory() as tmp:
        bare: dict[str, float] = {}
        for side in ("main", "worker", "timed"):
            counted = {
                mode: callgrind_counts(Path(tmp) / f"{side}-{mode}", mode, side, batches_n, here)
                for mode in modes
                if not (side == "timed" and mode == "bare")  # the worker's bare count is the same
            }
            bare = counted.get("bare", bare)
            for mode, c in counted.items():
                cells = [f"{c[k]:,.0f}" + ("" if mode == "bare" else f" ({c[k] - bare[k]:+,.0f})") for k in KEPT]
                label = f"{side} " + (mode if mode in ("bare", "xray") else f"xray {mode}")
                print(f"{label:19} {cells[0]:>20} {cells[1]:>16} {cells[2]:>16}")


def callgrind_counts(out: Path, mode: str, side: str, batches_n: int, here: str) -> dict[str, float]:
    """KEPT's counts a batch: COUNTED_BATCHES run under callgrind, its output file `out`."""
    argv = ["valgrind", "--tool=callgrind", "--instr-atstart=no", "--cache-sim=yes", f"--callgrind-out-file={out}"]
    done = subprocess.run(
        [*argv, sys.executable, "-c", COUNTED_BATCHES, mode, str(batches_n), here, side],
        capture_output=True,
        text=True,
    )
    text = out.read_text() if out.exists() else ""
    events, totals = re.search(r"^events: (.+)$", text, re.M), re.search(r"^totals: (.+)$", text, re.M)
    if done.returncode != 0 or events is None or totals is None:
        raise SystemExit(f"callgrind counted nothing for {side} {mode}: {done.stderr[-500:]}")
    counts = dict(zip(events.group(1).split(), map(int, totals.group(1).split()), strict=False))
    if not set(KEPT) <= set(counts):
        raise SystemExit(f"callgrind gave {sorted(counts)} for {side} {mode}, not {KEPT}")
    return {k: v / batches_n for k, v in counts.items()}


def per_sample(rounds: int, batches_n: int, batch_size: int, datasets: dict[str, Dataset]) -> None:
    """ns of CPU a sample timed one by one costs a worker's fetch, as its fetcher stamps each
    sample (`[stamp(dataset[i]) for i in indices]`) against the same comprehension unstamped:
    the C Stamps (the time-stamp counter where invariant; then CLOCK_MONOTONIC) and PyStamps (no
    C compiler at install). Interleaved round by round; the median of the paired differences."""
    makers = {"PyStamps": batches.PyStamps}
    if batches._batchpack is not None:
        makers["Stamps"] = batches._batchpack.Stamps
        makers["Stamps, monotonic"] = lambda n: batches._batchpack.Stamps(n, tsc=False)
    print(f"ns a sample stamped (median of {rounds} paired rounds of {batches_n} batches of {batch_size})")
    for name, dataset in datasets.items():
        indices = list(BatchSampler(SequentialSampler(dataset), batch_size, False))[:batches_n]

        def bare(index: list[int], dataset: Dataset = dataset) -> list:
            return [dataset[i] for i in index]

        def stamped(index: list[int], make: Any, dataset: Dataset = dataset) -> list:
            stamp = make(len(index)).stamp
            return [stamp(dataset[i]) for i in index]

        calls = {"bare": bare, **{k: (lambda index, m=m: stamped(index, m)) for k, m in makers.items()}}
        spent: dict[str, list[float]] = {k: [] for k in calls}
        for r in range(rounds):
            for k, call in rotated(list(calls.items()), r):
                start = time.thread_time()
                for index in indices:
                    call(index)
                spent[k].append((time.thread_time() - start) / (len(indices) * batch_size))
        sample_us = statistics.median(spent["bare"]) * 1e6
        cells = [f"{k} {paired(spent[k], spent['bare']) * 1e9:5.0f}" for k in makers]
        print(f"{name:8} a sample {sample_us:6.2f} µs; " + ", ".join(cells))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--batches", type=int, default=40)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--compare", metavar="REF", help="also the x-ray of git revision REF")
    parser.add_argument("--instructions", type=int, metavar="N", help="count N batches under callgrind instead")
    parser.add_argument("--per-sample", action="store_true", help="only a sample's stamp, ns a sample")
    args = parser.parse_args()
    if args.instructions:
        count_instructions(args.instructions, args.compare)
        return
    torch.set_num_threads(1)
    n = args.batches * args.batch_size
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "files").mkdir()
        (root / "decode").mkdir()
        (root / "records").mkdir()
        datasets = {
            "memory": Memory(n),
            "file": Files(root / "files", n),
            "decode": Files(root / "decode", n, decode_us=20.0),
        }
        if args.per_sample:
            per_sample(args.rounds, args.batches, args.batch_size, datasets)
            return
        bare = state()
        modes = {}  # mode -> (its patches, its recorder, its worker's fetcher and queues)
        if args.compare:
            (root / "before").mkdir()
            module = batches_at(args.compare, root)
            before = module.attach(torch, str(root / "before"), _wrap)
            modes[args.compare] = (state(), before, worker_recorder(module, root / "before"))
            put(bare)
        recorder = batches.attach(torch, str(root / "records"), _wrap)
        modes["xray"] = (state(), recorder, worker_recorder(batches, root / "records"))
        put(bare)
        print(f"µs a batch of {args.batch_size}, CPU time; cost: median of {args.rounds} paired rounds, and min - min")
        print(f"{'dataset':8} {'side':10} {'bare ms':>9} {'cost µs':>9} {'%':>8} {'min ms':>9} {'cost µs':>9} {'%':>8}")
        for name, dataset in datasets.items():
            loader = DataLoader(dataset, batch_size=args.batch_size, num_workers=0)
            indices = list(BatchSampler(SequentialSampler(dataset), args.batch_size, False))[: args.batches]
            times: dict[str, list[float]] = {side: [] for mode in ("bare", *modes) for side in (mode, f"{mode} worker")}
            for r in range(args.rounds):
                order = [("bare", (bare, None)), *((mode, (v, rec.delivered)) for mode, (v, rec, _) in modes.items())]
                for mode, (values, delivered) in rotated(order, r):
                    put(values)
                    times[mode].append(epoch_seconds(loader, delivered, args.batches) / args.batches)
                put(bare)
                stub = StubIndexQueue()
                sides = [("bare", (BARE_FETCH, (stub, stub, STUB_QUEUE)))]
                sides += [(mode, worker) for mode, (_, _, worker) in modes.items()]
                for mode, (fetch_, queues) in rotated(sides, r):
                    times[f"{mode} worker"].append(worker_seconds(dataset, fetch_, queues, indices) / len(indices))
            for side in ("", " worker"):
                for mode in modes:
                    label = ("main" if not side else "worker") + ("" if mode == "xray" else f" {mode}")
                    report(name, label, times[f"bare{side}"], times[f"{mode}{side}"])
        for _, rec, _ in modes.values():  # their exit-time cost measurement and flush: not into a removed directory
            atexit.unregister(rec.close)
            rec.file.flush()
        written = sum(p.stat().st_size for p in (root / "records").glob("*.batches"))
        taken = taken_side_us(batches.BatchRecorder(None), args.rounds)
        print(f"the training process's side with workers: {taken:.2f} µs a batch (median of paired rounds)")
        print(f"records written: {written:,} bytes in all")


if __name__ == "__main__":
    main()
