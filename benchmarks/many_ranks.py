"""`dlscope merge` at scale: N ranks' records written with dlscope's own writers, as each host's
`dlscope run` leaves them, then merged and analysed by `dlscope merge` in a process of its own,
whose wall time and peak RSS are printed with what it found against what was planted.

Each rank is a process of its own (forked, so its records carry its own pid) that writes with
dlscope.injob.recorder: its process and rank records (host, torchrun's view), STEPS steps
(RecordFile.write_step) and two collectives a step, launched and done (CollectiveFile.write, DDP's
two buckets). Planted: every host's clock off by a known amount (host 0 the reference; the
others uniform in ±50 ms), and one straggler rank that launches each collective LATE ms after the
others (whose all-reduces then end LATE later: they wait). Ranks launch with 0.3 ms of noise, and
complete with 0.1 ms. Printed: the merge's time and peak RSS, the straggler found and its cost a
step, and the largest error of a recovered clock offset (the goal: within 1 ms).

    python benchmarks/many_ranks.py --ranks 1024 [--steps 10000] [--per-host 8] [--threads 2]
    python benchmarks/many_ranks.py --ranks 2 --hta     # HolisticTraceAnalysis loading the same ranks

--hta writes the same steps and collectives as the Kineto traces torch's profiler writes (a
ProfilerStep#N a step, c10d::allreduce_ launches, gloo's work items) and loads them with
HolisticTraceAnalysis in a process of its own (its parser's worker processes counted in its RSS).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from dlscope.contract.records import COLLECTIVE_EVENTS, COLLECTIVE_OPS
from dlscope.injob.recorder import CollectiveFile, RecordFile
from dlscope.rundir import RunDir, processes_dir

STEP_S = 0.100  # a step
LAUNCH_S = (0.050, 0.060)  # the two buckets' launches after the step's start
DONE_S = 0.030  # a bucket's all-reduce after the last launch
LAUNCH_NOISE_S, DONE_NOISE_S = 0.0003, 0.0001
T0 = 1.8e9


def plan(ranks: int, per_host: int, seed: int) -> tuple[list[float], int]:
    """Each host's planted clock offset (s) and the straggler's rank (on the last host but one)."""
    rng = np.random.default_rng(seed)
    hosts = -(-ranks // per_host)
    offsets = [0.0, *rng.uniform(-0.05, 0.05, hosts - 1).tolist()]
    return offsets, max(ranks - per_host - 2, ranks // 2)


def write_rank(
    directory: Path,
    rank: int,
    ranks: int,
    per_host: int,
    steps: int,
    offset: float,
    late: float,
    straggler: bool,
    seed: int,
    traced: bool = False,
) -> None:
    """This process (a fork: its own pid) writes one rank's records as the job's rank would.
    `traced`: its collectives in a profiler trace of every step instead of its collectives file
    (as a rank of an older dlscope, which merge reads the trace of)."""
    rng = np.random.default_rng(seed + rank)
    host = rank // per_host
    records = RecordFile(str(directory))
    launcher = {"run_id": "many-ranks", "node": host, "nodes": -(-ranks // per_host), "local_rank": rank % per_host}
    launcher.update(master="host0:29500", restart=0)
    head = {"k": "process", "pid": os.getpid(), "ppid": os.getppid(), "argv": ["train.py"], "rank": rank}
    head.update(world_size=ranks, host=f"host{host}", launcher=launcher, clocks={"realtime": int(T0 * 1e9)})
    records.write(head)
    records.write({"k": "rank", "rank": rank, "world_size": ranks})
    starts = T0 + np.arange(steps) * STEP_S + offset
    lateness = late if straggler else 0.0
    launch = starts[:, None] + np.array(LAUNCH_S) + lateness + rng.normal(0, LAUNCH_NOISE_S, (steps, 2))
    done = starts[:, None] + LAUNCH_S[1] + late + DONE_S + rng.normal(0, DONE_NOISE_S, (steps, 2))
    write_step = records.write_step
    backward = 0.045 + late - lateness  # the others wait for the straggler inside backward
    profiled = "active" if traced else None
    for i in range(steps):
        start = float(starts[i])
        end = start + STEP_S - 0.002 + late
        profiler_step = i if traced else None
        write_step(
            i, "optimizer", start, end, 0.004, "loader", 0.03, backward, 0.01, 1, 1, None, None, profiled, profiler_step
        )
    records.close_steps()
    if traced:
        trace = directory / f"profile-{os.getpid()}.json"
        kineto(trace, rank, ranks, steps, late, straggler, offset)
        records.write({"k": "profile", "trace": str(trace), "ops": []})
        return
    collectives = CollectiveFile(str(directory))
    all_reduce, launched, finished = (
        COLLECTIVE_OPS.index("all_reduce"),
        *map(COLLECTIVE_EVENTS.index, ("launch", "done")),
    )
    for i in range(steps):
        for k in range(2):
            seq = 2 * i + k + 1
            collectives.write(seq, i, launched, all_reduce, float(launch[i, k]))
            collectives.write(seq, i, finished, all_reduce, float(done[i, k]))
    collectives.close()


def write_job(
    root: Path, ranks: int, per_host: int, steps: int, late: float, seed: int, traced: bool = False
) -> tuple[list[Path], list[float], int]:
    """Each host's run directory of the planted job; the planted offsets and straggler."""
    offsets, straggler = plan(ranks, per_host, seed)
    hosts = []
    for host, offset in enumerate(offsets):
        run = RunDir(root / f"host{host}", "run", argv=["run", "--", "torchrun", "train.py"])
        directory = processes_dir(run.path)
        directory.mkdir()
        for rank in range(host * per_host, min((host + 1) * per_host, ranks)):
            pid = os.fork()
            if pid == 0:
                try:
                    straggling = rank == straggler
                    write_rank(directory, rank, ranks, per_host, steps, offset, late, straggling, seed, traced)
                finally:
                    os._exit(0)
            os.waitpid(pid, 0)
        run.finish("ok")
        run.release()
        hosts.append(run.path)
    return hosts, offsets, straggler


def merged(hosts: list[Path], out: Path, threads: int) -> tuple[float, float, float, dict]:
    """`dlscope merge` in a process of its own: its wall time and CPU time (s), its peak RSS (MiB),
    its section."""
    argv = [
        sys.executable,
        "-m",
        "dlscope.cli",
        "merge",
        *map(str, hosts),
        "--out",
        str(out),
        "--threads",
        str(threads),
    ]
    start = time.perf_counter()
    child = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - start
    if status != 0:
        raise SystemExit(f"dlscope merge failed: {child.stderr.read().decode()[-2000:]}")
    section = json.loads((out / "results.json").read_text())["sections"]["merge"]
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, section


def kineto(path: Path, rank: int, ranks: int, steps: int, late: float, straggler: bool, offset: float) -> None:
    """The same steps and collectives as torch's profiler writes them for DDP on gloo."""
    pid = tid = 1000 + rank
    lateness = late if straggler else 0.0
    events = [{"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": "python"}}]
    for i in range(steps):
        start = (T0 + i * STEP_S + offset) * 1e6
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{i}", "pid": pid, "tid": tid,
                       "ts": start, "dur": (STEP_S - 0.002 + late) * 1e6, "args": {}})  # fmt: skip
        for k, at in enumerate(LAUNCH_S):
            launch = start + (at + lateness) * 1e6
            events.append({"ph": "X", "cat": "cpu_op", "name": "c10d::allreduce_", "pid": pid, "tid": tid,
                           "ts": launch, "dur": 50, "args": {"Input Dims": [[[295626]]]}})  # fmt: skip
            work = (LAUNCH_S[1] + late + DONE_S - at - lateness) * 1e6 - 60  # until the all-reduce ends
            events.append({"ph": "X", "cat": "user_annotation", "name": "gloo:all_reduce", "pid": pid,
                           "tid": tid + 1 + k, "ts": launch + 60, "dur": work,
                           "args": {"Input Dims": [[295626]], "Input type": ["float"]}})  # fmt: skip
    document = {"schemaVersion": 1, "distributedInfo": {"backend": "gloo", "rank": rank, "world_size": ranks},
                "deviceProperties": [], "traceEvents": events}  # fmt: skip
    path.write_text(json.dumps(document))


HTA_LOAD = "from hta.trace_analysis import TraceAnalysis; import sys; TraceAnalysis(trace_dir=sys.argv[1])"


def hta_loaded(directory: Path, timeout: float) -> tuple[float | None, float]:
    """HolisticTraceAnalysis loading the traces in `directory`: its wall time (None: past `timeout`)
    and the peak of its process tree's summed RSS (MiB), sampled every 50 ms."""
    import psutil

    start = time.perf_counter()
    child = subprocess.Popen(
        [sys.executable, "-c", HTA_LOAD, str(directory)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    process, peak = psutil.Process(child.pid), 0
    while child.poll() is None:
        with contextlib.suppress(psutil.Error):  # a worker gone between listing and reading
            peak = max(peak, sum(p.memory_info().rss for p in [process, *process.children(recursive=True)]))
        if time.perf_counter() - start > timeout:
            for p in [*process.children(recursive=True), process]:
                p.kill()
            child.wait()
            return None, peak / 2**20
        time.sleep(0.05)
    return time.perf_counter() - start, peak / 2**20


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--per-host", type=int, default=8)
    parser.add_argument("--late-ms", type=float, default=20.0)
    parser.add_argument("--threads", type=int, default=2, help="dlscope merge --threads (the target: 2 cores)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--hta", action="store_true", help="HolisticTraceAnalysis on the same ranks instead")
    parser.add_argument("--hta-timeout", type=float, default=1200.0)
    parser.add_argument(
        "--dir", default=None, help="where to write and keep the job (default: a temporary one); a job there is reused"
    )
    args = parser.parse_args()
    root = Path(args.dir or tempfile.mkdtemp(prefix="many-ranks-"))
    late = args.late_ms / 1e3
    try:
        if args.hta:
            offsets, straggler = plan(args.ranks, args.per_host, args.seed)
            traces = root / "traces"
            traces.mkdir(parents=True)
            for rank in range(args.ranks):
                offset = offsets[rank // args.per_host]
                kineto(traces / f"rank{rank}.json", rank, args.ranks, args.steps, late, rank == straggler, offset)
            size = sum(p.stat().st_size for p in traces.iterdir()) / 2**20
            wall, peak = hta_loaded(traces, args.hta_timeout)
            said = f"{wall:.1f} s" if wall is not None else f"not loaded in {args.hta_timeout:.0f} s"
            print(f"HTA: {args.ranks} ranks x {args.steps} steps ({size:.0f} MiB of traces): {said}")
            print(f"  peak RSS {peak:.0f} MiB (its process and its parser's workers)")
            return
        start = time.perf_counter()
        if args.dir and (root / "host0" / "results.json").is_file():  # written by an earlier run: merged again
            offsets, straggler = plan(args.ranks, args.per_host, args.seed)
            hosts = [root / f"host{h}" for h in range(len(offsets))]
            shutil.rmtree(root / "merged", ignore_errors=True)
        else:
            hosts, offsets, straggler = write_job(root, args.ranks, args.per_host, args.steps, late, args.seed)
        written = time.perf_counter() - start
        wall, cpu, rss, section = merged(hosts, root / "merged", args.threads)
        found = section["collectives"]["straggler"] or {}
        recovered = section["offsets"]
        errors = [
            abs(recovered[f"host{h}"]["ms"] - 1e3 * (o - offsets[0]))
            for h, o in enumerate(offsets)
            if f"host{h}" in recovered
        ]
        rows = args.ranks * args.steps
        print(
            f"{args.ranks} ranks x {args.steps} steps: {rows:,} step rows, {2 * rows:,} collectives, {len(hosts)} hosts"
        )
        print(f"  written in {written:.1f} s")
        print(f"dlscope merge --threads {args.threads}: {wall:.1f} s wall, {cpu:.1f} s CPU, peak RSS {rss:.0f} MiB")
        print(f"  of which {section['write_seconds']:.1f} s wall reading the records and writing Parquet")
        print(f"straggler planted: rank {straggler} (host{straggler // args.per_host}), {args.late_ms:g} ms late")
        print(f"straggler found:   rank {found.get('rank')} ({found.get('host')}), {found.get('cost_ms')} ms a step")
        print(f"clock offsets: {len(recovered)} hosts recovered; largest error {max(errors):.3f} ms (goal 1 ms)")
    finally:
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
