"""The batch x-ray's pending records in C (injob/_batchpack.c) against the Python class
they stand in for (batches.PyRecords): the same bytes and the same flush decisions for any
sequence of batches and records, and both read back by batchflow as the batches that were added."""

from __future__ import annotations

import copy
import glob
import math
import os
import shutil
import struct
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dlscope.analysis.batchflow import sample_indices
from dlscope.injob import batches
from dlscope.injob.batches import BUILT, KIND_TAKEN, TAKEN, PyRecords

_batchpack = batches._batchpack
needs_c = pytest.mark.skipif(_batchpack is None, reason="the C records are not built here")

u32 = st.integers(0, 2**32 - 1)
seconds = st.floats(1.0, 2e9, allow_nan=False)
# what a sampler may yield: ints (any size: outside int64 is written -1), numpy and bool integers,
# and keys that are not integers at all (-1)
index = st.one_of(
    st.integers(-(2**70), 2**70),
    st.integers(-(2**63), 2**63 - 1).map(np.int64),
    st.booleans(),
    st.text(max_size=3),
    st.floats(allow_nan=False),
)


@st.composite
def batch(draw: st.DrawFn) -> tuple:
    """The arguments of one `built` call."""
    indices = draw(st.lists(index, max_size=80) | st.builds(range, st.integers(0, 1000), st.integers(0, 1100)))
    n = len(indices)
    ends = draw(st.none() | st.lists(seconds, min_size=n, max_size=n))
    taken = draw(
        st.none()
        | st.tuples(
            st.just(TAKEN.size), st.just(KIND_TAKEN), st.integers(-(2**15), 2**15 - 1), u32, u32, u32, u32, u32, u32,
            seconds, seconds, seconds, st.just(math.nan) | st.floats(0.0, 10.0),
        )
    )  # fmt: skip
    # the flag that says the samples were timed set where they were (as write_built sets it)
    flags = draw(st.integers(0, 255)) & ~batches.SAMPLE_TIMES | (batches.SAMPLE_TIMES if ends is not None else 0)
    head = (
        flags, draw(st.integers(-(2**15), 2**15 - 1)), draw(u32), draw(u32), draw(u32),
        draw(seconds), draw(seconds), draw(seconds), draw(seconds),
    )  # fmt: skip
    return (*head, indices, ends, taken)


@st.composite
def batch_here(draw: st.DrawFn) -> tuple:
    """The arguments of one `built_and_taken` call: a Built tuple as the fetchers make it (its ends
    one per sample, or not: a guard), the iterator's [serial, batches taken, loader, pass], then
    worker_id, pid, tid, next_start, next_end and the pin seconds."""
    flags, _, _, _, _, start, fetched, collated, _, indices, ends, _ = draw(batch())
    if ends is not None and draw(st.booleans()):
        ends = ends[:-1] or None if len(ends) > 1 else ends  # (a guard: never from batches.py's fetchers)
    single = [draw(u32), draw(st.integers(0, 2**32 - 2)), draw(u32), draw(u32)]
    return (
        (flags, start, fetched, collated, indices, ends), single, draw(st.integers(-(2**15), 2**15 - 1)), draw(u32),
        draw(u32), draw(seconds), draw(seconds), draw(st.just(math.nan) | st.floats(0.0, 10.0)),
    )  # fmt: skip


@st.composite
def batch_by(draw: st.DrawFn) -> tuple:
    """The arguments of one `built_by` call: a Built tuple, worker_id, generation, idx, tid, ready."""
    built, _, worker_id, generation, idx, ready, _, _ = draw(batch_here())
    return built, worker_id, generation, idx, draw(u32), ready


# a call: a batch built (its fields; a Built tuple, as a worker writes it; one taken here too), a
# record appended (a loader's JSON, a taken record), or the pending taken
call = st.one_of(
    st.tuples(st.just("built"), batch()),
    st.tuples(st.just("built_by"), batch_by()),
    st.tuples(st.just("built_and_taken"), batch_here()),
    st.tuples(st.just("append"), st.tuples(st.binary(max_size=300), seconds)),
    st.tuples(st.just("take"), st.just(())),
)


def written(index: object) -> int:
    """A sample index as the record holds it."""
    try:
        value = int(index.__index__())  # type: ignore[attr-defined]
    except (AttributeError, TypeError):
        return -1
    return value if -(2**63) <= value < 2**63 else -1


def play(records: object, calls: list) -> list:
    """What each call returned, its length after (and an iterator's list, which built_and_taken
    moves on), and the bytes taken at the end."""
    seen = []
    for name, args in copy.deepcopy(calls):
        seen.append((getattr(records, name)(*args), len(records), args))  # type: ignore[arg-type]
    return [*seen, records.take()]  # type: ignore[attr-defined]


@needs_c
@settings(max_examples=300, deadline=None)
@given(st.lists(call, max_size=12), st.integers(1, 4000), st.floats(0.0, 1e9))
def test_c_records_add_the_bytes_and_flush_when_python_does(calls, flush_bytes, flush_seconds):
    assert play(_batchpack.Records(flush_bytes, flush_seconds), calls) == play(
        PyRecords(flush_bytes, flush_seconds), calls
    )


@given(batch())
@settings(max_examples=100, deadline=None)
def test_a_batch_reads_back_as_it_was_added(tmp_path_factory, args):
    flags, worker_id, generation, idx, tid, start, fetched, collated, ready, indices, ends, taken = args
    records = batches.Records(1 << 30, 3600.0)
    assert records.built(*args) is False  # neither limit reached
    record = records.take()
    assert len(records) == 0 and records.take() == b""
    built_length = BUILT.unpack_from(record)[0]
    assert built_length == BUILT.size + 8 * len(indices) * (1 if ends is None else 2)
    assert len(record) == built_length + (TAKEN.size if taken is not None else 0)
    fields = BUILT.unpack_from(record)
    assert fields[1:] == (
        batches.KIND_BUILT, flags, worker_id, generation, idx, len(indices), tid, start, fetched, collated, ready,
    )  # fmt: skip
    if taken is not None:
        tail = TAKEN.unpack_from(record, built_length)
        assert tail[:-1] == taken[:-1]
        assert math.isnan(tail[-1]) if math.isnan(taken[-1]) else tail[-1] == pytest.approx(taken[-1], rel=1e-6)
    path = tmp_path_factory.mktemp("records") / "1.batches"
    path.write_bytes(batches.header() + record)
    assert [(g, b, i.tolist()) for g, b, i in sample_indices(path)] == [
        (generation, idx, [written(i) for i in indices])
    ]


def test_a_flush_is_due_at_its_bytes_or_its_age_and_not_before():
    for records in (batches.Records(100, 0.5), PyRecords(100, 0.5)):
        assert records.append(b"x" * 60, 10.0) is False
        assert records.append(b"y" * 30, 10.4) is False  # 90 bytes, 0.4 s after the oldest
        assert records.append(b"z", 10.5) is True  # 0.5 s after the oldest
        assert records.take() == b"x" * 60 + b"y" * 30 + b"z" and not records
        assert records.append(b"w" * 99, 20.0) is False and records.append(b"v", 20.0) is True  # 100 bytes


@needs_c
def test_the_c_records_refuse_what_python_refuses_and_add_nothing_partly():
    ok = (0, -1, 0, 0, 1, 1.0, 2.0, 3.0, 4.0, [1, 2, 3], None, None)
    for records, out_of_range in (
        (_batchpack.Records(1 << 20, 1.0), OverflowError),
        (PyRecords(1 << 20, 1.0), struct.error),
    ):
        with pytest.raises(ValueError, match="one end time per sample"):
            records.built(*ok[:10], [1.0], None)
        with pytest.raises(out_of_range):
            records.built(0, -1, -5, *ok[3:])  # a generation below 0
        assert len(records) == 0
    with pytest.raises(TypeError, match="13 values"):
        _batchpack.Records(1, 1.0).built(*ok[:11], (1, 2))
    with pytest.raises(TypeError, match="12 arguments"):
        _batchpack.Records(1, 1.0).built(*ok[:11])


@needs_c
def test_an_index_whose_index_method_runs_python_is_read_safely():
    """`__index__` may run Python that changes the list being added: its length is read again at
    each item (a shrunk list's missing items are written -1, no crash)."""
    indices: list = []

    class Shrinking:
        def __index__(self) -> int:
            indices.clear()
            return 7

    indices.extend([Shrinking(), 1, 2])
    records = _batchpack.Records(1 << 20, 1.0)
    records.built(0, -1, 0, 0, os.getpid() % 2**32, 1.0, 2.0, 3.0, 4.0, indices, None, None)
    assert struct.unpack_from("<3q", records.take(), BUILT.size) == (7, -1, -1)


OTHER_PYTHONS = sorted(glob.glob("/root/.pyenv/versions/3.1[2-9]*/bin/python3"))
AGREE = """
import math, random, sys
sys.path[:0] = [sys.argv[1], sys.argv[2]]
import _batchpack
from dlscope.injob.batches import KIND_TAKEN, TAKEN, PyRecords
rng = random.Random(0)
values = [0, 1, -1, 2**30 - 1, 2**30, -(2**30), 2**62, -(2**63), 2**63 - 1, 2**63, 2**70, True, "k", 3.5]
for trial in range(2000):
    indices = [rng.choice(values + [rng.randrange(-10**6, 10**6)]) for _ in range(rng.randrange(70))]
    ends = None if trial % 2 else [rng.random() for _ in indices]
    taken = (TAKEN.size, KIND_TAKEN, -1, 5, 6, 7, 8, 9, 10, 1.0, 2.0, 3.0, math.nan) if trial % 3 else None
    taken_by = []
    for records in (_batchpack.Records(1 << 20, 100.0), PyRecords(1 << 20, 100.0)):
        single = [1, trial, 2, 3]
        records.built(int(bool(ends)), -1, 3, 4, 99, 1.0, 2.0, 3.0, 4.0, indices, ends, taken)
        records.built_and_taken((0, 1.0, 2.0, 3.0, indices, ends), single, -1, 7, 8, 5.0, 6.0, 0.5)
        records.built_by((1, 1.0, 2.0, 3.0, indices, ends), 2, 3, trial, 8, 7.0)
        taken_by.append((records.take(), single))
    assert taken_by[0] == taken_by[1], (trial, indices, ends)
# a worker's data queue, C against PyDataQueue (its recorder's records: PyRecords here)
from dlscope.injob import batches
class Resumed:
    pass
seen = []
makers = (
    lambda q, r: _batchpack.DataQueue(q, r, Resumed, batches.SAMPLE_EVERY),
    lambda q, r: batches.PyDataQueue(q, r, Resumed),
)
for make in makers:
    recorder = batches.BatchRecorder(None)
    recorder.file.pending = PyRecords(1 << 20, 1e9)
    recorder.worker_id, recorder.time_samples, recorder.sample_min_s = 3, True, 1e-6
    got = []
    queue = make(type("Q", (), {"put": lambda self, item: got.append(item)})(), recorder)
    for i in range(40):
        recorder.local.built = (0, 1.0, 1.0 + i * 1e-5, 2.0, list(range(i)), None)
        queue.put((i, "batch"))
        if i % 7 == 0:
            queue.put((Resumed(), None))
    data = bytearray(recorder.file.pending.take())
    at = 0
    while at < len(data):  # each built record's `ready` zeroed: the two clocks are read apart
        size = int.from_bytes(data[at:at + 4], "little")
        data[at + 48:at + 56] = bytes(8)
        at += size
    seen.append((bytes(data), recorder.fetches, recorder.time_samples, recorder.generation, len(got)))
assert seen[0] == seen[1], seen
# a batch's samples stamped in C, read by the records as the list of their times is
stamps = _batchpack.Stamps(3)
for k in range(5):
    stamps.stamp(k)
records = _batchpack.Records(1 << 20, 100.0)
records.built_by((1, 1.0, 2.0, 3.0, list(range(5)), stamps), 2, 3, 4, 8, 7.0)
records.built_by((1, 1.0, 2.0, 3.0, list(range(5)), list(stamps)), 2, 3, 4, 8, 7.0)
data = records.take()
assert data[: len(data) // 2] == data[len(data) // 2 :]
"""


@pytest.mark.skipif(not OTHER_PYTHONS or shutil.which("gcc") is None, reason="no other CPython ≥ 3.12 and gcc here")
@pytest.mark.parametrize("python", OTHER_PYTHONS)
def test_the_c_records_build_and_agree_on_later_pythons(tmp_path, python):
    """Python 3.12 changed how an int is laid out (the GPU machine runs 3.12): the extension builds
    there without a warning and writes what PyRecords writes."""
    asked = "import sysconfig as s; print(s.get_paths()['include'], s.get_config_var('EXT_SUFFIX'))"
    config = subprocess.run([python, "-c", asked], capture_output=True, text=True, check=True).stdout.split()
    source = Path(batches.__file__).with_name("_batchpack.c")
    built = subprocess.run(
        ["gcc", "-O2", "-Wall", "-Werror", "-fPIC", "-shared", f"-I{config[0]}", str(source), "-o",
         str(tmp_path / f"_batchpack{config[1]}")],
        capture_output=True, text=True,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr
    src = Path(batches.__file__).parents[2]
    ran = subprocess.run([python, "-c", AGREE, str(tmp_path), str(src)], capture_output=True, text=True)
    assert ran.returncode == 0, ran.stderr[-2000:]


class Resumed:
    """What torch's worker puts to acknowledge a resumed epoch (its _ResumeIteration)."""


# an item a worker's loop puts: a batch built here (its Built tuple in the thread-local slot), a
# batch whose fetch raised (no Built), a resumed epoch, or what is not a batch at all
put_item = st.one_of(
    st.tuples(st.just("batch"), batch_by(), st.floats(0.0, 1e-3)),
    st.tuples(st.just("failed"), st.integers(0, 2**31), st.just(0.0)),
    st.tuples(st.just("resumed"), st.just(None), st.just(0.0)),
    st.tuples(st.just("other"), st.sampled_from([None, "x", (1, 2, 3), ("idx", 1)]), st.just(0.0)),
)


def play_puts(make: type, items: list, flush_bytes: int) -> tuple[list, list, list]:
    """Each item through a data queue of `make`'s kind: the recorder's state after each put, the
    records taken after each (each built record's `ready`, when it was handed on, read apart), and
    what reached the queue."""
    recorder = batches.BatchRecorder(None)
    recorder.file.pending = batches.Records(flush_bytes, 1e9)
    recorder.worker_id, recorder.time_samples = 7, True  # as worker_loop sets them
    flushes: list[bytes] = []
    recorder.file.flush = lambda: flushes.append(recorder.file.pending.take())
    received: list = []

    class Queue:
        def put(self, item, *args, **kwargs):
            resumed = type(item) is tuple and item and isinstance(item[0], Resumed)
            received.append(((Resumed, item[1]) if resumed else item, args, kwargs))

    queue = make(Queue(), recorder, Resumed, batches.SAMPLE_EVERY)
    states, records = [], []
    for kind, value, min_s in copy.deepcopy(items):
        recorder.sample_min_s = min_s
        if kind == "batch":
            built, _, _, idx, _, _ = value
            recorder.local.built = built
            before = time.time()
            queue.put((idx, "the batch"), timeout=5.0)
            after = time.time()
        elif kind == "failed":
            queue.put((value, "an ExceptionWrapper"))
        elif kind == "resumed":
            queue.put((Resumed(), None))
        else:
            queue.put(value)
        taken = b"".join(flushes) + recorder.file.pending.take()
        flushes.clear()
        ready = ready_times(taken)
        assert all(before <= r <= after for r in ready) and len(ready) == (kind == "batch")
        states.append((recorder.fetches, recorder.time_samples, recorder.generation, recorder.local.built))
        records.append(masked(taken))
    return states, records, received


def ready_times(data: bytes) -> list[float]:
    """The `ready` of each built record in `data`."""
    at, found = 0, []
    while at < len(data):
        (size,) = struct.unpack_from("<I", data, at)
        found.append(BUILT.unpack_from(data, at)[-1])
        at += size
    return found


def masked(data: bytes) -> bytes:
    """`data` with each built record's `ready` zeroed: the two clocks are read at two moments."""
    out, at = bytearray(data), 0
    while at < len(out):
        (size,) = struct.unpack_from("<I", out, at)
        out[at + BUILT.size - 8 : at + BUILT.size] = bytes(8)
        at += size
    return bytes(out)


@needs_c
@settings(max_examples=200, deadline=None)
@given(st.lists(put_item, max_size=40), st.integers(1, 3000))
def test_the_c_data_queue_writes_and_rules_as_python_does(items, flush_bytes):
    """A worker's data queue in C (_batchpack.DataQueue) against its definition (PyDataQueue):
    after every put the same records (their `ready` read within the put), the same rule for the
    next batch, the same epochs counted, and the same items, arguments and keywords passed on."""

    def python(queue, recorder, resume, every):
        return batches.PyDataQueue(queue, recorder, resume)

    assert play_puts(_batchpack.DataQueue, items, flush_bytes) == play_puts(python, items, flush_bytes)


@needs_c
def test_the_c_data_queue_passes_on_the_queues_own_attributes_and_refuses_a_bad_recorder():
    class Queue:
        size = 3

        def put(self, item):
            return ("put", item)

        def close(self):
            return "closed"

    recorder = batches.BatchRecorder(None)
    queue = _batchpack.DataQueue(Queue(), recorder, Resumed, batches.SAMPLE_EVERY)
    assert (queue.size, queue.close(), queue.recorder) == (3, "closed", recorder)
    assert queue.put("not a batch") == ("put", "not a batch")
    with pytest.raises(AttributeError):
        queue.missing  # noqa: B018
    with pytest.raises(AttributeError):  # a recorder has its thread-local slot
        _batchpack.DataQueue(Queue(), object(), Resumed, batches.SAMPLE_EVERY)
    bare = _batchpack.DataQueue.__new__(_batchpack.DataQueue)  # never initialised: refused, not a crash
    with pytest.raises(TypeError):
        bare.put((0, "batch"))
    with pytest.raises(AttributeError):
        bare.size  # noqa: B018
    recorder.local.built = ("not", "a", "built")
    with pytest.raises(TypeError):
        queue.put((0, "batch"))
    assert recorder.local.built is None  # taken all the same: the next batch is not this one's


STAMPS = [pytest.param(batches.PyStamps, id="python")]
if _batchpack is not None:
    STAMPS += [
        pytest.param(lambda n: _batchpack.Stamps(n), id="c-tsc" if _batchpack.TSC_INVARIANT else "c"),
        pytest.param(lambda n: _batchpack.Stamps(n, tsc=False), id="c-monotonic"),
    ]


@pytest.mark.parametrize("make", STAMPS)
def test_a_sample_is_stamped_between_the_clock_reads_around_it(make):
    """Each stamp reads, in time.time()'s seconds, between a clock read just before and one just
    after it (the C ticks mapped to seconds), past the capacity it was made for too."""
    stamps = make(2)
    around, samples = [], [object() for _ in range(5)]
    for sample in samples:
        before = time.time()
        time.sleep(0.0005)
        assert stamps.stamp(sample) is sample
        time.sleep(0.0005)
        around.append((before, time.time()))
    ends = list(stamps)
    assert len(stamps) == len(ends) == 5
    slack = 2e-6  # two clock reads and a linear mapping apart
    for (before, after), end in zip(around, ends, strict=True):
        assert before + 0.0004 - slack <= end <= after - 0.0004 + slack
    assert ends == sorted(ends)


@needs_c
def test_c_stamps_are_read_by_the_records_as_their_times_and_refused_when_short():
    stamps = _batchpack.Stamps(64)
    for i in range(4):
        stamps.stamp(i)
    with pytest.raises(IndexError):
        stamps[4]
    one, two = _batchpack.Records(1 << 20, 100.0), _batchpack.Records(1 << 20, 100.0)
    built = (batches.SAMPLE_TIMES, 1.0, 2.0, 3.0, [5, 6, 7, 8], stamps)
    one.built_by(built, 1, 0, 0, 9, 4.0)
    two.built_by((*built[:5], list(stamps)), 1, 0, 0, 9, 4.0)
    assert one.take() == two.take()
    with pytest.raises(ValueError, match="one end time per sample"):
        one.built(1, 1, 0, 0, 9, 1.0, 2.0, 3.0, 4.0, [5, 6, 7], stamps, None)
    assert len(one) == 0
    with pytest.raises(ValueError):
        _batchpack.Stamps(-1)
