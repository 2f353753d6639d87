"""What the observed processes recorded (records.py), turned into results sections: steps,
anatomy, phases, top-10 operators. Facts out (numbers, keys, levels): the words are in
report/sections. No torch import; steps are read as numpy arrays (steptable.py)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from dlscope.analysis import gpu as gpuanalysis
from dlscope.analysis import machine, sharing, steptable
from dlscope.analysis.kineto import recorded_spans
from dlscope.analysis.stepfile import StepFile, read_records, step_files
from dlscope.contract.ioevents import read_events
from dlscope.contract.live import LiveView, read_all
from dlscope.contract.records import PHASE_RECORDS, record_fields
from dlscope.findings import Finding

# TensorFlow's input-pipeline analyser: a step is input-bound when ≥ 20% of it waits for input,
# moderately between 5% and 20%.
INPUT_BOUND_PCT, MODERATELY_PCT = 20.0, 5.0
Records = dict[int, list[dict[str, Any]]]


@dataclass
class Observed:
    """What a run's processes left, each file decoded once and handed to every analyser: the JSON
    records of each process and its step rows (processes/), the syscall events of --trace-io
    (events.jsonl) and the profiler traces the records name. The batch x-ray's records are read by
    batchflow.read_flow in one pass of its own (a second, over the outlier samples' batches only,
    when a sample is far past the median: their every fetch, without holding every sample's)."""

    records: Records
    steps: dict[int, StepFile]
    streams: dict[int, tuple[str | None, np.ndarray]] = field(default_factory=dict)
    directory: Path | None = None
    events: Path | None = None  # a --trace-io run's events.jsonl
    _syscalls: list[dict[str, Any]] | None = None
    _main: tuple[int | None] | None = None
    machine: dict[str, Any] | None = None  # what the supervising process read of the machine (MACHINE_FILE)
    live: dict[int, LiveView] = field(default_factory=dict)  # each process's live file as it left it

    @classmethod
    def read(cls, directory: Path, events: Path | None = None) -> Observed:
        records, steps = read_records(directory), step_files(directory)
        for pid in steps:
            records.setdefault(pid, [])
        machine_read, live = machine.read_machine(directory), {v.pid: v for v in read_all(directory)}
        return cls(records, steps, directory=directory, events=events, machine=machine_read, live=live)

    def syscalls(self) -> list[dict[str, Any]] | None:
        """The --trace-io events, decoded once (the timeline and the batch x-ray both read them)."""
        if self._syscalls is None and self.events is not None:
            self._syscalls = list(read_events(self.events))
        return self._syscalls

    def profile_traces(self) -> list[tuple[Path, list[list[Any]]]]:
        """The profiler traces the processes wrote (a killed process's may be missing), each with the
        training steps its window recorded (its profile record's `recorded`)."""
        profiles = (r for rs in self.records.values() for r in rs if r.get("k") == "profile")
        return [(Path(r["trace"]), r["recorded"]) for r in profiles if Path(r["trace"]).exists()]

    def main(self) -> int | None:
        """The training process (main_process), found once."""
        if self._main is None:
            self._main = (main_process(self),)
        return self._main[0]

    def stream(self, pid: int) -> tuple[str | None, np.ndarray]:
        """The steps that count in process `pid` (steptable.open_stream), opened once."""
        if pid not in self.streams:
            steps = self.steps.get(pid)
            self.streams[pid] = steptable.open_stream(steps) if steps is not None else (None, np.zeros(0))
        return self.streams[pid]

    def last_step(self, pid: int) -> float:
        """When the process's last recorded step ended (0.0: none)."""
        steps = self.steps.get(pid)
        if steps is None or not steps.count:
            return 0.0
        last = np.fromfile(steps.path, steps.dtype, 1, offset=steps.offset + (steps.count - 1) * steps.dtype.itemsize)
        return float(last["start"][0]) + float(last["seconds"][0])


def process_info(pid: int, records: list[dict[str, Any]]) -> dict[str, Any]:
    head = next((r for r in records if r.get("k") == "process"), {})
    # the rank it joined a process group as, else the one its environment gave (torchrun's RANK)
    joined = next((r for r in records if r.get("k") == "rank"), head)
    return {
        "pid": pid,
        "ppid": head.get("ppid"),
        "argv": head.get("argv", []),
        "rank": joined.get("rank"),
        "world_size": joined.get("world_size"),
        "forked": head.get("forked", False),
        # the DataLoader worker id when it is one (a forked child may train: hogwild, A3C)
        "loader_worker": next((r["worker_id"] for r in records if r.get("k") == "loader_worker"), None),
        "clean_exit": any(r.get("k") == "end" for r in records),
        "errors": [f"{r['where']}: {r['error']}" for r in records if r.get("k") == "error"],
        # the error that ended it (injob/tracebacks.py): type, message, file, line, function
        "uncaught": next((record_fields(r) for r in records if r.get("k") == "uncaught"), None),
    }


def main_process(observed: Observed) -> int | None:
    """The process with the most steps (the training loop), ties to the first started."""
    counts = {pid: len(observed.stream(pid)[1]) for pid in observed.records}
    best = max(counts.values(), default=0)
    return min(pid for pid, n in counts.items() if n == best) if best else None


def update_places(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The places of a process's own parameter updates counted as its steps (injob/updates.py):
    its optimizer steps when no torch optimizer stepped; [] otherwise."""
    if any(r.get("k") == "optimizers" for r in records):
        return []
    return next((r["places"] for r in records if r.get("k") == "updates"), [])


def step_source(observed: Observed, pid: int) -> str | None:
    """What ended the process's steps: a torch optimizer's step ("optimizer"), the script's own
    parameter update ("update"), or backward() ("backward"); None: no step."""
    source = observed.stream(pid)[0]
    return "update" if source == "optimizer" and update_places(observed.records.get(pid, [])) else source


def steps_section(observed: Observed, main: int | None, summary: dict[str, Any] | None) -> dict[str, Any]:
    processes = []
    for pid, rs in observed.records.items():
        rank, source, count = process_info(pid, rs)["rank"], step_source(observed, pid), len(observed.stream(pid)[1])
        processes.append({"pid": pid, "rank": rank, "source": source, "count": count})
    section: dict[str, Any] = {"main_pid": main, "source": None, "count": 0, "processes": processes}
    if main is None or summary is None:
        return section
    steps = observed.steps[main]
    section.update(
        source=step_source(observed, main),
        file=str(steps.path),
        row_bytes=steps.dtype.itemsize,
        **{k: v for k, v in summary.items() if k not in ("steady", "all", "profiler", "loader_steps")},
    )
    if section["source"] == "update":
        section["update_places"] = update_places(observed.records[main])
    stepped = [r for r in observed.records[main] if r.get("k") == "optimizers"]
    if stepped and len(stepped[-1]["stepped"]) > 1:
        # back to one that stepped before: in turn (each loop iteration several steps); never: one
        # after another (a sweep's or k-fold's models, each from its first step on)
        section["optimizers_in_turn" if stepped[-1]["returns"] else "optimizers_in_sequence"] = stepped[-1]["stepped"]
    if stepped and stepped[-1].get("scaler_skipped"):
        first = stepped[-1]["scaler_skipped_steps"]
        leading = next((n for n, step in enumerate(first) if step != n), len(first))  # steps 0, 1, … all skipped
        section["scaler_skipped"] = {"count": stepped[-1]["scaler_skipped"], "first_steps": first, "leading": leading}
    moded = [r for r in observed.records[main] if r.get("k") == "eval_mode_steps"]
    if moded:
        section["eval_mode_steps"] = record_fields(moded[-1])
    beside = sharing_of(observed, main)
    if beside is not None:
        section["sharing"] = beside
    own = sharing.threads_of(main, *torch_threads(observed))
    if own is not None:  # its intra-op threads against the cores it may run on: what the summary's change reads
        section["threads"] = own
    censuses = [record_fields(r) for r in observed.records[main] if r.get("k") == "subnormals"]
    if censuses:
        section["subnormals"] = censuses
    return section


def rank_processes(observed: Observed) -> list[dict[str, Any]]:
    """Each process with a rank: its steps, whether it joined a process group, the collectives it
    entered over the run (its live file's count) and the training frameworks it imported
    (analysis/ranks.py, ranks_apart)."""
    out = []
    for pid, rs in observed.records.items():
        info = process_info(pid, rs)
        if info["rank"] is None or info["loader_worker"] is not None:
            continue
        live = observed.live.get(pid)
        out.append(
            {
                "rank": info["rank"],
                "world_size": info["world_size"],
                "steps": len(observed.stream(pid)[1]),
                "joined": any(r.get("k") == "rank" for r in rs),
                "collectives": live.collectives_entered if live is not None else 0,
                "frameworks": sorted({r["name"] for r in rs if r.get("k") == "framework"}),
            }
        )
    return out


def steps_span(observed: Observed) -> tuple[float, float] | None:
    """From the first step's start to the last one's end, over every process that stepped."""
    tables = [t for t in (observed.stream(pid)[1] for pid in observed.records) if len(t)]
    if not tables:
        return None
    return min(float(t["start"][0]) for t in tables), max(float(t["start"][-1] + t["seconds"][-1]) for t in tables)


def machine_of(observed: Observed, main: int | None, beside: dict[str, Any] | None) -> dict[str, Any] | None:
    """The machine's share over the steps (analysis/machine.py), against the intra-op threads of the
    processes that trained at once (`beside`: sharing_of's), else of the training process."""
    threads = beside["threads_total"] if beside else None
    if threads is None and main is not None:
        counted = sharing.threads_of(main, *torch_threads(observed))
        threads = counted["threads"] if counted else None
    return machine.machine_share(observed.machine, steps_span(observed), threads)


def sharing_of(observed: Observed, main: int) -> dict[str, Any] | None:
    """The processes that trained while `main` did (sharing.sharing), from the records."""
    tables = {pid: observed.stream(pid)[1] for pid in observed.records}
    threads, parents = torch_threads(observed)
    return sharing.sharing({pid: t for pid, t in tables.items() if len(t)}, main, threads, parents)


def torch_threads(observed: Observed) -> tuple[dict[int, dict[str, int]], dict[int, int | None]]:
    """Each process's last torch_threads record (its threads and cores), and each one's parent."""
    threads = {  # a later record of a process overwrites its earlier
        pid: {"threads": r["threads"], "cores": r["cores"]}
        for pid, rs in observed.records.items()
        for r in rs
        if r.get("k") == "torch_threads"
    }
    return threads, {pid: process_info(pid, rs)["ppid"] for pid, rs in observed.records.items()}


def classify(input_pct: float) -> str:
    if input_pct >= INPUT_BOUND_PCT:
        return "highly"
    return "moderately" if input_pct >= MODERATELY_PCT else "not"


def anatomy_section(
    section: dict[str, Any],
    summary: dict[str, Any] | None,
    own_us: float | None,
    batches_elsewhere: int = 0,
    gpu: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Mean step anatomy over the steady steps: not the first (start-up, first batch), not the
    profiler's warm-up and active steps (their recording cost is reported with the top-10), not
    the steps a subnormal census ran in (`census_steps`: how many).
    dlscope's own calibrated cost per step (`own_us`) is taken out of the step and out of
    "other" before any share is computed. The verdict is facts: a key, a level, its numbers.
    `batches_elsewhere`: DataLoader batches the process drew in a thread other than the steps'
    (a prefetching thread): no wait of the loop's, never its data.
    `gpu`: the GPU clock's anatomy (gpuanalysis.anatomy) of a script that trains on CUDA: its
    shares are the anatomy's (the host's clock puts the GPU's time wherever the script next
    waits for it), the host's kept beside them (`host_percent`)."""
    if summary is None or not summary["count"]:
        return {"steps_used": 0, "verdict": {"key": "no_steps"}}
    used, sums = "steady", summary["steady"]
    if not sums["count"]:
        used, sums = "all", summary["all"]
    count = sums["count"]
    step_s = sums["seconds"] / count
    mean_s = {p: v / count for p, v in sums["parts_seconds"].items()}
    own_s = min((own_us or 0.0) / 1e6, step_s)
    mean_s["other"] = max(mean_s["other"] - own_s, 0.0)
    observed_s = step_s - own_s
    pct = {p: 100.0 * v / observed_s if observed_s > 0 else 0.0 for p, v in mean_s.items()}
    host_pct, clock, loader = pct, "host", bool(summary["loader_steps"])
    if gpu and gpu.get("steps_used"):
        clock, count, loader = "gpu", gpu["steps_used"], gpu["data_source"] == "loader"
        step_s = gpu["step_ms"] / 1e3
        mean_s = {p: v / 1e3 for p, v in gpu["mean_ms"].items()}
        pct = dict(gpu["percent"])
    numbers = {"step_ms": round(step_s * 1e3, 3), "steps": count, "clock": clock}
    if loader:
        level = classify(pct["data"])
        verdict = {
            "key": "input_bound",
            "level": level,
            **numbers,
            "data_pct": round(pct["data"], 2),
            "data_ms": round(mean_s["data"] * 1e3, 3),
            "thresholds_pct": {"highly": INPUT_BOUND_PCT, "moderately": MODERATELY_PCT},
            "loader_steps": summary["loader_steps"],
            "batches_elsewhere": batches_elsewhere,
        }
    else:
        verdict = {
            "key": "no_data_source",
            **numbers,
            "gap_pct": round(pct["gap"], 2),
            "gap_ms": round(mean_s["gap"] * 1e3, 3),
            "gap_holds_update": section["source"] == "backward",
            "batches_elsewhere": batches_elsewhere,
        }
    return {
        "steps_used": count,
        "used": used,
        "census_steps": summary["census_steps"] if used == "steady" else 0,
        "clock": clock,
        "mean_ms": {p: round(v * 1e3, 4) for p, v in mean_s.items()},
        "step_ms": round(step_s * 1e3, 4),
        "dlscope_us_per_step": own_us,
        "percent": {p: round(v, 2) for p, v in pct.items()},
        **({"host_percent": {p: round(v, 2) for p, v in host_pct.items()}} if clock == "gpu" else {}),
        "data_source": "loader" if loader else "none",
        "verdict": verdict,
        "peak_rss_bytes": summary["peak_rss_bytes"],
        "peak_cuda_bytes": summary["peak_cuda_bytes"],
    }


def phase_slices(pid: int, records: list[dict[str, Any]], origin: float, last_step: float = 0.0) -> list[dict]:
    """Begin/end records paired into slices; a phase a kill left open ends at the last record
    (or the end of the last step, `last_step`)."""
    last = max(last_step, max((r.get("ts", 0.0) for r in records), default=origin))
    slices, open_ = [], []
    for r in records:
        if r.get("k") == "B":
            open_.append(r)
        elif r.get("k") == "E" and open_:
            begin = open_.pop()
            slices.append(_slice(pid, begin, r["ts"], origin, len(open_), closed=True, files=r.get("files")))
            if r.get("train_mode"):  # an evaluation found afterwards: training forwards, no backward
                slices[-1]["train_mode"] = True
    while open_:
        slices.append(_slice(pid, open_.pop(), last, origin, len(open_), closed=False))
    return sorted(slices, key=lambda s: (s["start_s"], s["depth"]))


def _slice(
    pid: int, begin: dict[str, Any], end: float, origin: float, depth: int, closed: bool, files: list[str] | None = None
) -> dict[str, Any]:
    """`files`: on a checkpoint phase's end, every file written inside it (a trainer's save)."""
    return {
        "pid": pid,
        "tid": begin.get("tid", pid),
        "phase": begin["name"],
        "start_s": round(begin["ts"] - origin, 6),
        "seconds": round(end - begin["ts"], 6),
        "depth": depth,
        "file": begin.get("file"),
        "files": files or ([begin["file"]] if begin.get("file") else []),
        "closed": closed,
        "begin_ts": begin["ts"],
        "end_ts": end,
    }


PHASE_ROWS = 100  # phase rows kept in results.json per process and phase name (the totals count every one)


def phases_section(observed: Observed, origin: float, steps: int) -> dict[str, Any]:
    """Each phase name's count, seconds and files, and each phase as a row (the first PHASE_ROWS
    of a name in a process); `steps`: the main process's, to tell a phase that recurs every step."""
    rows: list[dict[str, Any]] = []
    totals: dict[str, dict[str, Any]] = {}
    folded: dict[str, int] = {}
    left_out = train_mode = 0

    def add(name: str, count: int, seconds: float, files: list[str]) -> None:
        t = totals.setdefault(name, {"phase": name, "count": 0, "seconds": 0.0, "files": []})
        t["count"] += count
        t["seconds"] = round(t["seconds"] + seconds, 6)
        t["files"] += [f for f in files if f not in t["files"]]

    for pid, records in observed.records.items():
        kept: dict[str, int] = {}
        for s in phase_slices(pid, records, origin, observed.last_step(pid)):
            add(s["phase"], 1, s["seconds"], s["files"])
            train_mode += bool(s.get("train_mode"))
            kept[s["phase"]] = kept.get(s["phase"], 0) + 1
            if kept[s["phase"]] <= PHASE_ROWS:
                rows.append(s)
            else:
                left_out += 1
        for record in records:  # the phases counted past the machine's PHASE_RECORDS, not written
            if record.get("k") != "phases_folded":
                continue
            for name, f in record["phases"].items():
                add(name, f["count"], f["seconds"], f["files"])
                train_mode += f["train_mode"]
                folded[name] = folded.get(name, 0) + f["count"]
    section: dict[str, Any] = {"rows": rows, "totals": list(totals.values()), "steps": steps}
    if left_out:
        section["rows_left_out"] = left_out
    if folded:
        section["folded"] = folded
        section["records_per_phase"] = PHASE_RECORDS
    if train_mode:
        section["evals_in_train_mode"] = train_mode
    grad = sum(r["forwards"] for rs in observed.records.values() for r in rs if r.get("k") == "eval_grad")
    if grad:
        section["eval_grad_forwards"] = grad
    return section


def ops_per_step(trace_path: Path, recorded: list[list[Any]]) -> list[dict[str, Any]]:
    """Operators (cpu_op slices) inside each training step the window recorded (its profile
    record's `recorded`), by the step's number."""
    document = json.loads(trace_path.read_text())
    events = document.get("traceEvents", [])
    ops = np.sort(np.array([e["ts"] for e in events if e.get("ph") == "X" and e.get("cat") == "cpu_op"], np.float64))
    spans = recorded_spans(document, recorded)
    return [
        {"step": step[0], "ops": int(np.searchsorted(ops, end, "right") - np.searchsorted(ops, start, "left"))}
        for step, (_, start, end) in zip(recorded, spans, strict=True)
    ]


BETWEEN_ROWS = 5  # operators shown of what ran inside a window between its steps
LIFECYCLE_PHASES = ("startup", "first_batch", "train_steps")  # the phases the others nest in


def profile_window(pid: int, record: dict[str, Any], sort_by: str, rows: int = 10) -> dict[str, Any]:
    """One profiler window as a process recorded it: how it was started, its step range, its
    top operators (those of the training steps it recorded), and the operators of what else ran
    while it recorded (`between`: an evaluation, a checkpoint)."""
    from dlscope.analysis.optable import table_from_events

    recorded = record["recorded"]
    active = len(recorded)
    table = table_from_events([SimpleNamespace(**op) for op in record["ops"]], active, sort_by)
    between = table_from_events([SimpleNamespace(**op) for op in record["between_ops"]], active, sort_by)
    steps = record.get("steps")
    return {
        "pid": pid,
        "trigger": record.get("trigger") or "schedule",
        "request": record.get("request"),
        "first_step": steps[0] if steps else None,
        "last_step": steps[1] if steps else None,
        "active_steps": active,
        "rows": table.to_records(rows, sort_by),
        "operators": len(table.rows),
        "self_cpu_total_us": round(table.self_cpu_total_us, 3),
        "export_seconds": record["export_seconds"],
        "trace": record["trace"],
        "recorded": recorded,
        "cut": record.get("cut"),
        "stopped": record.get("stopped"),
        **(
            {
                "between": {
                    "rows": between.to_records(BETWEEN_ROWS, sort_by),
                    "operators": len(between.rows),
                    "calls": sum(r.calls for r in between.rows),
                    "self_cpu_total_us": round(between.self_cpu_total_us, 3),
                }
            }
            if between.rows
            else {}
        ),
    }


def between_phases(window: dict[str, Any], slices: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The phases (an evaluation, a checkpoint) of the window's process that ran between two of
    the steps it recorded, or after its last while it recorded (the script ended): each with the
    step it followed."""
    recorded = window["recorded"]
    if not recorded:
        return []
    ends = [end for _, _, _, end in recorded]
    found = []
    for s in slices:
        if not recorded[0][2] <= s["begin_ts"] < window["stopped"] or s["phase"] in LIFECYCLE_PHASES:
            continue
        after = int(np.searchsorted(ends, s["begin_ts"], "right")) - 1
        if after >= 0 and (after + 1 == len(recorded) or s["end_ts"] <= recorded[after + 1][2]):
            found.append({"phase": s["phase"], "after_step": recorded[after][0], "seconds": s["seconds"]})
    return found


NEIGHBOURS = 50  # unprofiled steps either side of a window: what its active steps are compared with


def window_cost(table: np.ndarray, codes: dict[str, list[str | None]], first: int, last: int) -> dict[str, Any]:
    """A window's active steps (median) against the unprofiled steps around it: the job as it ran
    then, so a window taken on demand after the job slowed down is not called the profiler's cost."""
    index = np.asarray(table["i"])
    at, end = int(np.searchsorted(index, first)), int(np.searchsorted(index, last, side="right"))
    plain = np.flatnonzero(np.asarray(table["profiled"]) == codes["profiled"].index(None))
    plain = plain[plain >= 1]  # not the first step (start-up)
    around = np.concatenate([plain[plain < at][-NEIGHBOURS:], plain[plain >= end][:NEIGHBOURS]])
    seconds = np.asarray(table["seconds"], np.float64)
    active, before = seconds[at:end], seconds[around]
    return {
        "active_step_ms": round(float(np.median(active)) * 1e3, 3) if len(active) else None,
        "unprofiled_step_ms": round(float(np.median(before)) * 1e3, 3) if len(before) else None,
        "unprofiled_steps": len(before),
    }


def top10_section(
    records: Records,
    steps: dict[str, Any],
    profiler: dict[str, Any] | None,
    sort_by: str,
    stream: tuple[np.ndarray, dict[str, list[str | None]]] | None = None,
) -> dict:
    """The main process's first window in full (the scheduled one, or the first taken on demand),
    its cost against the steps before it (`stream`: the main process's steps and their codes), and
    every window of every process with its step range (`windows`)."""
    main = steps["main_pid"]
    windows = [
        profile_window(pid, r, sort_by) for pid, rs in sorted(records.items()) for r in rs if r.get("k") == "profile"
    ]
    # a window that recorded no operator is none (the process ended in its warm-up: stopped at exit)
    windows = [w for w in windows if w["operators"]]
    first = next((w for w in windows if w["pid"] == main), None) if main else None
    if first is None or profiler is None:
        head = next((r for r in records.get(main, []) if r.get("k") == "process"), {}) if main else {}
        schedule = head.get("profile") or [0, 0, 0, 0]  # start_after, wait, warmup, active
        needed = max(schedule[0], 1) + sum(schedule[1:])  # steps until the scheduled window has ended
        if not steps["count"]:
            why = "no_steps"
        elif not schedule[3]:
            why = "off"
        elif head.get("forked"):
            why = "forked"
        elif steps["count"] < needed:
            why = "too_few"
        else:
            why = "unfinished"
        return {
            "rows": [],
            "why_empty": why,
            "steps": steps["count"],
            "needed": needed,
            "pid": main,
            "windows": windows,
        }
    if "between" in first:
        slices = phase_slices(main, records.get(main, []), 0.0)
        first["between"]["phases"] = between_phases(first, slices)
    cost = {**profiler, "export_seconds": first["export_seconds"]}
    if stream is not None and first["first_step"] is not None:
        cost.update(window_cost(*stream, first["first_step"], first["last_step"]))
    if cost["active_step_ms"] and cost["unprofiled_step_ms"]:
        cost["ratio"] = round(cost["active_step_ms"] / cost["unprofiled_step_ms"], 3)
    trace = Path(first["trace"])
    return {
        **{k: first[k] for k in ("pid", "active_steps", "rows", "operators", "self_cpu_total_us", "trigger")},
        **({"between": first["between"]} if "between" in first else {}),
        "sort_by": sort_by,
        "ops_per_step": ops_per_step(trace, first["recorded"]) if trace.exists() else [],
        "profiled_cost": cost,
        "trace": str(trace),
        "windows": windows,
    }


def run_section(records: Records, main: int | None, steps_seen: int) -> dict[str, Any]:
    """The processes, and whether anything was observed: `steps_seen` 0 is a failure of
    observation (`torch_attached` says whether the hooks ever reached torch)."""
    processes = [process_info(pid, rs) for pid, rs in sorted(records.items())]
    sizes = [p["world_size"] for p in processes if p["world_size"] is not None]
    attached = [r["torch_attached"] for rs in records.values() for r in rs if r.get("k") == "observed"]
    return {
        "processes": processes,
        "main_pid": main,
        "world_size": max(sizes, default=None),
        "ranks": sorted(p["rank"] for p in processes if p["rank"] is not None),
        "hook_errors": [e for p in processes for e in p["errors"]],
        # the errors that ended processes, the first raised first (a rank's error, then the others'
        # failing collectives, then the launcher's)
        "uncaught": sorted(
            ({"pid": p["pid"], "rank": p["rank"], **p["uncaught"]} for p in processes if p["uncaught"]),
            key=lambda e: (e.get("ts", 0.0), e["pid"]),
        ),
        "steps_seen": steps_seen,
        "torch_attached": any(attached) if attached else None,
    }


def batches_elsewhere(records: list[dict[str, Any]]) -> int:
    """DataLoader batches this process drew in a thread other than its steps'."""
    return sum(r.get("batches_elsewhere", 0) for r in records if r.get("k") == "observed")


def own_cost_us(records: list[dict[str, Any]]) -> float | None:
    """dlscope's own cost per step in this process, as it calibrated it at attach."""
    found = next((r for r in records if r.get("k") == "calibration"), None)
    return found["per_step_us"] if found else None


def unsteady_steps(table: np.ndarray, codes: dict[str, list[str | None]], census: np.ndarray) -> np.ndarray:
    """The indices of the steps the anatomy leaves out (steptable.steady_steps)."""
    steady = steptable.steady_steps(table, np.arange(len(table)), codes, census)
    return np.asarray(table["i"])[~steady]


def gpu_clock(gpu: dict[str, Any] | None) -> dict[str, Any] | None:
    """The GPU clock's anatomy, unless it failed part-way (the host's clock is then the anatomy's)."""
    return gpu["anatomy"] if gpu is not None and not gpu.get("error") else None


def eval_spans(observed: Observed, origin: float) -> list[tuple[float, float]]:
    """(begin, end) of the training process's evaluation phases."""
    main = observed.main()
    if main is None:
        return []
    slices = phase_slices(main, observed.records.get(main, []), origin)
    return [(s["begin_ts"], s["end_ts"]) for s in slices if s["phase"] == "eval"]


def sections(observed: Observed, origin: float, sort_by: str = "self_cpu") -> dict[str, dict[str, Any]]:
    main = observed.main()
    summary = gpu = None
    if main is not None:
        table, codes = observed.stream(main)[1], observed.steps[main].codes
        census = steptable.census_steps([r for r in observed.records.get(main, []) if r.get("k") == "subnormals"])
        summary = steptable.summarise(table, origin, codes, census)
        gpu = gpuanalysis.gpu_section(observed.records.get(main, []), unsteady_steps(table, codes, census))
    steps = steps_section(observed, main, summary)
    own = own_cost_us(observed.records.get(main, [])) if main is not None else None
    main_records = observed.records.get(main, [])
    found = {
        "run": run_section(observed.records, main, steps["count"]),
        "steps": steps,
        "anatomy": anatomy_section(steps, summary, own, batches_elsewhere(main_records), gpu_clock(gpu)),
        "top10": top10_section(
            observed.records,
            steps,
            summary["profiler"] if summary else None,
            sort_by,
            (observed.stream(main)[1], observed.steps[main].codes) if main is not None else None,
        ),
        "phases": phases_section(observed, origin, steps["count"]),
    }
    if gpu is not None:
        found["gpu"] = gpu
    share = machine_of(observed, main, steps.get("sharing"))
    if share is not None:
        found["run"]["machine"] = share
    shared = machine.qualifier(share)
    if shared is not None:  # every verdict that rests on the steps' times says on what machine they ran
        found["run"]["findings"] = [Finding("machine.shared", "warn", share).to_json()]
        steps["machine_shared"] = found["anatomy"]["machine_shared"] = shared
    return found
