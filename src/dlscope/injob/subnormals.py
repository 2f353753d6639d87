"""Steps that slow down for good, and whether subnormal floats are why: inside the training
process, torch-free until a census starts.

A CPU computes with subnormal floats (|x| below the dtype's smallest normal, 1.2e-38 in float32)
in microcode unless flush-to-zero is set: a matmul with a subnormal input ran ~170× slower here
(BENCHMARKS.md). Nothing in a step's anatomy says why its steps need more CPU; the values say.

`SlowdownWatch` is called at the step machine's between-steps work (at most every
MEMORY_INTERVAL_S, or at each step end for steps longer than that): it keeps the process's CPU
time a step over each interval, and the lowest rolling median of WINDOW intervals since the first
WARMUP_STEPS steps. When the rolling median reaches SLOWER × that lowest one, the next step runs
under a `Census`: a dispatch mode that counts, for every operator the step runs, the float values
of its CPU outputs (up to SAMPLED of each, evenly spaced) and how many of them are subnormal
(views and uninitialised outputs skipped). One record `{"k": "subnormals", ...}` per census; at
most CENSUSES a process, GAP_S apart. No census where it cannot see the step's operators as they
run: torch.compile (its graphs), a process using CUDA (a GPU computes subnormals at full speed;
its CPU side is not the step's arithmetic).

A census step is slower than the others (a Python call an operator, and a sample of each output
counted); the record says which step it was, and the report says so.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections import deque
from collections.abc import Callable
from typing import Any

WARMUP_STEPS = 12  # the first steps (allocations, the profiler's window) set no reference
WINDOW = 5  # intervals in a rolling median
# a census when the rolling median CPU a step reaches this × the lowest one: steps that wait
# (a sleep, a busier machine) come back to cold caches and woken threads, and took 2.5× the CPU
SLOWER = 4.0
CENSUSES, GAP_S = 3, 30.0
OPS_KEPT = 8  # operators named in a record, most subnormal values first
MODE_ABOVE = "mode_above"  # the census's error where another dispatch mode was entered above it
SAMPLED = 1 << 16  # values of an output counted at most (evenly spaced): a census step stays near a step's cost


class Census:
    """Counts, per operator, the float values its CPU outputs held and how many were subnormal:
    a TorchDispatchMode (made by `census_mode`, which subclasses torch's class at first use)."""

    def __init__(self, torch: Any) -> None:
        self.torch = torch
        self.floats = {torch.float32: torch.finfo(torch.float32).tiny, torch.float64: torch.finfo(torch.float64).tiny}
        self.ops: dict[str, list[int]] = {}  # name -> [calls, values made, values sampled, subnormal of those]
        self.off = False  # counting stopped (an error, or the mode left on another's stack)
        self.error: str | None = None

    def count(self, func: Any, out: Any) -> None:
        if self.off:
            return
        try:
            name = func.overloadpacket.__name__
            returns = func._schema.returns
            if "empty" in name or (
                returns and returns[0].alias_info is not None and not returns[0].alias_info.is_write
            ):
                return  # uninitialised memory, or a view: its values are counted where they were made
            tensors = out if isinstance(out, tuple | list) else (out,)
            torch, values, sampled, subnormal = self.torch, 0, 0, 0
            for t in tensors:
                if type(t) is not torch.Tensor or t.layout != torch.strided or t.device.type != "cpu":
                    continue
                tiny = self.floats.get(t.dtype)
                n = t.numel()
                if tiny is None or not n:
                    continue
                flat = t.detach().reshape(-1)
                if n > SAMPLED:  # evenly spaced values: the share, at a bounded cost a step
                    flat = flat[:: -(-n // SAMPLED)]
                magnitude = flat.abs()
                subnormal += int(torch.count_nonzero((magnitude < tiny) & (magnitude > 0)))
                values += n
                sampled += flat.numel()
            if values:
                entry = self.ops.setdefault(f"aten::{name}", [0, 0, 0, 0])
                entry[0] += 1
                entry[1] += values
                entry[2] += sampled
                entry[3] += subnormal
        except Exception as e:  # never fail the user's step: the record says the census stopped
            self.off, self.error = True, f"{type(e).__name__}: {e}"

    def summary(self) -> dict[str, Any]:
        ops = sorted(self.ops.items(), key=lambda kv: (-kv[1][3] / kv[1][2] * kv[1][1], -kv[1][1]))
        return {
            "values": sum(v[1] for v in self.ops.values()),
            "sampled": sum(v[2] for v in self.ops.values()),
            "subnormal": sum(v[3] for v in self.ops.values()),
            "ops": [
                {"op": name, "calls": c, "values": v, "sampled": n, "subnormal": sub}
                for name, (c, v, n, sub) in ops[:OPS_KEPT]
            ],
            "ops_counted": len(ops),
            **({"error": self.error} if self.error else {}),
        }


_MODE_CLASS: Any = None


def census_mode(torch: Any) -> Any:
    """A new census as a TorchDispatchMode (the class made once, from torch's)."""
    global _MODE_CLASS
    if _MODE_CLASS is None:
        from torch.utils._python_dispatch import TorchDispatchMode

        class CensusMode(TorchDispatchMode):  # type: ignore[misc, valid-type]
            def __init__(self, census: Census) -> None:
                super().__init__()
                self.census = census

            def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
                out = func(*args, **(kwargs or {}))
                self.census.count(func, out)  # (the mode is off its stack in here: no recursion)
                return out

        _MODE_CLASS = CensusMode
    return _MODE_CLASS(Census(torch))


class SlowdownWatch:
    """The step machine's between-steps callback in the training process: True asks to be called
    again at the next primary step end (a census is running). A step's cost is the process's CPU
    time a step (all its threads): a machine that gets busier stretches the steps' wall time, not
    their CPU time, and is no reason for a census; subnormal floats cost CPU."""

    def __init__(self, torch: Any, write: Callable[[dict[str, Any]], None]) -> None:
        self.torch, self.write = torch, write
        self.last: tuple[int, float, float] | None = None  # step index, wall, CPU seconds
        self.recent: deque[tuple[float, float]] = deque(maxlen=WINDOW)  # (CPU, wall) seconds a step
        self.lowest = (float("inf"), float("inf"))  # the rolling medians where the CPU one was lowest
        self.censuses = 0
        self.next_allowed = 0.0
        self.running: tuple[Any, int, float, tuple[float, float], tuple[float, float]] | None = None

    def __call__(self, index: int, now: float) -> bool:
        if self.running is not None:
            self._finish(index, now)
            return False
        cpu = time.process_time()
        last, self.last = self.last, (index, now, cpu)
        if last is None or index <= last[0] or index < WARMUP_STEPS:
            return False
        steps = index - last[0]
        self.recent.append(((cpu - last[2]) / steps, (now - last[1]) / steps))
        if len(self.recent) < WINDOW:
            return False
        medians = (statistics.median(r[0] for r in self.recent), statistics.median(r[1] for r in self.recent))
        if medians[0] < self.lowest[0]:
            self.lowest = medians
            return False
        if medians[0] < SLOWER * self.lowest[0] or self.censuses >= CENSUSES or now < self.next_allowed:
            return False
        if not self._eligible():
            self.censuses = CENSUSES  # it will not become so
            return False
        mode = census_mode(self.torch)
        mode.__enter__()
        self.running = (mode, index + 1, time.time(), self.lowest, medians)
        return True

    def forked(self) -> SlowdownWatch:
        """In a child forked during a census step (a DataLoader's workers started by that step's
        iter()): the child inherits the forking thread's dispatch modes, so the census would count
        every operator of the child for its life. It leaves the child's stack; the child gets a
        watch of its own."""
        if self.running is not None:
            from torch.utils._python_dispatch import _get_current_dispatch_mode

            mode = self.running[0]
            mode.census.off = True
            if _get_current_dispatch_mode() is mode:
                mode.__exit__(None, None, None)
        return SlowdownWatch(self.torch, self.write)

    def _eligible(self) -> bool:
        torch = self.torch
        dynamo = sys.modules.get("torch._dynamo.utils")
        compiled = dynamo is not None and dynamo.counters["stats"].get("unique_graphs", 0) > 0
        return not compiled and not torch.cuda.is_initialized() and hasattr(torch.utils, "_python_dispatch")

    def _finish(self, index: int, now: float) -> None:
        mode, step, start, lowest, medians = self.running  # type: ignore[misc]
        self.running = None
        self.censuses += 1
        self.next_allowed = now + GAP_S
        from torch.utils._python_dispatch import _get_current_dispatch_mode

        if _get_current_dispatch_mode() is mode:
            mode.__exit__(None, None, None)
        else:  # another mode entered above it, still on: ours stays, counting nothing
            mode.census.off = True
            mode.census.error = mode.census.error or MODE_ABOVE
        self.recent.clear()  # the census step's own time is no step's
        self.last = (index, time.time(), time.process_time())
        self.write(
            {
                "k": "subnormals",
                "step": step,
                "steps": index + 1 - step,
                "census_ms": round((now - start) * 1e3, 3),
                "lowest_cpu_ms": round(lowest[0] * 1e3, 3),
                "lowest_ms": round(lowest[1] * 1e3, 3),
                "slowed_cpu_ms": round(medians[0] * 1e3, 3),
                "slowed_ms": round(medians[1] * 1e3, 3),
                **mode.census.summary(),
            }
        )
