"""The data flow batch by batch, inside every process `dlscope run` observes: which worker built
each batch, from which samples, how long each sample's fetch and the collate took, when it was
ready, when the training loop took it and how long the loop waited for it. Stdlib only; attached
to torch by the script hooks (hooks.py) once the script imports torch.

Where it hooks (torch.utils.data, looked up once at attach):
  - the dataset fetchers (`_MapDatasetFetcher.fetch`, `_IterableDatasetFetcher.fetch`): the same
    loop as torch's, timed around `collate_fn`, and in a worker, where samples are timed one by
    one (see WORKER_SAMPLE_TIMING_MIN_S), with one clock read after each sample (map-style
    `__getitem__`, or the iterable's `next`); torch's own `Subset` (random_split's), whose
    `__getitems__` only maps the indices, is fetched as it would fetch, `base[indices[i]]`,
    sample by sample; any other dataset with a `__getitems__` (a batched fetch) is timed whole;
  - the worker loop (`_worker_loop`, the target DataLoader starts its workers with — by name, so a
    spawned worker, which unpickles it, gets the wrapped one too): its data queue is handed on
    wrapped (data_queue: in C where _batchpack.c is built, else PyDataQueue), so a batch is known
    by DataLoader's own number (the send index `idx`) in the `(idx, batch)` the worker puts back,
    and a persistent worker's next epoch by the `_ResumeIteration` it acknowledges there;
  - in the training process, `_MultiProcessingDataLoaderIter._process_data` (each batch handed to
    `__next__`, with its worker) and `_get_data`, `_reset` (persistent workers' epochs); with
    num_workers=0 nothing more: the batch is built inside the iterator's `__next__`, whose hook
    (hooks.loader_next, calling `delivered`) writes it;
  - `pin_memory` (the pin-memory thread's and the single-process path's);
  - `DataLoader.__iter__`: each loader is numbered at its first pass (a "loader" record says what
    it is), each `iter()` of it is one pass (an epoch of a training loader).

Per batch, one binary record in `<pid>.batches`, never one per sample:
"built" where the batch was built (a worker, or the training process with num_workers=0) and
"taken" in the training process (written by hooks.loader_next with the wait; with num_workers=0
both in one write); per DataLoader, one "loader" record in the training process, and at its exit
one "cost". Records are buffered (Records: in C where _batchpack.c is built, else PyRecords) and
written at FLUSH_BYTES or FLUSH_SECONDS after the oldest, when a worker's loop ends, before a
worker waits for indices (IndexQueue) and at exit: a write(2) per batch was half the cost on a
fast dataset; a SIGKILL loses at most FLUSH_SECONDS of batches.

Their layout: dlscope.contract.batchfile.

A batch is joined across processes on (worker pid, generation, idx): DataLoader numbers batches
as it sends them, from 0 at every epoch, and a persistent worker's generation counts the epochs
it was told to resume (`_ResumeIteration`), as the training process counts `_reset`s.
"""

from __future__ import annotations

import atexit
import inspect
import json
import operator
import os
import struct
import threading
import time
from collections.abc import Callable
from queue import Empty
from typing import Any, NamedTuple

from dlscope.contract.batchfile import (
    BUILT,
    ITERABLE,
    KIND_BUILT,
    KIND_COST,
    KIND_LOADER,
    KIND_TAKEN,
    LOADER,
    SAMPLE_TIMES,
    TAKEN,
    UNKNOWN,
    WHOLE,
    header,
)
from dlscope.contract.records import batches_path
from dlscope.injob.stepmachine import native_thread_id

try:  # the pending records in C (_batchpack.c); not built (no C compiler at install): PyRecords
    from dlscope.injob import _batchpack
except ImportError:
    _batchpack = None  # type: ignore[assignment]

NAN = float("nan")
# ~100 batches of 64 samples (~60 with their samples timed one by one); a larger record at once
FLUSH_BYTES, FLUSH_SECONDS = 1 << 16, 0.5
# A sample timed one by one costs a worker ~45 ns in its loop while its caches stay warm, ~35-90
# ns after a file read's system calls (one C call, Stamps.stamp: BENCHMARKS.md). A worker (off
# the loop's critical path while the workers keep ahead) times them where its last batch's
# samples took ≥ 5 µs on average (≤ ~1-2% of a sample), and in one batch in SAMPLE_EVERY, so
# that their distribution is seen. The training process (num_workers=0: every ns is the loop's)
# never does: a batch there costs its record, not a clock read per sample (the rule),
# and its slowest sample is not known.
WORKER_SAMPLE_TIMING_MIN_S, SAMPLE_EVERY = 5e-6, 16


class BatchFile:
    """This process's `<pid>.batches`, opened at its first flush (a forked child opens its own,
    and drops what its parent had pending). Directory None: a scratch file, whose records are
    dropped at each flush (the x-ray's own cost measured without writing)."""

    def __init__(self, directory: str | None) -> None:
        self.directory = directory
        self.fd: int | None = None
        self.pid = 0
        # records not yet written: added without a lock (each Records call is atomic under the
        # GIL; the pin-memory thread never writes, but a user's threads may), taken under one
        self.pending = Records(FLUSH_BYTES, FLUSH_SECONDS)
        self.lock = threading.Lock()

    def write(self, record: bytes, now: float) -> None:
        if self.pending.append(record, now):
            self.flush()

    def flush(self) -> None:
        with self.lock:
            data = self.pending.take()
            if not data or self.directory is None:
                return
            if self.fd is None or self.pid != os.getpid():
                self._open()
            os.write(self.fd, data)  # type: ignore[arg-type]

    def forked(self) -> None:
        self.pending = Records(FLUSH_BYTES, FLUSH_SECONDS)
        self.lock = threading.Lock()
        self.fd = None

    def _open(self) -> None:
        self.pid = os.getpid()
        path = batches_path(self.directory, self.pid)  # type: ignore[arg-type]
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
        if os.fstat(self.fd).st_size == 0:
            os.write(self.fd, header())


class PyRecords:
    """The records not yet written, and whether a flush is due: FLUSH_BYTES of them, or
    FLUSH_SECONDS since the oldest (0: none pending). The definition of _batchpack.Records, which
    does the same in C (tests/test_batchpack.py compares the bytes)."""

    def __init__(self, flush_bytes: int, flush_seconds: float) -> None:
        self.flush_bytes, self.flush_seconds = flush_bytes, flush_seconds
        # appended without a lock, taken under the file's: a record another thread appends while
        # they are joined stays for the next take
        self.parts: list[bytes] = []
        self.used = 0
        self.oldest = 0.0

    def built(
        self,
        flags: int,
        worker_id: int,
        generation: int,
        idx: int,
        tid: int,
        start: float,
        fetched: float,
        collated: float,
        ready: float,
        indices: Any,
        ends: Any,
        taken: tuple | None,
    ) -> bool:
        """A batch's built record added: BUILT, then its `indices` as int64 (-1: one that is not
        an integer in int64's range), then where `ends` is not None (one per sample) its samples'
        end times; then where `taken` is not None (TAKEN's values: the training process took the
        batch in the same call) its taken record. One pack per batch size, cached."""
        n = len(indices)
        if ends is not None and len(ends) != n:
            raise ValueError("built: one end time per sample")
        key = (n, ends is not None, taken is not None)
        pack, length = _SHAPES.get(key) or _shape(key)
        head = (length, KIND_BUILT, flags, worker_id, generation, idx, n, tid, start, fetched, collated, ready)
        try:
            record = pack(*head, *indices, *(ends or ()), *(taken or ()))
        except struct.error:  # a sampler that yields keys, not integers
            record = pack(*head, *map(_sample_index, indices), *(ends or ()), *(taken or ()))
        return self.append(record, ready)

    def built_and_taken(
        self,
        built: tuple,
        single: list,
        worker_id: int,
        pid: int,
        tid: int,
        next_start: float,
        next_end: float,
        pin: float,
    ) -> bool:
        """A batch built and taken in this thread (num_workers=0), one `Built` tuple: its built
        record (this process's `worker_id`) with its taken record (worker -1: no worker's batch),
        both ready and taken when the loader's `__next__` ended; numbered by the iterator's
        `single` ([serial, batches taken, loader, pass]), whose count moves on."""
        flags, start, fetched, collated, indices, ends = _built_fields(built)
        serial, idx, loader, passes = single
        taken = (TAKEN.size, KIND_TAKEN, -1, pid, serial, idx, loader, passes, tid, next_start, next_end, next_end, pin)
        due = self.built(flags, worker_id, serial, idx, tid, start, fetched, collated, next_end, indices, ends, taken)
        single[1] = idx + 1
        return due

    def built_by(self, built: tuple, worker_id: int, generation: int, idx: int, tid: int, ready: float) -> bool:
        """A `Built` tuple's built record: batch idx of `generation`, built by `worker_id` (-1: the
        training process) in thread `tid`, handed on at `ready`."""
        flags, start, fetched, collated, indices, ends = _built_fields(built)
        return self.built(flags, worker_id, generation, idx, tid, start, fetched, collated, ready, indices, ends, None)

    def append(self, record: bytes, now: float) -> bool:
        self.parts.append(record)
        self.used += len(record)
        if not self.oldest:
            self.oldest = now
        return self.used >= self.flush_bytes or now - self.oldest >= self.flush_seconds

    def take(self) -> bytes:
        parts = self.parts
        n = len(parts)
        data = b"".join(parts[:n])
        del parts[:n]
        self.used -= len(data)
        self.oldest = 0.0
        return data

    def __len__(self) -> int:
        return self.used


def _built_fields(built: tuple) -> tuple:
    """A `Built` tuple's fields as written: where its samples' end times are not one per sample
    (never from these fetchers), not timed one by one after all."""
    flags, start, fetched, collated, indices, ends = built
    if ends is not None and len(ends) != len(indices):
        return flags & ~SAMPLE_TIMES, start, fetched, collated, indices, None
    return built


_SHAPES: dict[tuple[int, bool, bool], tuple[Callable[..., bytes], int]] = {}


def _shape(key: tuple[int, bool, bool]) -> tuple[Callable[..., bytes], int]:
    """The pack of a whole built record for `key` = (samples, timed one by one, with its taken
    record), and the built record's length."""
    n, timed, taken = key
    formats = BUILT.format + f"{n}q" + (f"{n}d" if timed else "") + (TAKEN.format[1:] if taken else "")
    _SHAPES[key] = shape = (struct.Struct(formats).pack, BUILT.size + 8 * n * (2 if timed else 1))
    return shape


def _sample_index(value: Any) -> int:
    """A sample index as written: its integer value, -1 where it has none in int64's range."""
    try:
        i = operator.index(value)
    except TypeError:
        return -1
    return i if -(1 << 63) <= i < 1 << 63 else -1


Records = _batchpack.Records if _batchpack is not None else PyRecords


class PyStamps:
    """A batch's samples' end times, noted as a worker fetches them one by one: `stamp(sample)`
    notes the time and returns the sample; read as a sequence of time.time() seconds. The
    definition of _batchpack.Stamps, which notes a tick count in C and maps the ticks to
    time.time()'s seconds when first read (tests/test_batchpack.py holds both to the clock)."""

    def __init__(self, capacity: int) -> None:
        self.ends: list[float] = []

    def stamp(self, sample: Any) -> Any:
        self.ends.append(time.time())
        return sample

    def __len__(self) -> int:
        return len(self.ends)

    def __getitem__(self, i: int) -> float:
        return self.ends[i]


Stamps = _batchpack.Stamps if _batchpack is not None else PyStamps


class Built(NamedTuple):
    """A batch the fetcher just finished in this thread, until it is handed on: to the data queue
    in a worker, to the loop with num_workers=0. The fetchers build plain tuples in this order (a
    NamedTuple's constructor costs several times a tuple's, once a batch)."""

    flags: int
    start: float  # the fetch began
    fetched: float  # the collate began
    collated: float
    indices: Any  # the sampler's, as fetched (a list; a range: an iterable's stream positions)
    ends: Any  # a Stamps (or one end in a list): when each sample ended, where they were timed one by one


class ThreadState(threading.local):
    """Per thread (a user's threads may iterate loaders of their own)."""

    built: tuple | None = None  # a Built, as a plain tuple, not yet handed on
    pin = NAN  # seconds the batch built in this thread took to pin (num_workers=0)
    pinning = False  # inside pin_memory's outermost call


class BatchRecorder:
    """One per process: the fetchers it times, the batches it writes."""

    def __init__(self, directory: str | None) -> None:
        self.file = BatchFile(directory)
        self.local = ThreadState()  # kept for life: the fetchers hold it (cleared in a forked child)
        self.generation = 0  # in a worker: the epochs it was told to resume
        self.worker_id = -1
        self.serial = 0  # in the training process: single-process iterators numbered as they start
        self.pins: dict[int, float] = {}  # id(pinned batch) -> seconds, from the pin-memory thread
        # the next batch's samples are timed one by one: in a worker only (its loop sets it, then
        # samples_timed_next after each batch); the training process times batches, never samples
        self.time_samples = False
        self.sample_min_s = WORKER_SAMPLE_TIMING_MIN_S
        self.pid = os.getpid()  # getpid(2) is a system call: kept, and renewed in a forked child
        self.fetches = 0
        self.loaders = 0  # DataLoaders iterated in this process
        self.batch_size = 0  # the first loader's: the x-ray's own cost is measured at it
        self.on_worker: Callable[[int], None] | None = None  # told the worker id when a worker loop starts

    def forked(self) -> None:
        self.pid = os.getpid()
        self.local.__dict__.clear()  # the forking thread's: no batch of the parent's is this process's
        self.pins.clear()
        self.file.forked()

    # the fetchers: one frame a batch, what they need in closure cells -------------------------
    def map_fetcher(self, original: Callable) -> Callable:
        """`_MapDatasetFetcher.fetch` as torch runs it, timed: the fetch, the collate, and in a
        worker where its rule says so (samples_timed_next) a clock read after each sample."""
        clock, local, recorder, other = time.time, self.local, self, self._map_fetch

        def fetch(fetcher: Any, possibly_batched_index: Any) -> Any:
            start = clock()
            if fetcher.auto_collation and not recorder.time_samples:
                dataset = fetcher.dataset
                if not getattr(dataset, "__getitems__", None):  # most datasets: fetched one by one, as torch does
                    # (map(getitem, …) measured dearer: it loses 3.11's inlined call of a Python __getitem__)
                    data = [dataset[i] for i in possibly_batched_index]
                    done = clock()
                    out = fetcher.collate_fn(data)
                    local.built = (0, start, done, clock(), possibly_batched_index, None)
                    return out
            return other(fetcher, possibly_batched_index, start)

        return _like(fetch, original)

    def _map_fetch(self, fetcher: Any, possibly_batched_index: Any, start: float) -> Any:
        """The map fetcher's other cases: a dataset with a `__getitems__`, samples timed one by
        one, one sample a batch (batch_size=None)."""
        clock = time.time
        dataset = fetcher.dataset
        ends = None
        if fetcher.auto_collation:
            indices = possibly_batched_index
            flags = 0
            base, fetched = dataset, indices
            if getattr(dataset, "__getitems__", None):
                base, fetched = _per_sample(dataset, indices)
            if base is None:  # the dataset's own batched fetch
                flags = WHOLE
                data = dataset.__getitems__(indices)
            elif self.time_samples:
                flags = SAMPLE_TIMES
                ends = Stamps(len(fetched))
                stamp = ends.stamp  # one C call a sample, in the comprehension that keeps 3.11's inlined __getitem__
                data = [stamp(base[i]) for i in fetched]
            else:
                data = [base[i] for i in fetched]
        else:  # one sample a batch: its time is the batch's
            indices = (possibly_batched_index,)
            data = dataset[possibly_batched_index]
            flags, ends = SAMPLE_TIMES, [clock()]
        done = clock()
        out = fetcher.collate_fn(data)
        self.local.built = (flags, start, done, clock(), indices, ends)
        return out

    def iterable_fetcher(self, original: Callable) -> Callable:
        """`_IterableDatasetFetcher.fetch` as torch runs it, timed alike; a sample is known by its
        position in this fetcher's stream."""
        clock, local, recorder = time.time, self.local, self

        def fetch(fetcher: Any, possibly_batched_index: Any) -> Any:
            if fetcher.ended:
                raise StopIteration
            start = clock()
            first = getattr(fetcher, "_dlscope_drawn", 0)
            it = fetcher.dataset_iter
            if fetcher.auto_collation:
                ends = Stamps(len(possibly_batched_index)) if recorder.time_samples else None
                data = []
                for _ in possibly_batched_index:
                    try:
                        sample = next(it)
                    except StopIteration:
                        fetcher.ended = True
                        break
                    data.append(sample if ends is None else ends.stamp(sample))
                if not data or (fetcher.drop_last and len(data) < len(possibly_batched_index)):
                    raise StopIteration
                n = len(data)
            else:
                data = next(it)
                ends, n = [clock()], 1
            fetcher._dlscope_drawn = first + n
            done = clock()
            out = fetcher.collate_fn(data)
            flags = ITERABLE if ends is None else ITERABLE | SAMPLE_TIMES
            local.built = (flags, start, done, clock(), range(first, first + n), ends)
            return out

        return _like(fetch, original)

    def samples_timed_next(self, seconds: float, samples: int) -> bool:
        """A worker's rule, after a batch of `samples` fetched in `seconds`: are the next batch's
        samples timed one by one? Where these took ≥ sample_min_s each on average, and one batch
        in SAMPLE_EVERY."""
        self.fetches += 1
        return seconds >= self.sample_min_s * samples or not self.fetches % SAMPLE_EVERY

    def write_built(self, built: tuple, generation: int, idx: int, ready: float) -> None:
        """The built record of `built` (a Built) built in this thread, batch idx of `generation`,
        handed on at `ready`."""
        if self.file.pending.built_by(built, self.worker_id, generation, idx, native_thread_id(), ready):
            self.file.flush()

    # a worker -------------------------------------------------------------------------------
    def worker_loop(self, loop: Callable, positions: tuple[int, int, int], *args: Any, **kwargs: Any) -> Any:
        """The worker's own loop, run with its index and data queues wrapped."""
        index_at, data_at, worker_at = positions
        args = list(args)
        self.worker_id = int(args[worker_at]) if len(args) > worker_at else int(kwargs.get("worker_id", -1))
        if self.on_worker is not None:
            self.on_worker(self.worker_id)
        self.generation = 0
        self.time_samples = True  # its first batch's samples: then samples_timed_next's rule
        for at, name, proxy in ((index_at, "index_queue", IndexQueue), (data_at, "data_queue", data_queue)):
            if len(args) > at:
                args[at] = proxy(args[at], self)
            else:
                kwargs[name] = proxy(kwargs[name], self)
        try:
            return loop(*args, **kwargs)
        finally:
            self.file.flush()  # a worker leaves through os._exit: no atexit

    # the training process ---------------------------------------------------------------------
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
        """Called by the loader hook after each `__next__` of a DataLoader iterator, which took
        `start` to `end`. With num_workers=0 the batch was built in this `__next__`, in this
        thread: its built and taken records are written here, in one write, once a batch."""
        local = self.local
        built = local.built
        own = iterator.__dict__
        if built is None:  # a worker's batch (or none: the iterator ended)
            taken = own.pop("_dlscope_taken", None)
            if taken is not None:
                worker_id, pid, generation, idx, when, pin = taken
                loader, passes = own.get("_dlscope_pass", UNKNOWN_PASS)
                record = TAKEN.pack(
                    TAKEN.size, KIND_TAKEN, worker_id, pid, generation, idx, loader, passes, native_thread_id(),
                    start, end, when, pin,
                )  # fmt: skip
                self.file.write(record, end)
            return
        local.built = None
        single = own.get("_dlscope_single")  # [serial, batches taken, loader, pass]
        if single is None:  # this iterator's first batch
            self.serial += 1
            single = own["_dlscope_single"] = [self.serial, 0, *own.get("_dlscope_pass", UNKNOWN_PASS)]
        pin = local.pin
        if pin == pin:  # pinned (not NaN)
            local.pin = NAN
        file = self.file
        if file.pending.built_and_taken(built, single, self.worker_id, self.pid, native_thread_id(), start, end, pin):
            file.flush()

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
        if self.loaders:
            from dlscope.injob import batchcost

            try:
                cost = batchcost.measure(BatchRecorder, self.batch_size or 64)
            except Exception as e:  # never fail the job's exit: the report then says it is unmeasured
                cost = {"error": f"{type(e).__name__}: {e}"}
            self.write_json(KIND_COST, 0, cost)
        self.file.flush()

    def pin(self, pin_memory: Callable, data: Any, *args: Any, **kwargs: Any) -> Any:
        """The outermost pin_memory call of a batch (it recurses through the module's own name)."""
        local = self.local
        if local.pinning:
            return pin_memory(data, *args, **kwargs)
        local.pinning = True
        start = time.perf_counter()
        try:
            out = pin_memory(data, *args, **kwargs)
        finally:
            local.pinning = False
        seconds = time.perf_counter() - start
        if local.built is not None:  # num_workers=0: the batch this thread just built, taken next
            local.pin = seconds
            return out
        self.pins[id(out)] = seconds  # the pin-memory thread's: found again by the batch it pinned
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
    """A worker's index queue: before the worker waits for its next batch's indices, the batches
    it built are written. A worker still running at the training process's exit (a loop that
    stopped with its iterator alive, as an endless loader's does) is terminated, and torch's
    SIGTERM handler leaves at once: what it had not written would be lost. A worker waits when it
    is ahead of the loop, so the write costs the loop nothing; one kept busy writes every
    FLUSH_BYTES or FLUSH_SECONDS as before."""

    def __init__(self, queue: Any, recorder: BatchRecorder) -> None:
        self.queue, self.file = queue, recorder.file

    def get(self, *args: Any, **kwargs: Any) -> Any:
        if self.file.pending:
            try:
                return self.queue.get(False)
            except Empty:  # what a multiprocessing queue raises, too
                self.file.flush()
        return self.queue.get(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.queue, name)


class PyDataQueue:
    """A worker's data queue: `(idx, batch)` put here is batch idx ready; `(_ResumeIteration, None)`
    acknowledges a persistent worker's next epoch (its batches are numbered from 0 again). The
    definition of _batchpack.DataQueue, which does the same in C (tests/test_batchpack.py compares
    them)."""

    def __init__(self, queue: Any, recorder: BatchRecorder, resume: type) -> None:
        self.queue, self.recorder, self.resume = queue, recorder, resume  # resume: torch's _ResumeIteration

    def put(self, item: Any, *args: Any, **kwargs: Any) -> Any:
        if type(item) is tuple and len(item) == 2:
            recorder, idx = self.recorder, item[0]
            if type(idx) is int:
                local = recorder.local
                built = local.built
                if built is not None:  # (none: the fetch raised, and an ExceptionWrapper is sent)
                    local.built = None
                    # the worker's rule for its next batch (the training process never times samples)
                    recorder.time_samples = recorder.samples_timed_next(built[2] - built[1], len(built[4]))
                    recorder.write_built(built, recorder.generation, idx, time.time())
            elif isinstance(idx, self.resume):
                recorder.generation += 1
        return self.queue.put(item, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.queue, name)


def data_queue(queue: Any, recorder: BatchRecorder) -> Any:
    """A worker's data queue, wrapped: in C where _batchpack.c is built, else PyDataQueue."""
    from torch.utils.data._utils.worker import _ResumeIteration

    if _batchpack is None:
        return PyDataQueue(queue, recorder, _ResumeIteration)
    return _batchpack.DataQueue(queue, recorder, _ResumeIteration, SAMPLE_EVERY)


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
    fetch._MapDatasetFetcher.fetch = recorder.map_fetcher(fetch._MapDatasetFetcher.fetch)
    fetch._IterableDatasetFetcher.fetch = recorder.iterable_fetcher(fetch._IterableDatasetFetcher.fetch)
    names = list(inspect.signature(worker._worker_loop).parameters)
    positions = (names.index("index_queue"), names.index("data_queue"), names.index("worker_id"))
    worker._worker_loop = wrap(
        worker._worker_loop, lambda loop, *a, **k: recorder.worker_loop(loop, positions, *a, **k)
    )
    multi = dataloader._MultiProcessingDataLoaderIter
    multi._get_data = wrap(multi._get_data, recorder.get_data)
    multi._process_data = wrap(multi._process_data, recorder.process_data)
    multi._reset = wrap(multi._reset, recorder.reset)
    dataloader.DataLoader.__iter__ = wrap(dataloader.DataLoader.__iter__, recorder.loader_iter)
    pinning.pin_memory = wrap(pinning.pin_memory, recorder.pin)
    os.register_at_fork(after_in_child=recorder.forked)
    atexit.register(recorder.close)
    return recorder


def _like(fetch: Callable, original: Callable) -> Callable:
    """A timed fetcher standing in for torch's `original` method."""
    fetch.__wrapped__ = original  # type: ignore[attr-defined]
    fetch.__qualname__ = original.__qualname__
    return fetch
