"""Step: the file data flow of a command through the operating system (`dlscope trace`,
`dlscope lab --trace-io`) — per-phase and per-file tables, data-flow diagram, hook-point map.

Not in the lab's default steps: it runs *around* a command (the lab itself, with
--trace-io, see runner.run_traced), so `dlscope lab` without it pays only for phase markers.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from dlscope.distributed.iorank import io_per_rank, rank_pids
from dlscope.options import TraceOptions
from dlscope.rundir import RunDir
from dlscope.stages.base import Context, Step
from dlscope.supervise.iotrace.tracer import measure_overhead, trace_command


def trace(run: RunDir, options: TraceOptions, say: Callable[[str], None]) -> dict[str, Any]:
    out = run.fresh_sub("iotrace")
    outcome = trace_command(options.command, options.backend, out, say=say)
    section = outcome.section
    pids = rank_pids(run.path)  # a torchrun job (--nproc-per-node): its I/O rank by rank
    if pids:
        section["ranks"] = io_per_rank(Path(section["exports"]["events"]), pids)
    section["exports"] = {key: run.rel(path) for key, path in section["exports"].items()}
    outcome.settle()
    if options.measure_overhead and not section["interrupted"]:
        say(f"measuring overhead: untraced and {outcome.backend}-traced runs, interleaved …")
        section["overhead"] = measure_overhead(options.command, outcome.backend, out, options.repeats)
    return section


def run(ctx: Context) -> dict[str, Any]:
    return trace(ctx.run, ctx.steps.iotrace, ctx.say)


STEP = Step("iotrace", run)
