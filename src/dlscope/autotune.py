"""Measure, then choose: the fastest way to compute this model on this machine (`--autotune`).

What is fastest differs between CPUs: channels-last and pool-before-ReLU save ~30% of a step on
one 2-vCPU EPYC and cost 28% on another; on AVX2, oneDNN's weight gradient of the 1-channel first
convolution runs ~15× faster channels-last than NCHW, while the second convolution prefers NCHW.
A layout fixed in code cannot be fast everywhere, so the first steps of the run time the
candidates, as cuDNN's benchmark mode does on a GPU:

    stage           candidates (each against the incumbent, interleaved: dlscope.measure.timing)
    threads         1, 2, 4 … up to the cores this process may use (CPU only)
    convN           oneDNN NCHW, oneDNN channels-last, aten's native im2col + GEMM (models.CONV_PATHS)
    op order        ReLU → pool or pool → ReLU

Every timed step is a real training step on the run's own batches — every layout computes the
same function of the same parameters — so tuning costs only the time the slower candidates lose
against the chosen one, reported as `cost_s`. A candidate replaces the incumbent only when its
median step is `MARGIN` shorter (a noisy neighbour must not flip the choice). Whether torch.compile
could pay back its compile time over the rest of the run is estimated, not timed here (a compile
costs more than the whole tuning budget): `compile_decision`.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import torch

from dlscope.measure.timing import Contender, time_interleaved
from dlscope.models import CONV_PATHS, Layout, TunableCNN

if TYPE_CHECKING:
    from dlscope.train import Trainer

MARGIN = 0.03  # a candidate must be this much faster (median step) to replace the incumbent
TIMED_STEPS = 6  # per candidate and stage, in ROUNDS interleaved rounds, after a cold and a warm-up step
ROUNDS = 3
MIN_TIMED_STEPS = 2
MAX_SHARE = 0.25  # tuning may use at most this share of the run's training steps
# torch.compile's cold compile of these models takes 27–35 s on a 2-vCPU EPYC (BENCHMARKS.md); it can
# shorten only the work outside convolutions and matmuls, at most about half of a step here
COMPILE_SECONDS = 27.0
COMPILE_MAX_GAIN = 0.5


@dataclass(frozen=True)
class Candidate:
    layout: Layout
    threads: int

    @property
    def name(self) -> str:
        return f"{self.layout.describe()}, {self.threads} thread{'s' if self.threads > 1 else ''}"


def thread_counts(device: torch.device) -> list[int]:
    """1, 2, 4 … and the number of cores this process may run on (only the current count off the CPU)."""
    if device.type != "cpu":
        return [torch.get_num_threads()]
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    counts = [1 << i for i in range(cores.bit_length()) if 1 << i < cores]
    return [*counts, cores]


Stage = tuple[str, Callable[[Candidate], list[Candidate]]]


def stages(model: torch.nn.Module, device: torch.device, tune_threads: bool = True) -> list[Stage]:
    """The stages for this model: each maps the incumbent to the candidates timed against it."""
    plan: list[Stage] = []
    counts = thread_counts(device)
    if tune_threads and len(counts) > 1:  # first: on a busy machine it decides more than any layout
        plan.append(("threads", lambda c: [replace(c, threads=t) for t in counts]))
    if isinstance(model, TunableCNN) and device.type == "cpu":
        for i in range(len(model.blocks)):

            def paths(c: Candidate, i: int = i) -> list[Candidate]:
                now = c.layout.paths
                return [replace(c, layout=replace(c.layout, paths=(*now[:i], p, *now[i + 1 :]))) for p in CONV_PATHS]

            plan.append((f"conv{i + 1}", paths))
    if isinstance(model, TunableCNN):
        plan.append(
            ("op order", lambda c: [replace(c, layout=replace(c.layout, pool_first=pf)) for pf in (False, True)])
        )
    return plan


def apply(model: torch.nn.Module, candidate: Candidate) -> None:
    if isinstance(model, TunableCNN):
        model.set_layout(candidate.layout)
    torch.set_num_threads(candidate.threads)


@contextlib.contextmanager
def applied(model: torch.nn.Module, candidate: Candidate) -> Iterator[None]:
    apply(model, candidate)
    yield


def compile_decision(remaining_steps: int, step_s: float) -> dict[str, Any]:
    """Whether torch.compile could pay back its compile time over the rest of the run."""
    remaining_s = remaining_steps * step_s
    best_saving_s = remaining_s * COMPILE_MAX_GAIN
    could_pay_back = best_saving_s > COMPILE_SECONDS
    why = (
        f"the rest of the run is {remaining_s:.0f} s of steps; compiling takes ~{COMPILE_SECONDS:.0f} s and "
        f"could save at most {best_saving_s:.0f} s"
    )
    return {
        "could_pay_back": could_pay_back,
        "remaining_s": remaining_s,
        "best_saving_s": best_saving_s,
        "compile_s": COMPILE_SECONDS,
        "reason": why
        + (
            ": worth measuring with `dlscope graph` (compile time, compiled against eager step)"
            if could_pay_back
            else ": not worth compiling"
        ),
    }


def autotune(trainer: Trainer, batches: Iterator[tuple[torch.Tensor, torch.Tensor]], epoch: int) -> dict[str, Any]:
    """Time the candidates on the next training steps from `batches`, apply the fastest, return the evidence."""
    model, device = trainer.model, trainer.device
    plan = stages(model, device, tune_threads=trainer.config.threads is None)  # the user's --threads stands
    run_steps = trainer.steps_per_epoch * (trainer.config.epochs - epoch)
    layout = getattr(model, "layout", Layout())
    if isinstance(model, TunableCNN) and not layout.paths:
        layout = replace(layout, paths=("onednn",) * len(model.blocks))
    incumbent = initial = Candidate(layout, torch.get_num_threads())
    # each candidate: a cold step, a warm-up step, then the timed ones — fewer of them on a short run
    per_candidate = TIMED_STEPS + 2
    candidates = sum(len(make(incumbent)) for _, make in plan)
    while candidates * per_candidate > MAX_SHARE * run_steps and per_candidate > MIN_TIMED_STEPS + 2:
        per_candidate -= 1
    if not plan or candidates * per_candidate > MAX_SHARE * run_steps:
        return {
            "chosen": incumbent.name,
            "skipped": f"{run_steps} training steps are too few to time {candidates} candidates",
        }
    timed = per_candidate - 2
    start, first_step = time.perf_counter(), trainer.global_step
    batch_size = trainer.config.batch_size
    evidence = []
    for stage, make in plan:
        candidates_here = list(dict.fromkeys(make(incumbent)))
        contenders = [
            Contender(
                c.name,
                lambda: trainer.train_batch(*next(batches), epoch),
                device,
                lambda c=c: applied(model, c),
            )
            for c in candidates_here
        ]
        time_interleaved(contenders, timed, min(ROUNDS, timed), warmup=1)
        medians = {c: contender.median_s for c, contender in zip(candidates_here, contenders, strict=True)}
        best = min(medians, key=medians.get)
        before = incumbent
        if medians[best] < medians[incumbent] * (1 - MARGIN):
            incumbent = best
        evidence.append(
            {
                "stage": stage,
                "chosen": incumbent.name,
                "changed": incumbent != before,
                "candidates": [
                    {
                        "name": c.name,
                        "step_ms": medians[c] * 1e3,
                        "samples_per_s": batch_size / medians[c],
                        "cold_ms": contender.cold_s * 1e3,
                        "steps": len(contender.times),
                    }
                    for c, contender in zip(candidates_here, contenders, strict=True)
                ],
            }
        )
    apply(model, incumbent)
    seconds = time.perf_counter() - start
    steps = trainer.global_step - first_step

    def median_step_s(candidate: Candidate) -> float:
        """Over every stage that timed it."""
        ms = [c["step_ms"] for stage in evidence for c in stage["candidates"] if c["name"] == candidate.name]
        return statistics.median(ms) / 1e3

    chosen_step_s, default_step_s = median_step_s(incumbent), median_step_s(initial)
    return {
        "chosen": incumbent.name,
        "layout": incumbent.layout.to_dict(),
        "threads": incumbent.threads,
        "stages": evidence,
        "steps": steps,
        "timed_steps_per_candidate": timed,
        "seconds": seconds,
        "cost_s": max(seconds - steps * chosen_step_s, 0.0),  # beyond what the chosen layout takes for them
        "chosen_samples_per_s": batch_size / chosen_step_s,
        "default": initial.name,
        "default_samples_per_s": batch_size / default_step_s,
        "margin": MARGIN,
        "compile": compile_decision(run_steps - steps, chosen_step_s),
    }
