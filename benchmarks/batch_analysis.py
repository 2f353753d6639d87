"""The batch x-ray's analysis (analysis/batchflow.py) at any length: N synthetic batches
written with the real writer (batches.BatchRecorder: W persistent workers' `<pid>.batches` and the
training process's "taken" records, one step per batch, a slow sample in 5000), then
`read_flow` + `section` (results summaries and batches.csv) run in a fresh process each, timed,
with its peak RSS (ru_maxrss) beside the same process's RSS before it read anything.

--compare REF runs the analysis of git revision REF too (the one-Python-object-per-batch version
is db281a3), interleaved with this one, on a length it can hold.

    .venv/bin/python benchmarks/batch_analysis.py [--batches 1000000] [--workers 8]
        [--batch-size 32] [--compare db281a3 --compare-batches 100000]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from dlscope.injob import batches

MAIN_PID, FIRST_WORKER_PID = 100, 1000
STEP_DTYPE = np.dtype([("i", "<u8"), ("start", "<f8"), ("seconds", "<f4")])


def synthesise(directory: Path, n: int, workers: int, batch_size: int, seed: int = 0) -> np.ndarray:
    """`<pid>.batches` files for n batches over `workers` workers, epochs of 10,000 batches; the
    steps (one per batch) returned."""
    rng = np.random.default_rng(seed)
    scratch = directory / "scratch"
    scratch.mkdir(parents=True)
    recorders = []
    for w in range(workers):
        r = batches.BatchRecorder(str(scratch / str(w)))
        (scratch / str(w)).mkdir()
        r.worker_id = w
        recorders.append(r)
    main = batches.BatchRecorder(str(scratch / "main"))
    (scratch / "main").mkdir()
    epoch, step_s, t0 = 10_000, 0.004, 1.7e9
    steps = np.zeros(n, STEP_DTYPE)
    for first in range(0, n, epoch):
        count = min(epoch, n - first)
        sample_s = rng.lognormal(np.log(1e-4), 0.3, (count, batch_size))
        sample_s[rng.random((count, batch_size)) < 1 / 5000] *= 100
        ends = np.cumsum(sample_s, axis=1)
        asked = t0 + (first + np.arange(count)) * step_s
        start = asked - ends[:, -1] - 0.002 * rng.random(count)
        waited = np.maximum(start + ends[:, -1] + 0.0005 - asked, 0.0) + 1e-5
        for k in range(count):
            idx = k
            w = idx % workers
            indices = list(range((first + k) * batch_size, (first + k + 1) * batch_size))
            sample_ends = (start[k] + ends[k]).tolist()
            b = batches.Built(
                batches.SAMPLE_TIMES, float(start[k]), sample_ends[-1], sample_ends[-1] + 2e-4, indices, sample_ends
            )
            recorders[w].write_built(b, first // epoch, idx, b.collated + 1e-5)
            iterator = SimpleNamespace(
                _dlscope_taken=(w, FIRST_WORKER_PID + w, first // epoch, idx, float(asked[k] + waited[k]), float("nan"))
            )
            main.delivered(iterator, float(asked[k]), float(asked[k] + waited[k]))
        steps["i"][first : first + count] = first + np.arange(count)
        steps["start"][first : first + count] = asked - 1e-6
        steps["seconds"][first : first + count] = step_s
    for r in [*recorders, main]:
        r.file.flush()
    processes = directory / "processes"
    processes.mkdir()
    for w in range(workers):
        os.rename(scratch / str(w) / f"{os.getpid()}.batches", processes / f"{FIRST_WORKER_PID + w}.batches")
    os.rename(scratch / "main" / f"{os.getpid()}.batches", processes / f"{MAIN_PID}.batches")
    np.save(directory / "steps.npy", steps)
    return steps


def analyse(directory: Path, module_path: str) -> None:
    """In a fresh process: the analysis of `directory`, its time and peak RSS as one JSON line."""
    import resource

    spec = importlib.util.spec_from_file_location("batchflow_under_test", module_path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules[spec.name] = module  # type: ignore[union-attr]  (its dataclasses look it up)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    steps = np.load(directory / "steps.npy")
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = time.perf_counter()
    flow = module.read_flow(directory / "processes", MAIN_PID, steps, [])
    read = time.perf_counter() - started
    section = module.section(flow, steps, directory / "batches.csv", False)
    seconds = time.perf_counter() - started
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(
        json.dumps(
            {
                "read_s": round(read, 2),
                "total_s": round(seconds, 2),
                "rss_before_mib": round(before / 1024, 1),
                "peak_rss_mib": round(peak / 1024, 1),
                "results_bytes": len(json.dumps(section)),
                "csv_rows": (directory / "batches.csv").read_bytes().count(b"\n") - 1,
                "samples": section["samples"]["count"],
                "outliers_total": section["samples"]["outliers_total"],
                "wait_pct": section["shares"].get("wait_pct"),
            }
        )
    )


def run_analysis(directory: Path, module_path: str) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, "--analyse", str(directory), "--module", module_path],
        capture_output=True,
        text=True,
    )
    if out.returncode:
        raise SystemExit(f"the analysis failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def module_at(ref: str, scratch: Path) -> str:
    """batchflow.py as it was at git revision `ref` (it imports its neighbours from this tree)."""
    source = subprocess.run(
        ["git", "show", f"{ref}:src/dlscope/analysis/batchflow.py"], check=True, capture_output=True, text=True
    ).stdout
    path = scratch / f"batchflow_{ref}.py"
    path.write_text(source)
    return str(path)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", type=int, default=1_000_000)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--compare", help="a git revision whose analysis runs too")
    parser.add_argument("--compare-batches", type=int, default=100_000)
    parser.add_argument("--analyse", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--module", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.analyse:
        analyse(args.analyse, args.module)
        return
    here = str(Path(batches.__file__).parents[1] / "analysis" / "batchflow.py")
    with tempfile.TemporaryDirectory(prefix="batch-analysis-") as tmp:
        root = Path(tmp)
        lengths = sorted({args.compare_batches, args.batches}) if args.compare else [args.batches]
        for n in lengths:
            directory = root / str(n)
            started = time.perf_counter()
            synthesise(directory, n, args.workers, args.batch_size)
            size = sum(p.stat().st_size for p in (directory / "processes").iterdir())
            print(
                f"{n:>9,} batches × {args.batch_size} samples: {size / 2**20:.0f} MiB of records "
                f"(written in {time.perf_counter() - started:.0f} s)",
                flush=True,
            )
            runs = [("this tree", here)]
            if args.compare and n <= args.compare_batches:
                runs.append((args.compare, module_at(args.compare, root)))
            for name, path in runs:
                print(f"  {name:>10}: {json.dumps(run_analysis(directory, path))}", flush=True)
            for p in (directory / "processes").iterdir():
                p.unlink()


if __name__ == "__main__":
    main()
