"""The data flow batch by batch, inside every process `dlscope run` observes: which worker built
each batch, from which samples, how long each sample's fetch and the collate took, when it was
ready, when the training loop took it and how long the loop waited for it. Stdlib only; attached
to torch by the script hooks (hooks.py) once the script imports torch.

Where it hooks (torch.utils.data, looked up once at attach):
  - the dataset fetchers (`_MapDatasetFetcher.fetch`, `_IterableDatasetFetcher.fetch`): the same
    loop as torch's, with one clock read after each sample (map-style `__getitem__`, or the
    iterable's `next`) and around `collate_fn`; torch's own `Subset` (random_split's), whose
    `__getitems__` only maps the indices, is fetched as it would fetch, `base[indices[i]]`,
    sample by sample; any other dataset with a `__getitems__` (a batched fetch) is timed whole;
  - the worker loop (`_worker_loop`, the target DataLoader starts its workers with — by name, so a
    spawned worker, which unpickles it, gets the wrapped one too): its index queue and data queue
    are handed on wrapped, so a batch is known by DataLoader's own number (the send index `idx`)
    from the `(idx, indices)` the worker receives to the `(idx, batch)` it puts back;
  - in the training process, `_MultiProcessingDataLoaderIter._process_data` (each batch handed to
    `__next__`, with its worker) and `_get_data`, `_reset` (persistent workers' epochs), and
    `_SingleProcessDataLoaderIter._next_data` (num_workers=0: the batch is built right there);
  - `pin_memory` (the pin-memory thread's and the single-process path's);
  - `DataLoader.__iter__`: each loader is numbered at its first pass (a "loader" record says what
    it is), each `iter()` of it is one pass (an epoch of a training loader).

Per batch, one binary record in `<pid>.batches`, never one per sample in the training process:
"built" where the batch was built (a worker, or the training process with num_workers=0) and
"taken" in the training process (written by hooks.loader_next with the wait); per DataLoader,
one "loader" record in the training process, and at its exit one "cost". Records are buffered
and written at FLUSH_BYTES or FLUSH_SECONDS after the oldest, when a worker's loop ends and at
exit: a write(2) per batch was half the cost on a fast dataset; a SIGKILL loses at most
FLUSH_SECONDS of batches.

    b"DLSBATCH"  uint32 n  n bytes of JSON {"version", "built", "taken", "loader", "cost"}  records...
    a record:    uint32 its length in bytes, uint8 kind (0 built, 1 taken, 2 loader, 3 cost), the
                 rest per kind:
    built        BUILT below, then n int64 sample indices (map-style: the sampler's, as fetched,
                 repeats included; iterable: the position in this worker's stream; -1: not an
                 integer), then, when flag SAMPLE_TIMES is set, n float64: when each sample ended
                 (CLOCK_REALTIME s)
    taken        TAKEN below
    loader       LOADER below, then JSON {"dataset", "sampler", "batch_size", "num_workers", ...}
    cost         LOADER below (loader 0), then JSON {"batch_us", "sample_ns", "samples"}: the x-ray's
                 own cost, measured at exit in a process that iterated a DataLoader (batchcost.py)

A batch is joined across processes on (worker pid, generation, idx): DataLoader numbers batches
as it sends them, from 0 at every epoch, and a persistent worker's generation counts the epochs
it was told to resume (`_ResumeIteration`), as the training process counts `_reset`s.
"""

from __future__ import annotations

import atexit
import inspect
import json
import os
import struct
import threading
import time
from collections.abc import Callable
from typing import Any

from dlscope.observe.script.stepmachine import native_thread_id

BATCHES_MAGIC = b"DLSBATCH"
BATCHES_VERSION = 2
KIND_BUILT, KIND_TAKEN, KIND_LOADER, KIND_COST = 0, 1, 2, 3
# built flags: samples timed one by one; an iterable dataset; fetched whole by `__getitems__`
SAMPLE_TIMES, ITERABLE, WHOLE = 1, 2, 4
# length, kind, flags, worker_id (-1: the training process), generation, idx, samples, tid (the
# thread that fetched it: its system calls are the batch's), start (fetch began), fetched
# (collate began), collated, ready (handed to the data queue)
BUILT = struct.Struct("<IBBhIIIIdddd")
BUILT_FIELDS = ("length", "kind", "flags", "worker_id", "generation", "idx", "samples", "tid")
BUILT_TIMES = ("start", "fetched", "collated", "ready")
# length, kind, pad, worker_id, worker_pid, generation, idx, loader, pass (UNKNOWN: a loader
# iterated without DataLoader.__iter__), next_start, next_end (the loader's __next__), taken (the
# training process had the batch in hand), pin seconds (NaN: not pinned)
TAKEN = struct.Struct("<IBxhIIIIIdddf")
TAKEN_FIELDS = ("length", "kind", "worker_id", "worker_pid", "generation", "idx", "loader", "pass")
TAKEN_TIMES = ("next_start", "next_end", "taken", "pin")
LOADER = struct.Struct("<IBxxxI")  # length, kind, loader; then its description as JSON
UNKNOWN = 0xFFFFFFFF
NAN = float("nan")
FLUSH_BYTES, FLUSH_SECONDS = 1 << 16, 0.5
# A clock read per sample costs ~55 ns: ≤ 1.1% of a sample of ≥ 5 µs. A process whose last batch's
# samples took less on average (tensors sliced from memory) times the next batch whole, and its
# samples one batch in SAMPLE_EVERY, so their distribution is still seen.
SAMPLE_TIMING_MIN_S, SAMPLE_EVERY = 5e-6, 16


def header() -> bytes:
    description = {
        "version": BATCHES_VERSION,
        "built": {"struct": BUILT.format, "fields": [*BUILT_FIELDS, *BUILT_TIMES], "then": ["<q", "<d"]},
        "taken": {"struct": TAKEN.format, "fields": [*TAKEN_FIELDS, *TAKEN_TIMES]},
        "loader": {"struct": LOADER.format, "fields": ["length", "kind", "loader"], "then": ["json"]},
        "cost": {"struct": LOADER.format, "fields": ["length", "kind", "loader"], "then": ["json"]},
    }
    text = json.dumps(description).encode()
    return BATCHES_MAGIC + struct.pack("<I", len(text)) + text


class BatchFile:
    """This process's `<pid>.batches`, opened at its first batch (a forked child opens its own,
    and drops what its parent had buffered)."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.fd: int | None = None
        self.pid = 0
        self.buffer = bytearray()
        self.oldest = 0.0
        self.lock = threading.Lock()  # the pin-memory thread never writes, but a user's threads may

    def write(self, record: bytes, now: float) -> None:
        with self.lock:
            if not self.buffer:
                self.oldest = now
            self.buffer += record
            if len(self.buffer) >= FLUSH_BYTES or now - self.oldest >= FLUSH_SECONDS:
                self._flush()

    def flush(self) -> None:
        with self.lock:
            self._flush()

    def _flush(self) -> None:
        if not self.buffer:
            return
        if self.fd is None or self.pid != os.getpid():
            self._open()
        os.write(self.fd, self.buffer)  # type: ignore[arg-type]
        self.buffer = bytearray()

    def forked(self) -> None:
        self.buffer = bytearray()
        self.lock = threading.Lock()
        self.fd = None

    def _open(self) -> None:
        self.pid = os.getpid()
        path = os.path.join(self.directory, f"{self.pid}.batches")
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
        if os.fstat(self.fd).st_size == 0:
            os.write(self.fd, header())


class Building:
    """The batch being built in this thread: filled by the fetcher, written when it is handed on."""

    __slots__ = ("collated", "ends", "fetched", "flags", "indices", "start", "tid")

    def __init__(self) -> None:
        self.start = self.fetched = self.collated = 0.0
        self.indices: list[Any] = []
        self.ends: list[float] | None = None
        self.flags = 0
        self.tid = 0


class BatchRecorder:
    """One per process. `built` is the batch the fetcher just finished in this process."""

    def __init__(self, directory: str) -> None:
        self.file = BatchFile(directory)
        self.local = threading.local()
        self.generation = 0  # in a worker: the epochs it was told to resume
        self.worker_id = -1
        self.serial = 0  # in the training process: single-process iterators numbered as they start
        self.pins: dict[int, float] = {}  # id(pinned batch) -> seconds, from the pin-memory thread
        self.shapes: dict[tuple[int, bool], struct.Struct] = {}  # a built record's, by (samples, timed)
        self.time_samples = True  # the next batch's samples are timed one by one
        self.pid = os.getpid()  # getpid(2) is a system call: kept, and renewed in a forked child
        self.fetches = 0
        self.loaders = 0  # DataLoaders iterated in this process
        self.batch_size = 0  # the first loader's: the x-ray's own cost is measured at it
        self.wrap: Callable[[Callable, Callable], Callable] | None = None  # hooks._wrap, from attach

    def forked(self) -> None:
        self.pid = os.getpid()
        self.local = threading.local()  # no batch of the parent's is this process's
        self.pins.clear()
        self.file.forked()

    # the fetchers ---------------------------------------------------------------------------
    def fetch_map(self, fetcher: Any, index: Any) -> Any:
        clock = time.time
        b = Building()
        b.start = clock()
        b.tid = native_thread_id()  # the id the system-call tracers see
        dataset = fetcher.dataset
        if fetcher.auto_collation:
            b.indices = index
            base, fetched = dataset, index  # most datasets: no __getitems__, fetched one by one as they are
            if getattr(dataset, "__getitems__", None):
                base, fetched = _per_sample(dataset, index)
            if base is None:  # the dataset's own batched fetch
                b.flags = WHOLE
                data = dataset.__getitems__(index)
            elif self.time_samples:
                b.flags = SAMPLE_TIMES
                ends: list[float] = []
                data = []
                for i in fetched:  # (a comprehension or an array('d') measured no cheaper: BENCHMARKS.md)
                    data.append(base[i])
                    ends.append(clock())
                b.ends = ends
            else:
                data = [base[i] for i in fetched]
        else:
            b.indices = [index]
            data = dataset[index]
            b.flags, b.ends = SAMPLE_TIMES, [clock()]
        b.fetched = clock()
        self.fetches += 1
        n = len(b.indices)
        self.time_samples = b.fetched - b.start >= SAMPLE_TIMING_MIN_S * n or not self.fetches % SAMPLE_EVERY
        out = fetcher.collate_fn(data)
        b.collated = clock()
        self.local.built = b
        return out

    def fetch_iterable(self, fetcher: Any, index: Any) -> Any:
        if fetcher.ended:
            raise StopIteration
        clock = time.time
        b = Building()
        b.flags = SAMPLE_TIMES | ITERABLE
        b.start = clock()
        b.tid = native_thread_id()  # the id the system-call tracers see
        first = getattr(fetcher, "_dlscope_drawn", 0)
        ends: list[float] = []
        it = fetcher.dataset_iter
        if fetcher.auto_collation:
            data = []
            for _ in index:
                try:
                    data.append(next(it))
                except StopIteration:
                    fetcher.ended = True
                    break
                ends.append(clock())
            if not data or (fetcher.drop_last and len(data) < len(index)):
                raise StopIteration
        else:
            data = next(it)
            ends.append(clock())
        fetcher._dlscope_drawn = first + len(ends)
        b.indices, b.ends = range(first, first + len(ends)), ends
        b.fetched = clock()
        out = fetcher.collate_fn(data)
        b.collated = clock()
        self.local.built = b
        return out

    def take_built(self) -> Building | None:
        b = getattr(self.local, "built", None)
        self.local.built = None
        return b

    def write_built(self, b: Building, generation: int, idx: int, ready: float) -> None:
        n = len(b.indices)
        ends = b.ends
        timed = ends is not None and len(ends) == n
        record = self.shapes.get((n, timed))
        if record is None:  # the whole record in one Struct per batch size: one pack, no join
            record = self.shapes[n, timed] = struct.Struct(BUILT.format + f"{n}q" + (f"{n}d" if timed else ""))
        flags = b.flags if timed else b.flags & ~SAMPLE_TIMES
        head = (record.size, KIND_BUILT, flags, self.worker_id, generation, idx, n, b.tid)
        times = (b.start, b.fetched, b.collated, ready)
        try:
            packed = record.pack(*head, *times, *b.indices, *(ends if timed else ()))  # type: ignore[misc]
        except struct.error:  # a sampler that yields keys, not integers
            indices = [i if isinstance(i, int) and -(1 << 63) <= i < 1 << 63 else -1 for i in b.indices]
            packed = record.pack(*head, *times, *indices, *(ends if timed else ()))  # type: ignore[misc]
        self.file.write(packed, ready)

    # a worker -------------------------------------------------------------------------------
    def worker_loop(self, loop: Callable, positions: tuple[int, int, int], *args: Any, **kwargs: Any) -> Any:
        """The worker's own loop, run with its queues wrapped."""
        index_at, data_at, worker_at = positions
        args = list(args)
        self.worker_id = int(args[worker_at]) if len(args) > worker_at else int(kwargs.get("worker_id", -1))
        self.generation = 0
        if len(args) > data_at:
            args[index_at], args[data_at] = IndexQueue(args[index_at], self), DataQueue(args[data_at], self)
        else:
            kwargs["index_queue"] = IndexQueue(kwargs["index_queue"], self)
            kwargs["data_queue"] = DataQueue(kwargs["data_queue"], self)
        try:
            return loop(*args, **kwargs)
        finally:
            self.file.flush()  # a worker leaves through os._exit: no atexit

    # the training process ---------------------------------------------------------------------
    def single_next(self, next_data: Callable, iterator: Any) -> Any:
        """num_workers=0: the batch is fetched (and pinned) right here."""
        data = next_data(iterator)
        built = self.take_built()
        if built is not None:
            own = iterator.__dict__
            idx = own.get("_dlscope_idx", 0)
            if not idx:
                self.serial += 1
                own["_dlscope_serial"] = self.serial
            own["_dlscope_idx"] = idx + 1
            serial = own["_dlscope_serial"]
            now = time.time()
            self.write_built(built, serial, idx, now)
            pin = self.pins.pop(id(data), NAN) if self.pins else NAN
            own["_dlscope_taken"] = (-1, self.pid, serial, idx, now, pin)
        return data

    def get_data(self, get: Callable, iterator: Any) -> Any:
        got = get(iterator)
        iterator._dlscope_received = got[0] if isinstance(got, tuple) and got else None
        return got

    def process_data(self, process: Callable, iterator: Any, data: Any, worker_idx: int) -> Any:
        now = time.time()
        # in order, the batch handed on is always the one just before _rcvd_idx (received now or
        # stashed earlier); out of order, always the one just received
        idx = iterator._rcvd_idx - 1 if iterator._in_order else getattr(iterator, "_dlscope_received", None)
        if isinstance(idx, int):
            pid = iterator._workers[worker_idx].pid
            pin = self.pins.pop(id(data), NAN) if self.pins else NAN
            generation = getattr(iterator, "_dlscope_generation", 0)
            iterator._dlscope_taken = (worker_idx, pid, generation, idx, now, pin)
        return process(iterator, data, worker_idx)

    def reset(self, reset: Callable, iterator: Any, loader: Any, first_iter: bool = False) -> Any:
        iterator._dlscope_generation = 0 if first_iter else getattr(iterator, "_dlscope_generation", 0) + 1
        return reset(iterator, loader, first_iter)

    def delivered(self, iterator: Any, start: float, end: float) -> None:
        """Called by the loader hook after each `__next__` of a DataLoader iterator."""
        taken = iterator.__dict__.pop("_dlscope_taken", None)
        if taken is None:
            return
        worker_id, pid, generation, idx, when, pin = taken
        loader, passes = iterator.__dict__.get("_dlscope_pass", UNKNOWN_PASS)
        record = TAKEN.pack(
            TAKEN.size, KIND_TAKEN, worker_id, pid, generation, idx, loader, passes, start, end, when, pin
        )
        self.file.write(record, end)

    def loader_iter(self, iter_: Callable, loader: Any) -> Any:
        """`DataLoader.__iter__`: one more pass of this loader (numbered at its first, with a
        "loader" record saying what it is); its iterator's batches are taken in that pass."""
        it = iter_(loader)
        try:
            own = loader.__dict__
            number = own.get("_dlscope_loader")
            if number is None:
                number = own["_dlscope_loader"] = self.loaders
                self.loaders += 1
                described = describe_loader(loader)
                self.batch_size = self.batch_size or described["batch_size"] or 0
                self.write_json(KIND_LOADER, number, described)
            passes = own["_dlscope_passes"] = own.get("_dlscope_passes", -1) + 1
            if isinstance(it, _ITERATORS):  # not a loader's own iterator type
                it.__dict__["_dlscope_pass"] = (number, passes)
        except Exception:  # a loader dlscope cannot describe: its batches are still recorded, loader "?"
            pass
        return it

    def write_json(self, kind: int, number: int, value: dict[str, Any]) -> None:
        text = json.dumps(value).encode()
        self.file.write(LOADER.pack(LOADER.size + len(text), kind, number) + text, time.time())

    def close(self) -> None:
        """At exit: where a DataLoader was iterated, the x-ray's own cost measured, then all written."""
        if self.loaders and self.wrap is not None:
            from dlscope.observe.script import batchcost

            try:
                cost = batchcost.measure(BatchRecorder, BatchFile, _as_method, self.wrap, self.batch_size or 64)
            except Exception as e:  # never fail the job's exit: the report then says it is unmeasured
                cost = {"error": f"{type(e).__name__}: {e}"}
            self.write_json(KIND_COST, 0, cost)
        self.file.flush()

    def pin(self, pin_memory: Callable, data: Any, *args: Any, **kwargs: Any) -> Any:
        """The outermost pin_memory call of a batch (it recurses through the module's own name)."""
        local = self.local
        if getattr(local, "pinning", False):
            return pin_memory(data, *args, **kwargs)
        local.pinning = True
        start = time.perf_counter()
        try:
            out = pin_memory(data, *args, **kwargs)
        finally:
            local.pinning = False
        self.pins[id(out)] = time.perf_counter() - start
        if len(self.pins) > 1024:  # batches pinned but never handed on (an abandoned iterator)
            self.pins.clear()
        return out


UNKNOWN_PASS = (UNKNOWN, UNKNOWN)
_SUBSET_GETITEMS: Any = None  # torch's Subset.__getitems__, looked up at attach
_ITERATORS: tuple[type, ...] = ()  # DataLoader's iterators, looked up at attach


def _per_sample(dataset: Any, index: Any) -> tuple[Any, Any]:
    """A dataset with a `__getitems__`: what torch fetches sample by sample for `index`, and at
    which indices, under torch's own Subsets (random_split's: their `__getitems__` maps the
    indices, then fetches one by one where the dataset below has no `__getitems__`): the dataset
    below, at the mapped indices. (None, None): a `__getitems__` of the dataset's own, fetched
    whole."""
    fetched = index
    while _SUBSET_GETITEMS is not None and getattr(type(dataset), "__getitems__", None) is _SUBSET_GETITEMS:
        positions = dataset.indices
        fetched = [positions[i] for i in fetched]
        dataset = dataset.dataset
    if getattr(dataset, "__getitems__", None):
        return None, None
    return dataset, fetched


def describe_loader(loader: Any) -> dict[str, Any]:
    """What a DataLoader is, for the report: its dataset, sampler and settings."""
    sampler = loader.batch_sampler if loader.batch_sampler is not None else loader.sampler
    inner = getattr(sampler, "sampler", None)  # a BatchSampler's
    return {
        "dataset": _type_name(loader.dataset),
        "sampler": _type_name(sampler) + (f"({_type_name(inner)})" if inner is not None else ""),
        "batch_size": loader.batch_size if loader.batch_size is not None else getattr(sampler, "batch_size", None),
        "num_workers": loader.num_workers,
        "persistent_workers": bool(loader.persistent_workers),
        "pin_memory": bool(loader.pin_memory),
        "class": _type_name(loader),  # DataLoader, or a subclass (accelerate's DataLoaderShard)
    }


def _type_name(value: Any) -> str:
    """A class's name, with its module unless it is the script's own, a builtin or torch.utils.data's."""
    kind = type(value)
    if kind.__module__ in ("builtins", "__main__") or kind.__module__.startswith("torch.utils.data."):
        return kind.__qualname__
    return f"{kind.__module__}.{kind.__qualname__}"


class IndexQueue:
    """A worker's index queue: what it receives starts a batch (or a new epoch)."""

    def __init__(self, queue: Any, recorder: BatchRecorder) -> None:
        self.queue, self.recorder = queue, recorder
        from torch.utils.data._utils.worker import _ResumeIteration

        self.resume = _ResumeIteration

    def get(self, *args: Any, **kwargs: Any) -> Any:
        r = self.queue.get(*args, **kwargs)
        if isinstance(r, self.resume):
            self.recorder.generation += 1
        return r

    def __getattr__(self, name: str) -> Any:
        return getattr(self.queue, name)


class DataQueue:
    """A worker's data queue: `(idx, batch)` put here is batch idx ready."""

    def __init__(self, queue: Any, recorder: BatchRecorder) -> None:
        self.queue, self.recorder = queue, recorder

    def put(self, item: Any, *args: Any, **kwargs: Any) -> Any:
        built = self.recorder.take_built()
        if built is not None and isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], int):
            self.recorder.write_built(built, self.recorder.generation, item[0], time.time())
        return self.queue.put(item, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.queue, name)


def attach(torch: Any, directory: str, wrap: Callable[[Callable, Callable], Callable]) -> BatchRecorder:
    """Patch torch.utils.data for `recorder`; `wrap(original, around)` is hooks._wrap."""
    from torch.utils.data import dataloader
    from torch.utils.data._utils import fetch, worker
    from torch.utils.data._utils import pin_memory as pinning

    global _SUBSET_GETITEMS, _ITERATORS
    from torch.utils.data import Subset

    _SUBSET_GETITEMS = getattr(Subset, "__getitems__", None)
    _ITERATORS = (dataloader._BaseDataLoaderIter,)
    recorder = BatchRecorder(directory)
    recorder.wrap = wrap
    fetch._MapDatasetFetcher.fetch = _as_method(fetch._MapDatasetFetcher.fetch, recorder.fetch_map)
    fetch._IterableDatasetFetcher.fetch = _as_method(fetch._IterableDatasetFetcher.fetch, recorder.fetch_iterable)
    names = list(inspect.signature(worker._worker_loop).parameters)
    positions = (names.index("index_queue"), names.index("data_queue"), names.index("worker_id"))
    worker._worker_loop = wrap(
        worker._worker_loop, lambda loop, *a, **k: recorder.worker_loop(loop, positions, *a, **k)
    )
    single, multi = dataloader._SingleProcessDataLoaderIter, dataloader._MultiProcessingDataLoaderIter
    single._next_data = wrap(single._next_data, recorder.single_next)
    multi._get_data = wrap(multi._get_data, recorder.get_data)
    multi._process_data = wrap(multi._process_data, recorder.process_data)
    multi._reset = wrap(multi._reset, recorder.reset)
    dataloader.DataLoader.__iter__ = wrap(dataloader.DataLoader.__iter__, recorder.loader_iter)
    pinning.pin_memory = wrap(pinning.pin_memory, recorder.pin)
    os.register_at_fork(after_in_child=recorder.forked)
    atexit.register(recorder.close)
    return recorder


def _as_method(original: Callable, timed: Callable[[Any, Any], Any]) -> Callable:
    def fetch(self: Any, possibly_batched_index: Any) -> Any:
        return timed(self, possibly_batched_index)

    fetch.__wrapped__ = original  # type: ignore[attr-defined]
    fetch.__qualname__ = original.__qualname__
    return fetch
