"""Peak memory and time of dlscope on hostile inputs: gzip bombs, a sparse 64 GiB file, and
`ckpt inspect --stats` on a 1 GiB tensor (each a whole `dlscope` process, as a user runs it).

Peak RSS comes from wait4()'s rusage of that one process. The `import torch` baseline is run
interleaved with the cases (rounds a, b, a, b, …) so the RSS and time a bare torch import costs
on this machine, under the same load, stand next to each figure.

    python benchmarks/fault_bombs.py [--rounds 3] [--stats-mib 1024]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

import numpy as np

MIB = 1 << 20
MNIST_TRAIN_HEADER = bytes([0, 0, 0x08, 3]) + np.array([60000, 28, 28], ">u4").tobytes()


def gzip_member(data: bytes) -> bytes:
    packer = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    return packer.compress(data) + packer.flush()


def gzip_bomb(path: Path, inflated_mib: int) -> Path:
    zeros = gzip_member(b"\0" * MIB)
    with open(path, "wb") as f:
        f.write(gzip_member(MNIST_TRAIN_HEADER))
        for _ in range(inflated_mib):
            f.write(zeros)
    return path


def sparse_file(path: Path, size: int) -> Path:
    with open(path, "wb") as f:
        f.write(MNIST_TRAIN_HEADER)
        f.truncate(size)
    return path


def safetensors_file(path: Path, mib: int) -> Path:
    """One float32 tensor of `mib` MiB, normally distributed (as weights are)."""
    numel = mib * MIB // 4
    header = json.dumps({"w": {"dtype": "F32", "shape": [numel], "data_offsets": [0, numel * 4]}}).encode()
    header += b" " * (-len(header) % 8)
    rng = np.random.default_rng(0)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header)
        for _ in range(mib // 64):
            f.write(rng.standard_normal(64 * MIB // 4, dtype=np.float32).tobytes())
    return path


def measure(argv: list[str]) -> tuple[float, float, int]:
    """Wall seconds, peak RSS in MB, and exit status of one process."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    return seconds, usage.ru_maxrss / 1024, proc.returncode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--stats-mib", type=int, default=1024)
    args = parser.parse_args()
    dlscope = [sys.executable, "-m", "dlscope.cli"]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        dirs = {name: tmp / name for name in ("bomb16g", "bomb2g", "sparse64g")}
        for d in dirs.values():
            d.mkdir()
        gzip_bomb(dirs["bomb16g"] / "train-images-idx3-ubyte.gz", 16 * 1024)
        gzip_bomb(dirs["bomb2g"] / "train-images-idx3-ubyte.gz", 2 * 1024)
        sparse_file(dirs["sparse64g"] / "train-images-idx3-ubyte", 64 << 30)
        tensor = safetensors_file(tmp / "big.safetensors", args.stats_mib)
        cases = {
            "import torch (baseline)": [sys.executable, "-c", "import torch"],
            **{f"data verify: {name}": [*dlscope, "data", "verify", "--data-dir", str(d)] for name, d in dirs.items()},
            f"ckpt inspect --stats: {args.stats_mib} MiB tensor": [*dlscope, "ckpt", "inspect", "--stats", str(tensor)],
        }
        results: dict[str, list[tuple[float, float, int]]] = {name: [] for name in cases}
        for _ in range(args.rounds):
            for name, argv in cases.items():
                results[name].append(measure(argv))
    print(f"{'case':44} {'exit':>4} {'median s':>9} {'peak RSS MB':>12}")
    for name, runs in results.items():
        seconds = statistics.median(r[0] for r in runs)
        rss = max(r[1] for r in runs)
        print(f"{name:44} {runs[0][2]:>4} {seconds:>9.2f} {rss:>12.0f}")
    print(f"load average at the end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
