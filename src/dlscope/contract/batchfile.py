"""The batch x-ray's record file, `<pid>.batches` (dlscope.contract.records names it): written in
every observed process that builds or takes batches (dlscope.injob.batches), read back by
dlscope.analysis.batchflow. Per batch, one binary record, never one per sample:

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
"""

from __future__ import annotations

import json
import struct

BATCHES_MAGIC = b"DLSBATCH"
BATCHES_VERSION = 3  # 3: the taking thread in each taken record
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
# iterated without DataLoader.__iter__), tid (the thread that took it: the loop's, or a
# prefetcher's), next_start, next_end (the loader's __next__), taken (the training process had
# the batch in hand), pin seconds (NaN: not pinned)
TAKEN = struct.Struct("<IBxhIIIIIIdddf")
TAKEN_FIELDS = ("length", "kind", "worker_id", "worker_pid", "generation", "idx", "loader", "pass", "tid")
TAKEN_TIMES = ("next_start", "next_end", "taken", "pin")
LOADER = struct.Struct("<IBxxxI")  # length, kind, loader; then its description as JSON
UNKNOWN = 0xFFFFFFFF


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
