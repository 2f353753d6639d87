"""One rank's Kineto trace (as torch.profiler's export_chrome_trace writes it) read into the
interval sets the analysis needs. What torch 2.13 writes for DDP on gloo (checked on real traces):
  - `distributedInfo` {backend, rank, world_size} at the top level;
  - `ProfilerStep#N` user annotations on the training thread, one per profiled step;
  - `c10d::allreduce_` cpu ops on that thread when DDP's reducer launches a bucket from an
    autograd hook (Input Dims: the flat bucket), and the work itself as `gloo:all_reduce`
    annotations on gloo's own `pt_gloo_runloop` threads (Input Dims and Input type);
  - no `record_param_comms` on gloo/CPU (NCCL emits it, with `In msg nelems` and `dtype`);
  - `enumerate(DataLoader)#…__next__` annotations around each batch fetch;
  - `torch::autograd::AccumulateGrad` ops whose input is each parameter's gradient.
On CUDA, NCCL's work is `ncclKernel_*` / `ncclDevKernel_*` kernels on the GPU streams.
"""

from __future__ import annotations

import gzip
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dlscope.analysis.intervals import Intervals, merge
from dlscope.errors import DlscopeError

# record_shapes' C type names, and record_param_comms' ScalarType names (Float, …), by element size
NAMES_BY_SIZE = {
    1: ("Byte", "Char", "Bool", "signed char", "unsigned char", "bool"),
    2: ("Half", "BFloat16", "c10::Half", "c10::BFloat16"),
    4: ("Float", "Int", "float", "int"),
    8: ("Double", "Long", "double", "long int"),
}
DTYPE_BYTES = {name: size for size, names in NAMES_BY_SIZE.items() for name in names}
NCCL_KERNELS = ("ncclKernel", "ncclDevKernel")
DATA_WAIT = "enumerate(DataLoader)"


@dataclass
class Collective:
    """One collective as its rank enqueued it (µs on the rank's wall clock)."""

    name: str
    start: float
    end: float
    bytes: int | None
    done: float | None = None  # when its work completed on this rank: gloo's work item, NCCL's kernel


@dataclass
class RankTrace:
    rank: int
    world_size: int | None
    backend: str | None
    path: Path
    steps: list[tuple[int, float, float]]  # (N of ProfilerStep#N, start, end)
    compute: Intervals  # CPU operators that are not communication, on any thread
    comm: Intervals  # CPU communication: c10d ops, gloo work items, nccl annotations
    data: Intervals  # DataLoader fetches
    gpu_compute: Intervals = field(default_factory=list)
    gpu_comm: Intervals = field(default_factory=list)
    collectives: list[Collective] = field(default_factory=list)
    grad_bytes: int | None = None


def is_comm(name: str) -> bool:
    return name.startswith(("c10d::", "gloo:", "nccl:", *NCCL_KERNELS)) or name == "record_param_comms"


def load_events(path: Path) -> dict[str, Any]:
    try:
        raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
        document = json.loads(raw)
    except OSError as e:
        raise DlscopeError(f"cannot read the trace: {e.strerror}", path) from None
    except (ValueError, EOFError) as e:  # JSON, UTF-8 and gzip errors alike
        raise DlscopeError(f"not a Kineto JSON trace ({e})", path) from None
    if not isinstance(document, dict) or not isinstance(document.get("traceEvents"), list):
        raise DlscopeError("not a Kineto JSON trace (no traceEvents list)", path)
    return document


def element_bytes(dtype: Any) -> int | None:
    return DTYPE_BYTES.get(str(dtype))


def numel(dims: Any) -> int:
    """Elements of a tensor's dims, or of a TensorList's list of dims."""
    if isinstance(dims, list) and dims and all(isinstance(d, list) for d in dims):
        return sum(numel(d) for d in dims)
    return math.prod(dims) if isinstance(dims, list) else 0


def recorded_spans(document: dict[str, Any], recorded: list[list[Any]]) -> list[tuple[int, float, float]]:
    """The training steps a `dlscope run` window recorded (its profile record's `recorded`: [index,
    N of the step's ProfilerStep#N, start, end], CLOCK_REALTIME s) as (N, start, end) in the
    trace's own µs. Not torch's ProfilerStep#N marks: a mark runs from one `prof.step()` to the
    next, and so holds whatever ran between two steps (an evaluation, a checkpoint, a loader's
    `iter()`); a mark that holds no recorded step (the step a script ended in) is none."""
    shift = int(document.get("baseTimeNanoseconds") or 0) / 1e3  # ts is µs after it when present
    return [(int(n), start * 1e6 - shift, end * 1e6 - shift) for _, n, start, end in recorded]


def read_rank(path: Path, rank: int, recorded: list[list[Any]] | None = None) -> RankTrace:
    """`rank` is the caller's; a trace that names another rank in distributedInfo is refused.
    `recorded`: the training steps dlscope recorded in the trace (recorded_spans), else its
    ProfilerStep#N marks are the steps."""
    document = load_events(path)
    info = document.get("distributedInfo") or {}
    if info.get("rank") is not None and info["rank"] != rank:
        raise DlscopeError(f"the trace is rank {info['rank']}'s, given as rank {rank}'s", path)
    shift = int(document.get("baseTimeNanoseconds") or 0) / 1e3  # ts is µs after it when present
    slices = []
    for e in document["traceEvents"]:
        if e.get("ph") != "X" or not isinstance(e.get("ts"), int | float) or not isinstance(e.get("dur"), int | float):
            continue
        slices.append({**e, "ts": e["ts"] + shift, "end": e["ts"] + shift + e["dur"]})
    if recorded is not None:
        steps = [(n, start + shift, end + shift) for n, start, end in recorded_spans(document, recorded)]
        if not steps:
            raise DlscopeError("the profiler's window recorded no whole training step", path)
    else:
        profiler_steps = [e for e in slices if str(e.get("name", "")).startswith("ProfilerStep#")]
        if not profiler_steps:
            raise DlscopeError("no ProfilerStep#N slice: profile with a schedule and call prof.step() per step", path)
        steps = sorted((int(e["name"].split("#", 1)[1]), e["ts"], e["end"]) for e in profiler_steps)
    cpu = [e for e in slices if e.get("cat") in ("cpu_op", "user_annotation") and not e["name"].startswith("Profiler")]
    gpu = [e for e in slices if e.get("cat") == "kernel"]  # as HTA: memcpy and memset are neither
    comm_ops = [e for e in cpu if is_comm(e["name"])]
    trace = RankTrace(
        rank=rank,
        world_size=info.get("world_size"),
        backend=info.get("backend"),
        path=path,
        steps=steps,
        compute=merge((e["ts"], e["end"]) for e in cpu if e.get("cat") == "cpu_op" and not is_comm(e["name"])),
        comm=merge((e["ts"], e["end"]) for e in comm_ops),
        data=merge((e["ts"], e["end"]) for e in cpu if e["name"].startswith(DATA_WAIT)),
        gpu_compute=merge((e["ts"], e["end"]) for e in gpu if not is_comm(e["name"])),
        gpu_comm=merge((e["ts"], e["end"]) for e in gpu if is_comm(e["name"])),
    )
    trace.grad_bytes, grad_element = _grad_bytes(cpu, steps[0])
    trace.collectives = _collectives(comm_ops, _work_item_bytes(comm_ops), grad_element, steps)
    work = [e for e in comm_ops if e["name"].startswith("gloo:")] + [e for e in gpu if is_comm(e["name"])]
    _completed(trace.collectives, sorted((e["ts"], e["end"]) for e in work))
    return trace


def _completed(collectives: list[Collective], work: list[tuple[float, float]]) -> None:
    """Each launch's work (gloo's work item on its own thread, or the NCCL kernel): the first not yet
    taken that starts after it — a rank runs its collectives in the order it launches them."""
    k = 0
    for c in collectives:
        while k < len(work) and work[k][0] < c.start:
            k += 1
        if k == len(work):
            return
        c.done = work[k][1]
        k += 1


def _work_item_bytes(comm_ops: list[dict[str, Any]]) -> dict[int, int]:
    """Element size by element count, from what names a dtype: gloo's work items, record_param_comms."""
    sizes = {}
    for e in comm_ops:
        args = e.get("args", {})
        if e["name"].startswith("gloo:"):
            types = args.get("Input type") or [None]
            n, size = numel(args.get("Input Dims") or []), element_bytes(types[0])
        elif e["name"] == "record_param_comms":
            n, size = int(args.get("In msg nelems") or 0), element_bytes(args.get("dtype"))
        else:
            continue
        if size:
            sizes[n] = size
    return sizes


def _grad_bytes(cpu: list[dict[str, Any]], step: tuple[int, float, float]) -> tuple[int | None, int | None]:
    """Bytes of the gradients accumulated in one step (each AccumulateGrad's input is a gradient),
    and the element size of the first."""
    _, start, end = step
    total, first = 0, None
    for e in cpu:
        if e["name"] == "torch::autograd::AccumulateGrad" and start <= e["ts"] <= end:
            args = e.get("args", {})
            dims, types = args.get("Input Dims") or [[]], args.get("Input type") or [None]
            size = element_bytes(types[0])
            if size is None:
                return None, None
            total += numel(dims[0]) * size
            first = first or size
    return (total, first) if first else (None, None)


def _collectives(
    comm_ops: list[dict[str, Any]],
    sizes: dict[int, int],
    grad_element: int | None,
    steps: list[tuple[int, float, float]],
) -> list[Collective]:
    """The collectives as the rank enqueued them: c10d ops (record_param_comms where no c10d op is
    recorded), in start order, only inside profiled steps. A c10d op names no dtype: the size of the
    gloo work item with as many elements, else the gradients' (DDP's buckets hold gradients)."""
    launched = [e for e in comm_ops if e["name"].startswith("c10d::")]
    if not launched:
        launched = [e for e in comm_ops if e["name"] == "record_param_comms"]
    launched = _outermost(launched)
    spans = [(s, e) for _, s, e in steps]
    out = []
    for e in sorted(launched, key=lambda e: e["ts"]):
        if not any(s <= e["ts"] <= end for s, end in spans):
            continue
        args = e.get("args", {})
        if e["name"] == "record_param_comms":
            n, size = int(args.get("In msg nelems") or 0), element_bytes(args.get("dtype"))
            name = str(args.get("Collective name") or e["name"])
        else:
            n = numel((args.get("Input Dims") or [[]])[0])
            size = sizes.get(n) or grad_element
            name = e["name"]
        out.append(Collective(name, e["ts"], e["end"], n * size if size else None))
    return out


def _outermost(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Drop events nested in another of the list on the same thread (record_param_comms inside c10d ops)."""
    out: list[dict[str, Any]] = []
    for e in sorted(events, key=lambda e: (e["tid"], e["ts"], -e["end"])):
        if out and out[-1]["tid"] == e["tid"] and e["end"] <= out[-1]["end"]:
            continue
        out.append(e)
    return out
