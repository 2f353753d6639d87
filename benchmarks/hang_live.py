"""What the watchdog costs an observed process per step: the one call hooks.py makes at each step
end (`agent.step_ended(count, now)`: a module attribute, then `struct.pack_into` on the mmap'd
live file), next to the same call to an empty function (the call itself, which any hook pays).
The two loops are interleaved round by round and the median per call is reported. The watchdog
thread itself runs in the parent `dlscope run` and reads the files once a second: the job pays
nothing for it.

The built-in job (`dlscope train`/`lab`) heartbeats through a Trainer observer instead
(stages/train.Heartbeat: the observer call, `time.time()`, the same `step_ended`); it is timed beside
an observer that does nothing, which is what one more observer costs the Trainer's dispatch.

Each collective the job launches through torch.distributed (DDP's all-reduces included) passes the
agent's wrapper, which counts it in the live file and writes its launch and completion rows to
`<pid>.collectives` (two `os.write`s): timed on a stand-in collective that completes at once,
with the rows written and with a writer that does nothing.

    python benchmarks/hang_live.py [--calls 200000] [--rounds 7]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

from dlscope.events import TrainingObserver
from dlscope.fit import Heartbeat
from dlscope.injob import hangagent as agent


def per_call_ns(fn: object, calls: int) -> float:
    start = time.perf_counter_ns()
    for i in range(calls):
        fn(i, 1.0)  # type: ignore[operator]
    return (time.perf_counter_ns() - start) / calls


class _Done:
    """A collective's Work whose future has completed: `then` runs the callback at once."""

    def get_future(self) -> _Done:
        return self

    def then(self, callback: object) -> None:
        callback(self)  # type: ignore[operator]


class _NoRows:
    def write(self, *args: object) -> None:
        return None


def collective_ns(agent: object, calls: int, rounds: int) -> dict[str, float]:
    """A stand-in all_reduce wrapped by the agent, per call: with its rows, and with a writer that
    writes nothing (interleaved rounds, medians)."""
    from types import SimpleNamespace

    c10d = SimpleNamespace(all_reduce=lambda *args, **kwargs: _Done())
    agent.attach_c10d(c10d)  # type: ignore[attr-defined]
    writer = agent._rows  # type: ignore[attr-defined]
    times: dict[str, list[float]] = {"rows": [], "no rows": []}
    for _ in range(rounds):
        for name, rows in (("rows", writer), ("no rows", _NoRows())):
            agent._rows = rows  # type: ignore[attr-defined]
            start = time.perf_counter_ns()
            for _ in range(calls):
                c10d.all_reduce(None)
            times[name].append((time.perf_counter_ns() - start) / calls)
    agent._rows = writer  # type: ignore[attr-defined]
    return {name: statistics.median(values) for name, values in times.items()}


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

        class StepCount:  # what Heartbeat reads of the Trainer
            global_step = 0

        trainer, heartbeat, idle = StepCount(), Heartbeat(), TrainingObserver()

        def through_heartbeat(count: int, now: float) -> None:
            heartbeat.on_step_end(trainer, None, 64)  # type: ignore[arg-type]

        def through_idle_observer(count: int, now: float) -> None:
            idle.on_step_end(trainer, None, 64)  # type: ignore[arg-type]

        loops = {
            "live file": through_agent,
            "empty call": through_empty,
            "Heartbeat": through_heartbeat,
            "idle observer": through_idle_observer,
        }
        times: dict[str, list[float]] = {name: [] for name in loops}
        for _ in range(args.rounds):
            for name, loop in loops.items():
                times[name].append(per_call_ns(loop, args.calls))
        rows = collective_ns(agent, args.calls // 10, args.rounds)
    ns = {name: statistics.median(values) for name, values in times.items()}
    live, base = ns["live file"], ns["empty call"]
    print(f"live file step_ended: {live:.0f} ns per step; empty call: {base:.0f} ns; difference {live - base:.0f} ns")
    print(
        f"a collective through the agent: {rows['rows']:.0f} ns with its two rows written; "
        f"{rows['no rows']:.0f} ns without; the rows cost {rows['rows'] - rows['no rows']:.0f} ns a collective"
    )
    beat, idle_ns = ns["Heartbeat"], ns["idle observer"]
    print(
        f"built-in job Heartbeat observer: {beat:.0f} ns per step; idle observer: {idle_ns:.0f} ns; "
        f"difference {beat - idle_ns:.0f} ns"
    )


if __name__ == "__main__":
    main()
