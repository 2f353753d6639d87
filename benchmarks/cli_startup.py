"""Whole-process start-up of the commands that need no torch, against `python -c "import torch"`.

Goal (issue 10): `dlscope --help`, `dlscope report RUN` and `dlscope ckpt inspect` of a 90 MB
safetensors file each take ≤ 0.35× the time of importing torch, on the same machine. The runs
are interleaved (torch, help, inspect, report, torch, …) so load from other processes hits every
command alike; the median of each is reported.

    python benchmarks/cli_startup.py [--repeats 7] [--run runs/some-run]
"""

from __future__ import annotations

import argparse
import json
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GOAL = 0.35


def write_safetensors(path: Path, megabytes: int = 90) -> None:
    """A safetensors file of float32 1024×1024 tensors, written without torch or safetensors."""
    count = megabytes * 2**20 // (4 * 1024 * 1024)
    header, offset = {}, 0
    for i in range(count):
        size = 4 * 1024 * 1024
        header[f"layer{i}.weight"] = {"dtype": "F32", "shape": [1024, 1024], "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with path.open("wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        f.truncate(8 + len(text) + offset)


def seconds(argv: list[str]) -> float:
    start = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if done.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()[-300:]}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--run", default=None, help="a run directory for `dlscope report` (default: skip)")
    args = parser.parse_args()
    py = sys.executable
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "model.safetensors"
        write_safetensors(model)
        cases = {
            "python -c 'import torch'": [py, "-c", "import torch"],
            "dlscope --help": [py, "-m", "dlscope.cli", "--help"],
            "dlscope ckpt inspect (90 MB safetensors)": [py, "-m", "dlscope.cli", "ckpt", "inspect", str(model)],
        }
        if args.run:
            cases["dlscope report RUN"] = [py, "-m", "dlscope.cli", "report", args.run]
        times: dict[str, list[float]] = {name: [] for name in cases}
        for _ in range(args.repeats):
            for name, argv in cases.items():
                times[name].append(seconds(argv))
    torch_s = statistics.median(times["python -c 'import torch'"])
    print(f"{'command':44} {'median s':>9} {'× torch':>8}")
    for name, ts in times.items():
        ratio = statistics.median(ts) / torch_s
        mark = "" if name.startswith("python") else ("  ok" if ratio <= GOAL else f"  over {GOAL}×")
        print(f"{name:44} {statistics.median(ts):9.3f} {ratio:8.2f}{mark}")


if __name__ == "__main__":
    main()
