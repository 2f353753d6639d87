"""The operator table from a profile's events (torch.profiler's key averages, or the records a
`dlscope run` process wrote): torch-free, so a run's report never imports torch to read them."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable
from dataclasses import asdict, dataclass

from dlscope.options import OP_SORT_KEYS

# a --sort-by key → the OpRow field it orders by (times are fields in µs)
SORT_KEYS = {key: key if key in ("calls", "flops") else f"{key}_us" for key in OP_SORT_KEYS}


@dataclass
class OpRow:
    """One operator, summed over the active steps (times in µs)."""

    name: str
    calls: int
    self_cpu_us: float
    cpu_total_us: float
    self_device_us: float
    device_total_us: float
    self_cpu_memory_bytes: int
    flops: int

    @property
    def us_per_call(self) -> float:
        return self.cpu_total_us / self.calls if self.calls else 0.0


@dataclass
class TopOpsTable:
    """Operators from a profile, sortable; `top(n)` is the lab's top-10 table."""

    rows: list[OpRow]
    steps: int
    sort_by: str = "self_cpu"
    self_cpu_total_us: float = 0.0
    self_device_total_us: float = 0.0

    def sorted(self, sort_by: str | None = None) -> list[OpRow]:
        key = SORT_KEYS[sort_by or self.sort_by]
        return sorted(self.rows, key=lambda r: getattr(r, key), reverse=True)

    def top(self, n: int = 10, sort_by: str | None = None) -> list[OpRow]:
        return self.sorted(sort_by)[:n]

    def share(self, row: OpRow) -> float:
        return 100.0 * row.self_cpu_us / self.self_cpu_total_us if self.self_cpu_total_us else 0.0

    def to_records(self, n: int | None = None, sort_by: str | None = None) -> list[dict]:
        rows = self.sorted(sort_by) if n is None else self.top(n, sort_by)
        return [
            {**asdict(r), "self_cpu_pct": round(self.share(r), 2), "us_per_call": round(r.us_per_call, 3)} for r in rows
        ]

    def to_csv(self, n: int | None = None, sort_by: str | None = None) -> str:
        records = self.to_records(n, sort_by)
        out = io.StringIO()
        if records:
            writer = csv.DictWriter(out, fieldnames=list(records[0]))
            writer.writeheader()
            writer.writerows(records)
        return out.getvalue()


def is_operator(name: str) -> bool:
    """Framework operators (aten::conv2d …), not annotations, step markers or autograd plumbing."""
    return "::" in name and not name.startswith(("autograd::", "ProfilerStep", "Optimizer."))


def table_from_events(events: Iterable, steps: int, sort_by: str = "self_cpu") -> TopOpsTable:
    events = list(events)
    rows = [
        OpRow(
            name=e.key,
            calls=int(e.count),
            self_cpu_us=float(e.self_cpu_time_total),
            cpu_total_us=float(e.cpu_time_total),
            self_device_us=float(getattr(e, "self_device_time_total", 0.0) or 0.0),
            device_total_us=float(getattr(e, "device_time_total", 0.0) or 0.0),
            self_cpu_memory_bytes=int(e.self_cpu_memory_usage or 0),
            flops=int(e.flops or 0),
        )
        for e in events
        # with CUDA activity the GPU kernels are events too; they are counted in their operator's device time
        if is_operator(e.key) and getattr(getattr(e, "device_type", None), "name", "CPU") == "CPU"
    ]
    return TopOpsTable(
        rows=rows,
        steps=steps,
        sort_by=sort_by,
        self_cpu_total_us=sum(r.self_cpu_us for r in rows),
        self_device_total_us=sum(r.self_device_us for r in rows),
    )
