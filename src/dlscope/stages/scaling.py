"""Step: the job's samples/s on N ranks × T threads against one rank on the same cores (N·T threads)
and one rank × T threads (the baseline), from short real trainings on this machine's cores.

Every run is launched by torchrun as the job is (dlscope.distributed.launch; a one-rank run is DDP
over one worker, so launcher and wrapper are the same for all). The configurations alternate round
by round (reversed every other round), so load from other processes hits each alike. samples/s is
each run's train section's: training steps only, no start-up, no evaluation. The several-rank runs'
traces go through the distributed analysis: their exposed communication is the reason ranks lose to
threads, or the price they pay when they win.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

from dlscope.analysis.machine import machine_share, qualifier, read_machine
from dlscope.analysis.ranks import analyze_ranks, scaling_table
from dlscope.config import TrainConfig
from dlscope.distributed.launch import LOG, failure_line, run_torchrun, threads_per_rank
from dlscope.errors import DlscopeError
from dlscope.options import DistOptions, HangOptions, RunOptions, StepOptions
from dlscope.rundir import rank_files, ranks_dir, ranks_section
from dlscope.stages.base import Context, Step
from dlscope.supervise.cpushare import MachineShare
from dlscope.supervise.watchdog import Watchdog

MNIST_TRAIN = 60_000
GEMM_N = 1024  # a few tens of ms per product on one core


def configurations(world_size: int, threads: int) -> list[tuple[int, int]]:
    """(ranks, threads per rank): the baseline, the job's cores as threads of one rank, the job's split."""
    return [(1, threads), (1, world_size * threads), (world_size, threads)]


def short_config(config: TrainConfig, steps: int, threads: int) -> TrainConfig:
    """The job's model, optimizer and global batch for `steps` training steps: one epoch, no early stop."""
    return dataclasses.replace(
        config,
        epochs=1,
        train_subset=min(steps * config.batch_size, MNIST_TRAIN),
        test_subset=config.test_batch_size,  # one evaluation batch: the run's end, not timed
        target_acc=None,
        eval_every=None,
        autotune=False,
        threads=threads,
    )


def communication(directory: Path) -> dict[str, float]:
    """Mean over the ranks of their profiled steps: step time, compute, communication, exposed share."""
    ranks = analyze_ranks(rank_files(directory, "trace.json"))["ranks"]
    return {
        "step_ms": statistics.fmean(r["step_ms"] for r in ranks),
        "compute_ms": statistics.fmean(r["compute_ms"] for r in ranks),
        "comm_pct": statistics.fmean(100 * r["comm_ms"] / r["step_ms"] for r in ranks),
        "exposed_comm_pct": statistics.fmean(r["exposed_comm_pct"] for r in ranks),
        "overlap_pct": statistics.fmean(r["overlap_pct"] or 0 for r in ranks),
        "collectives_per_step": ranks[0]["collectives_per_step"],
        "comm_bytes_per_step": ranks[0]["comm_bytes_per_step"] or 0,
    }


def measure(config: TrainConfig, options: RunOptions, dist: DistOptions, directory: Path) -> dict[str, Any]:
    """One short training of `config` in dist.nproc_per_node ranks × config.threads threads on this
    machine, launched as the job is, in `directory` (removed once read; kept with its log if the run
    fails): its samples/s and, with several ranks, their communication from their traces."""
    from dlscope.plan import Plan

    local = dataclasses.replace(dist, nnodes=1, node_rank=0, rdzv_endpoint=None, max_restarts=0, ckpt_format="torch")
    quiet = dataclasses.replace(options, out=str(directory), tensorboard=False, progress=False)
    plan = Plan("scaling", ["train"], config, quiet, StepOptions(dist=local), argv=[])
    # the machine's share while it ran (supervise/cpushare.py): samples/s on cores others took is theirs too
    watchdog = Watchdog(directory, directory, HangOptions(hang_after=None), lambda text: None, MachineShare())
    start, began = time.perf_counter(), time.time()
    try:
        status = run_torchrun(plan, directory, echo=False, started=watchdog.start)
    finally:
        watchdog.stop()
    wall = time.perf_counter() - start
    share = machine_share(read_machine(directory), (began, time.time()), local.nproc_per_node * config.threads)
    log = ranks_dir(directory) / LOG
    if status != 0:
        cause = failure_line(log.read_text(errors="replace"), status)
        what = f"{local.nproc_per_node} rank(s) × {config.threads} thread(s)"
        raise DlscopeError(f"the scaling run of {what} failed: {cause} (log: {log})", directory)
    train = json.loads(ranks_section(directory).read_text())
    measured = {"samples_per_s": train["samples_per_s"], "train_seconds": train["train_seconds"], "wall_seconds": wall}
    measured["machine"] = qualifier(share) if share is not None else None
    if local.nproc_per_node > 1:
        measured |= communication(directory)
    shutil.rmtree(directory)
    return measured


def gemm_gflops(threads: int) -> float:
    """This process's fp32 GEMM peak on `threads` intra-op threads: what threads alone scale to."""
    import torch

    from dlscope.measure.peaks import measure_gemm_peak

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return measure_gemm_peak("cpu", n=GEMM_N, repeats=3).value
    finally:
        torch.set_num_threads(before)


def run(ctx: Context) -> dict[str, Any]:

    dist, scaling = ctx.steps.dist, ctx.steps.scaling
    if dist.nproc_per_node < 2:
        raise DlscopeError("the scaling step compares ranks with threads: it needs --nproc-per-node N ≥ 2")
    world = dist.nproc_per_node
    threads = threads_per_rank(ctx.config.threads, world)
    configs = configurations(world, threads)
    shutil.rmtree(ctx.run.path / "scaling", ignore_errors=True)  # an --out used before: none of its runs
    workdir = ctx.run.sub("scaling")
    runs: list[dict[str, Any]] = []
    gemm: dict[int, list[float]] = {threads: [], world * threads: []}
    with ctx.task("scaling", total=len(configs) * scaling.rounds) as task:
        for round_ in range(1, scaling.rounds + 1):
            for ranks, per_rank in configs if round_ % 2 else configs[::-1]:
                task.update(f"scaling: round {round_}, {ranks} rank(s) × {per_rank} thread(s)")
                config = short_config(ctx.config, scaling.steps, per_rank)
                directory = workdir / f"round{round_}-{ranks}x{per_rank}"
                measured = measure(config, ctx.options, dataclasses.replace(dist, nproc_per_node=ranks), directory)
                runs.append({"round": round_, "ranks": ranks, "threads": per_rank, **measured})
                task.update(advance=1)
            for n in gemm:
                gemm[n].append(gemm_gflops(n))
    workdir.rmdir()
    shared = [r["machine"] for r in runs if r["machine"]]
    gemm_efficiency = 100 * max(gemm[world * threads]) / (world * max(gemm[threads]))
    medians = []
    for ranks, per_rank in configs:
        median = {
            "ranks": ranks,
            "threads": per_rank,
            **median_of([r for r in runs if r["ranks"] == ranks and r["threads"] == per_rank]),
        }
        if (ranks, per_rank) == (1, world * threads):
            median["gemm_efficiency_pct"] = gemm_efficiency
        medians.append(median)
    return {
        "world_size": world,
        "threads_per_rank": threads,
        "steps": scaling.steps,
        "batch_size": ctx.config.batch_size,
        "rounds": scaling.rounds,
        **scaling_table(medians),
        "medians": medians,
        "runs": runs,
        "gemm": {
            "n": GEMM_N,
            "gflops": [{"threads": n, "per_round": g} for n, g in gemm.items()],
            "efficiency_pct": gemm_efficiency,
        },
        # runs during which other processes took a material share of the cores (analysis/machine.py)
        "machine_shared": {
            "runs": len(shared),
            "others_pct_max": max(m["others_pct"] for m in shared),
            "cores": shared[0]["cores"],
        }
        if shared
        else None,
        "cost": {
            "launches": len(runs),
            "wall_seconds": sum(r["wall_seconds"] for r in runs),
            "train_seconds": sum(r["train_seconds"] for r in runs),
        },
    }


def median_of(runs: list[dict[str, Any]]) -> dict[str, float]:
    """Each measured quantity's median over the rounds."""
    keys = [k for k in runs[0] if k not in ("round", "ranks", "threads", "machine")]
    return {k: statistics.median(r[k] for r in runs) for k in keys}


STEP = Step("scaling", run, needs=("trained",))
