"""TensorFlow's profiler trace (`tf.profiler.experimental`, an XSpace protobuf in
<logdir>/plugins/profile/<run>/<host>.xplane.pb) turned into torch's top-10 operator table.

    XSpace { repeated XPlane planes = 1; }
    XPlane { string name = 2; repeated XLine lines = 3; map<int64, XEventMetadata> event_metadata = 4; }
    XLine  { string name = 2; repeated XEvent events = 4; }                       one per thread
    XEvent { int64 metadata_id = 1; int64 offset_ps = 2; int64 duration_ps = 3; }
    XEventMetadata { int64 id = 1; string name = 2; }

TF names an executed kernel "<node name>:<op type>" (sequential/dense/MatMul:MatMul); other events
are runtime annotations (ExecutorState::Process, ThreadpoolListener::…). An operator's calls and
times are summed per op type, as torch sums per aten:: operator; self time is its duration less the
operators nested inside it on the same thread.
"""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

from dlscope.analysis.optable import OpRow, TopOpsTable
from dlscope.errors import DlscopeError
from dlscope.protowire import FormatError, proto_fields

OP_TYPE = re.compile(r"^_?[A-Z][A-Za-z0-9_]*$")
MAX_TRACE_BYTES = 512 << 20


def op_type(name: str) -> str | None:
    """The op type of a kernel event's name, or None for runtime annotations."""
    if "::" in name or ":" not in name:
        return None
    kind = name.rsplit(":", 1)[1]
    return kind if OP_TYPE.match(kind) else None


def find_trace(logdir: str | Path) -> Path:
    traces = sorted(Path(logdir).glob("plugins/profile/*/*.xplane.pb"))
    if not traces:
        raise DlscopeError("no TensorFlow profiler trace (plugins/profile/*/*.xplane.pb)", logdir)
    return traces[-1]


def table_from_xspace(path: str | Path, steps: int) -> TopOpsTable:
    """Operators of the host CPU plane: calls, self and total time (µs), summed over the trace."""
    path = Path(path)
    if path.stat().st_size > MAX_TRACE_BYTES:
        raise DlscopeError(f"profiler trace over {MAX_TRACE_BYTES:,} bytes", path)
    try:
        rows = _host_ops(path.read_bytes())
    except FormatError as e:
        raise DlscopeError(f"not a TensorFlow profiler trace (XSpace): {e}", path) from None
    return TopOpsTable(rows=rows, steps=steps, self_cpu_total_us=sum(r.self_cpu_us for r in rows))


def _host_ops(raw: bytes) -> list[OpRow]:
    calls: dict[str, int] = defaultdict(int)
    self_ps: dict[str, int] = defaultdict(int)
    total_ps: dict[str, int] = defaultdict(int)
    for number, plane in proto_fields(raw):
        fields = proto_fields(plane) if number == 1 else []
        if not any(n == 2 and v == b"/host:CPU" for n, v in fields):
            continue
        names = {}
        for n, entry in fields:
            if n == 4:
                meta = dict(proto_fields(dict(proto_fields(entry)).get(2, b"")))
                names[meta.get(1, 0)] = op_type(meta.get(2, b"").decode("utf-8", "replace"))
        for n, line in fields:
            if n != 3:
                continue
            events = []
            for k, event in proto_fields(line):
                if k == 4:
                    e = dict(proto_fields(event))
                    kind = names.get(e.get(1, 0))
                    if kind is not None:
                        events.append((e.get(2, 0), e.get(3, 0), kind))
            _add_line(sorted(events, key=lambda e: (e[0], -e[1])), calls, self_ps, total_ps)
    return [OpRow(kind, calls[kind], self_ps[kind] / 1e6, total_ps[kind] / 1e6, 0.0, 0.0, 0, 0) for kind in calls]


def _add_line(
    events: list[tuple[int, int, str]], calls: dict[str, int], self_ps: dict[str, int], total_ps: dict[str, int]
) -> None:
    """One thread's operator events, sorted by start: a stack finds each one's direct children."""
    stack: list[tuple[int, str]] = []  # (end, op type) of the enclosing operators
    for start, duration, kind in events:
        while stack and stack[-1][0] <= start:
            stack.pop()
        if stack:
            self_ps[stack[-1][1]] -= duration
        calls[kind] += 1
        self_ps[kind] += duration
        total_ps[kind] += duration
        stack.append((start + duration, kind))
