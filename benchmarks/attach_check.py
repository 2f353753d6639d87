"""What `dlscope attach` costs a job that is never attached to: the profiler's step-end call
(`LateProfiler.after_step`, which now also looks for a request at most once a second) next to the
call as it was before on-demand windows existed (return at once: no window to come). Both loops
take `time.time()` per step, as the step machine hands it; they are interleaved round by round
and the median per call is reported. Also the once-a-second look itself (`take_request` with no
request waiting: an open(2) that fails).

    python benchmarks/attach_check.py [--calls 200000] [--rounds 7]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from typing import Any

from dlscope.contract.requests import take_request
from dlscope.injob.hooks import LateProfiler
from dlscope.injob.recorder import RecordFile


class NoWindowToCome:
    """The step-end call before on-demand windows: the scheduled window is over, nothing else runs."""

    done = True

    def after_step(self, index: int, now: float) -> tuple[None, None]:
        if self.done:
            return None, None
        raise AssertionError


def per_call_ns(profiler: Any, calls: int) -> float:
    clock = time.time
    start = time.perf_counter_ns()
    for i in range(calls):
        profiler.after_step(i, clock())
    return (time.perf_counter_ns() - start) / calls


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        records = RecordFile(directory)
        attachable = LateProfiler(records, 1, 0, 0, 0)  # `run --profile-steps 0`: only the request look
        before, now = [], []
        for _ in range(args.rounds):
            before.append(per_call_ns(NoWindowToCome(), args.calls))
            now.append(per_call_ns(attachable, args.calls))
        looks = 20_000
        start = time.perf_counter_ns()
        for _ in range(looks):
            take_request(directory, os.getpid())
        look_us = (time.perf_counter_ns() - start) / looks / 1e3
        os.close(records.fd)
    added = statistics.median(n - b for b, n in zip(before, now, strict=True))
    print(f"step-end call, before: {statistics.median(before):.0f} ns", end="; ")
    print(f"with the request look: {statistics.median(now):.0f} ns")
    print(f"added per step: {added:+.0f} ns (median of {args.rounds} interleaved rounds)")
    print(f"the look itself, once a second: {look_us:.1f} µs")


if __name__ == "__main__":
    main()
