"""Wall time of the default `dlscope lab`, its test accuracy and its time to 99%, over seeds.

python benchmarks/lab_time.py [--seeds 1,2,3] [extra dlscope lab flags...]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", default="1,2,3")
    args, extra = parser.parse_known_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in [int(s) for s in args.seeds.split(",")]:
            out = Path(tmp) / f"lab-{seed}"
            start = time.perf_counter()
            proc = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "dlscope.cli",
                    "lab",
                    "--out",
                    str(out),
                    "--seed",
                    str(seed),
                    "--no-progress",
                    *extra,
                ],
                capture_output=True,
                text=True,
            )
            wall = time.perf_counter() - start
            if proc.returncode != 0:
                sys.exit(f"seed {seed} failed:\n{proc.stderr}")
            results = json.loads((out / "results.json").read_text())
            train = results["sections"]["train"]
            step_seconds = {k: v.get("seconds") for k, v in results["sections"].items()}
            rows.append(
                {
                    "seed": seed,
                    "wall_seconds": round(wall, 2),
                    "final_test_acc": train["final_test_acc"],
                    "epochs": len(train["epochs"]),
                    "time_to_target_s": train["time_to_target_s"],
                    "train_samples_per_s": train["samples_per_s"],
                    "autotune": (train.get("autotune") or {}).get("chosen"),
                    "step_seconds": step_seconds,
                }
            )
            print(json.dumps(rows[-1]), flush=True)
    print(
        json.dumps(
            {
                "wall_seconds_median": statistics.median(r["wall_seconds"] for r in rows),
                "min_test_acc": min(r["final_test_acc"] for r in rows),
                "time_to_99_median": statistics.median(r["time_to_target_s"] or float("nan") for r in rows),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
