"""`dlscope diff` (dlscope.stages.rundiff.compare) on runs of growing length: seconds and peak memory
(tracemalloc: numpy's arrays included) of one comparison of two runs of N steps each. The steps are
written as `dlscope run` writes them (records.steps_header + rows of its dtype: random part times,
every 50th step slow), into a run directory that load_results accepts; no script is run.

    .venv/bin/python benchmarks/rundiff_scale.py [--steps 10000,1000000,5000000]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np

from dlscope.contract.records import CODES, STEP_ROW, steps_header
from dlscope.rundir import SCHEMA, SCHEMA_VERSION
from dlscope.stages.rundiff import compare


def make_run(root: Path, name: str, steps: int, data_ms: float, seed: int) -> Path:
    run = root / name
    (run / "processes").mkdir(parents=True)
    rng = np.random.default_rng(seed)
    rows = np.zeros(steps, np.dtype([(n, d) for n, _, d in STEP_ROW]))
    rows["i"] = np.arange(steps)
    rows["data"] = rng.gamma(4, data_ms / 4e3, steps)
    rows["forward"] = rng.gamma(8, 4 / 8e3, steps)
    rows["backward"] = rng.gamma(8, 1 / 8e3, steps)
    rows["optimizer"] = 0.1e-3
    rows["seconds"] = rows["data"] + rows["forward"] + rows["backward"] + rows["optimizer"] + 0.2e-3
    rows["seconds"][::50] *= 3  # a slow step now and then
    rows["start"] = np.cumsum(rows["seconds"])
    rows["data_source"] = CODES["data_source"].index("loader")
    rows["peak_rss_kib"] = rows["peak_cuda_kib"] = rows["profiler_step"] = 0xFFFFFFFF
    with open(run / "processes" / "1.steps", "wb") as f:
        f.write(steps_header())
        rows.tofile(f)
    results = {
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "run": {"name": name, "command": "run"},
        "steps": ["run"],
        "sections": {
            "steps": {"main_pid": 1, "count": steps, "file": "processes/1.steps"},
            "anatomy": {"dlscope_us_per_step": 10.0},
        },
    }
    (run / "results.json").write_text(json.dumps(results))
    return run


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", default="10000,1000000,5000000")
    args = parser.parse_args()
    print("| steps a run | steps file MB | compare s | peak MB (tracemalloc) | speed-up found |")
    print("|---:|---:|---:|---:|---:|")
    for steps in [int(s) for s in args.steps.split(",")]:
        with tempfile.TemporaryDirectory() as scratch:
            a = make_run(Path(scratch), "a", steps, data_ms=8.0, seed=1)
            b = make_run(Path(scratch), "b", steps, data_ms=2.0, seed=2)
            size = (a / "processes" / "1.steps").stat().st_size / 1e6
            tracemalloc.start()
            start = time.perf_counter()
            section = compare(a, b)
            seconds = time.perf_counter() - start
            peak = tracemalloc.get_traced_memory()[1] / 1e6
            tracemalloc.stop()
            print(f"| {steps:,} | {size:.1f} | {seconds:.2f} | {peak:.1f} | {section['step']['speedup']:.3f} |")


if __name__ == "__main__":
    main()
