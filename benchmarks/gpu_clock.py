"""The GPU clock's cost per step (issue 27), on a CUDA machine: tests/scripts/cuda_truth.py, which
times its own steps with CUDA events, bare, under `dlscope run` with the GPU clock off
(DLSCOPE_GPU_CLOCK=0: the host's clock and the C fast path) and under `dlscope run` as it is, in
interleaved rounds (the machines are noisy). `--mode item` synchronises every step, so whatever
the host spends in a step lengthens it: the difference of the medians is the cost a step pays.
The profiler window is off in both observed arms (--profile-steps 0).

    python benchmarks/gpu_clock.py [--mode item] [--steps 300] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "tests" / "scripts" / "cuda_truth.py"
ARMS = {"bare": None, "host clock": "0", "GPU clock": "1"}


def one(arm: str, mode: str, steps: int, work: Path) -> float:
    truth = work / f"{arm.replace(' ', '-')}.json"
    script = [sys.executable, str(SCRIPT), str(truth), "--mode", mode, "--steps", str(steps)]
    env = dict(os.environ)
    if ARMS[arm] is None:
        command = script
    else:
        env["DLSCOPE_GPU_CLOCK"] = ARMS[arm]
        out = work / f"run-{arm.replace(' ', '-')}"
        command = [sys.executable, "-m", "dlscope.cli", "run", "--profile-steps", "0", "--out", str(out), "--", *script]
    subprocess.run(command, env=env, check=True, capture_output=True)
    return json.loads(truth.read_text())["step_ms"]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--mode", default="item", choices=["item", "pageable", "compute"])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("gpu_clock.py: needs a CUDA GPU (torch.cuda.is_available() is False here)", file=sys.stderr)
        raise SystemExit(2)
    times: dict[str, list[float]] = {arm: [] for arm in ARMS}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.rounds):
            for arm in ARMS:
                times[arm].append(one(arm, args.mode, args.steps, Path(tmp)))
    bare = statistics.median(times["bare"])
    result = {arm: {"median_step_ms": round(statistics.median(t), 4), "runs": t} for arm, t in times.items()}
    for arm in ("host clock", "GPU clock"):
        result[arm]["cost_us_per_step"] = round((result[arm]["median_step_ms"] - bare) * 1e3, 1)
    print(json.dumps({"mode": args.mode, "steps": args.steps, "rounds": args.rounds, **result}, indent=1))


if __name__ == "__main__":
    main()
