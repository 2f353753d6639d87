"""What the watchdog costs an observed process per step: the one call hooks.py makes at each step
end (`agent.step_ended(count, now)`: a module attribute, then `struct.pack_into` on the mmap'd
live file), next to the same call to an empty function (the call itself, which any hook pays).
The two loops are interleaved round by round and the median per call is reported. The watchdog
thread itself runs in the parent `dlscope run` and reads the files once a second: the job pays
nothing for it.

    python benchmarks/hang_live.py [--calls 200000] [--rounds 7]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

from dlscope.observe.hang import agent


def per_call_ns(fn: object, calls: int) -> float:
    start = time.perf_counter_ns()
    for i in range(calls):
        fn(i, 1.0)  # type: ignore[operator]
    return (time.perf_counter_ns() - start) / calls


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        agent.install(directory)

        def through_agent(count: int, now: float) -> None:
            agent.step_ended(count, now)  # exactly what hooks.py does

        def empty(count: int, now: float) -> None:
            return None

        def through_empty(count: int, now: float) -> None:
            empty(count, now)

        times: dict[str, list[float]] = {"live file": [], "empty call": []}
        for _ in range(args.rounds):
            times["live file"].append(per_call_ns(through_agent, args.calls))
            times["empty call"].append(per_call_ns(through_empty, args.calls))
    live, base = statistics.median(times["live file"]), statistics.median(times["empty call"])
    print(f"live file step_ended: {live:.0f} ns per step; empty call: {base:.0f} ns; difference {live - base:.0f} ns")


if __name__ == "__main__":
    main()
