"""dlscope's reader stages against tf.data on the same files, rows and consumer (needs the tf
extra). Rows alternate engine by engine, round after round (interleaved), and the table reports
each engine's median epoch and the median of the per-round ratios tf.data ÷ dlscope.

    python benchmarks/tfdata_vs_dlscope.py [--repeats 5] [--samples 5000] [--compute-ms 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
from dataclasses import replace
from pathlib import Path

from dlscope.data.mnist import load_mnist
from dlscope.experiments.pipeline import ReaderConfig, SimulatedCompute, measure_epoch, prepare_dataset
from dlscope.experiments.pipeline.tfdata import import_tensorflow

ROWS = [
    ("shards, warm", ReaderConfig("tfrecord", batch_size=500), False),
    ("shards, cold", ReaderConfig("tfrecord", batch_size=500), True),
    ("shards, shuffle 500", ReaderConfig("tfrecord", shuffle_buffer=500, batch_size=500), False),
    ("shards, batch 32", ReaderConfig("tfrecord", batch_size=32), False),
    ("files, warm", ReaderConfig("files", batch_size=500), False),
    ("files, cold", ReaderConfig("files", batch_size=500), True),
    ("files, half-file buffer", ReaderConfig("files", read_buffer=431, batch_size=500), False),
    ("files, 2 workers / prefetch 2", ReaderConfig("files", batch_size=500, workers=2, prefetch=2), True),
]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--samples", type=int, default=5000)
    parser.add_argument("--compute-ms", type=float, default=5.0)
    args = parser.parse_args()
    import_tensorflow()
    load_before = os.getloadavg()[0]
    mnist = load_mnist()
    images = mnist.train_images[: args.samples].reshape(args.samples, -1).numpy()
    labels = mnist.train_labels[: args.samples].numpy().astype("uint8")
    with tempfile.TemporaryDirectory(dir=".") as tmp:
        root = Path(tmp) / "mnist"
        manifest = prepare_dataset(root, labels, images, "mnist", formats=("files", "tfrecord"))
        runs: dict[tuple[str, str], list] = {}
        for _ in range(args.repeats):
            for label, reader, cold in ROWS:
                for engine in ("dlscope", "tfdata"):
                    consumer = SimulatedCompute(args.compute_ms / 1000)
                    m = measure_epoch(root, manifest, replace(reader, engine=engine), consumer, cold)
                    assert m.exactly_once, (label, engine)
                    runs.setdefault((label, engine), []).append(m)
    cpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    model = next((line.split(":", 1)[1].strip() for line in cpu.splitlines() if line.startswith("Model name")), "?")
    isa = "AVX-512" if "avx512f" in cpu else "AVX2" if "avx2" in cpu else "no AVX2"
    load_after = os.getloadavg()[0]
    print(f"{model}, {os.cpu_count()} CPUs, {isa}; load average {load_before:.1f} before, {load_after:.1f} after")
    print(f"{args.samples:,} MNIST samples, {args.compute_ms:g} ms simulated compute/batch, {args.repeats} rounds\n")
    print(
        "| row | dlscope s | tf.data s | tf.data ÷ dlscope | 1st batch s (dl / tf) | read calls (dl / tf) "
        "| AU % (dl / tf) |"
    )
    print("|---|---|---|---|---|---|---|")
    for label, _, _ in ROWS:
        dl, tf = runs[(label, "dlscope")], runs[(label, "tfdata")]
        ratio = statistics.median(b.wall_s / a.wall_s for a, b in zip(dl, tf, strict=True))
        med = {name: sorted(ms, key=lambda m: m.wall_s)[len(ms) // 2] for name, ms in (("dl", dl), ("tf", tf))}
        print(
            f"| {label} | {med['dl'].wall_s:.3f} | {med['tf'].wall_s:.3f} | {ratio:.2f} | "
            f"{med['dl'].first_batch_s:.3f} / {med['tf'].first_batch_s:.3f} | "
            f"{med['dl'].reads:,} / {med['tf'].reads:,} | {100 * med['dl'].au:.0f} / {100 * med['tf'].au:.0f} |"
        )


if __name__ == "__main__":
    main()
