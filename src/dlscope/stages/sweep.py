"""Step: batch size × device sweep — throughput, latency, operator shift, overhead and roofline (lab steps 6–7)."""

from __future__ import annotations

from typing import Any

import torch

from dlscope.data.loaders import normalise
from dlscope.experiments.batch_device import (
    SweepPoint,
    SweepSettings,
    available_devices,
    rows_csv,
    run_batch_device_sweep,
    sweep_grid,
)
from dlscope.options import SweepOptions
from dlscope.stages.base import Context, Step

SAMPLES = 1024  # training images the sweep slices its batches from (resident on each device)


def grid(options: SweepOptions) -> tuple[list[str], list[int], list[SweepPoint]]:
    """Devices, threads and the points to time; a grid that cannot run here (cuda asked for on a
    CPU-only machine, …) is refused."""
    devices, threads = options.devices or available_devices(), options.threads or [torch.get_num_threads()]
    return devices, threads, sweep_grid(options.batch_sizes, devices, threads, options.cudnn_benchmark)


def run(ctx: Context) -> dict[str, Any]:
    assert ctx.data is not None
    options = ctx.steps.sweep
    devices, threads, points = grid(options)
    timing = {k: getattr(options, k) for k in ("steps", "warmup", "profile_steps", "rounds")}
    config = ctx.config
    settings = SweepSettings(model=config.model, optimizer=config.optimizer, lr=config.lr, seed=config.seed, **timing)
    n = max(SAMPLES, max(options.batch_sizes))
    images, labels = normalise(ctx.data.train_images[:n]), ctx.data.train_labels[:n]
    on_cpu = any(p.device == "cpu" for p in points)  # then also the convolutions by direction
    # the sweep builds and trains its own models: from a forked random stream, so the trainer's
    # checkpoint (saved after this step) holds the RNG state training ended with
    with torch.random.fork_rng(), ctx.task("sweep", 2 * len(points) + settings.rounds + 2 + on_cpu) as task:

        def on_phase(point: SweepPoint | None, phase: str) -> None:
            task.update(description=f"{phase} {point.key}" if point else phase, advance=1)

        section = run_batch_device_sweep(
            points, settings, images, labels, (options.gemm_n, options.copy_mbytes), on_phase
        )
    out = ctx.run.sub("sweep")
    (out / "sweep.csv").write_text(rows_csv(section["rows"]))
    section["csv"] = ctx.run.rel(out / "sweep.csv")
    section["grid"] = {
        "batch_sizes": options.batch_sizes,
        "devices": devices,
        "threads": threads,
        "cudnn_benchmark": options.cudnn_benchmark,
    }
    return section


STEP = Step("sweep", run, needs=("dataset",))
