"""Peak memory of a stretch of work: one method, used by every step that reports memory.

On CUDA: `torch.cuda.max_memory_allocated` over the stretch, minus what was allocated before it.
On the CPU there is no allocator counter, so every allocation and free the profiler records
(`profile_memory=True`) is replayed in time order and the running sum's maximum is the peak —
at allocation granularity, so nothing allocated beforehand is missed or double-counted. Memory
libraries allocate outside torch's allocator (oneDNN scratch space) is seen by neither.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch._C._profiler import _EventType
from torch.profiler import ProfilerActivity, profile

from dlscope.measure.native_stderr import quiet_native_stderr

SOURCE = {"cuda": "torch.cuda.max_memory_allocated", "cpu": "profiler allocation events (profile_memory)"}


def profile_allocation_peak(prof: profile) -> int:
    """Peak bytes above the starting level, from a profile taken with profile_memory=True."""
    # allocation events (size, negative for a free) live in the event tree, not in prof.events()
    sizes = []
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        event = stack.pop()
        if event.typed[0] == _EventType.Allocation:
            sizes.append((event.start_time_ns, event.typed[1].alloc_size))
        stack.extend(event.children)
    running = peak = 0
    for _, size in sorted(sizes):
        running += size
        peak = max(peak, running)
    return peak


@contextlib.contextmanager
def allocation_peak(device: torch.device) -> Iterator[dict[str, int]]:
    """Yield a dict that holds `peak_bytes` once the block exits."""
    result: dict[str, int] = {}
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        yield result
        torch.cuda.synchronize(device)
        result["peak_bytes"] = torch.cuda.max_memory_allocated(device) - before
        return
    with quiet_native_stderr(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        yield result
    result["peak_bytes"] = profile_allocation_peak(prof)
