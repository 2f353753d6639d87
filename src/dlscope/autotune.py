"""Measure, then choose: the fastest way to compute this model on this machine (`--autotune`).

What is fastest differs between CPUs: channels-last and pool-before-ReLU save ~30% of a step on
one 2-vCPU EPYC and cost 28% on another; on AVX2, oneDNN's weight gradient of the 1-channel first
convolution runs ~4× faster channels-last than NCHW, and its NCHW max-pooling ~10× slower.
A layout fixed in code cannot be fast everywhere, so the first steps of the run time the
candidates, as cuDNN's benchmark mode does on a GPU:

    stage           candidates (each against the incumbent, interleaved: dlscope.measure.timing)
    threads         1, 2, 4 … up to the cores this process may use (CPU only)
    convN           oneDNN NCHW, oneDNN channels-last, aten's native im2col + GEMM (models.CONV_PATHS)
    op order        ReLU → pool or pool → ReLU
    optimizer       torch's foreach kernels or the fused one (Adam, AdamW, SGD)
    torch.compile   only when it could pay back its compile time over the rest of the run

Every timed step is a real training step on the run's own batches — every candidate computes the
same function of the same parameters (the fused optimizer the same update, up to rounding) — so
tuning costs only the time the slower candidates lose against the chosen one: `cost_s`, in each
stage every step's time beyond the median step of the candidate the stage chose (timed in the same
interleaved rounds, so a neighbour's burst is not counted as tuning), plus the time between steps
(switching layouts). A candidate twice as slow needs no more
steps to be told apart, so one `DROP_ABOVE` times slower than the fastest stops being timed after
any round (after its warm-up step alone: DROP_ABOVE² times) — sequential elimination. A candidate
replaces the incumbent only when its median step is `MARGIN` shorter (a noisy neighbour must not
flip the choice).
"""

from __future__ import annotations

import contextlib
import os
import statistics
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import torch

from dlscope.measure.timing import Contender, StepTimer, time_interleaved
from dlscope.models import CONV_PATHS, Layout, TunableCNN

if TYPE_CHECKING:
    from dlscope.train import Trainer

MARGIN = 0.03  # a candidate must be this much faster (median step) to replace the incumbent
DROP_ABOVE = 1.3  # a candidate this many times slower than the fastest so far stops being timed
TIMED_STEPS = 6  # per candidate and stage, in ROUNDS interleaved rounds, after a cold and a warm-up step
ROUNDS = 3
MIN_TIMED_STEPS = 2
MAX_SHARE = 0.25  # tuning may use at most this share of the run's training steps
# torch.compile can shorten only the work outside convolutions and matmuls (it calls the same oneDNN
# and BLAS kernels for them): at most a quarter of a step here — measured on a 2-vCPU EPYC
# (BENCHMARKS.md), compiled steps were 12% shorter at best (`small`, 1 thread) and 27–64% longer in
# the other measurements. The first compile in a process took 11–16 s, the time of 360–720 training
# steps of the model it compiled; a busy machine runs steps and compiles alike slower, so the bound
# is in steps.
COMPILE_MAX_GAIN = 0.25
COMPILE_MIN_STEPS = 350
FUSED_OPTIMIZERS = (torch.optim.Adam, torch.optim.AdamW, torch.optim.SGD)


@dataclass(frozen=True)
class Candidate:
    layout: Layout
    threads: int
    fused: bool = False  # the optimizer's fused kernel rather than torch's default (foreach) ones

    @property
    def name(self) -> str:
        threads = f"{self.threads} thread{'s' if self.threads > 1 else ''}"
        return ", ".join([self.layout.describe(), threads] + (["fused optimizer"] if self.fused else []))


def thread_counts(device: torch.device) -> list[int]:
    """1, 2, 4 … and the number of cores this process may run on (only the current count off the CPU)."""
    if device.type != "cpu":
        return [torch.get_num_threads()]
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    counts = [1 << i for i in range(cores.bit_length()) if 1 << i < cores]
    return [*counts, cores]


Stage = tuple[str, Callable[[Candidate], list[Candidate]]]


def stages(
    model: torch.nn.Module,
    device: torch.device,
    tune_threads: bool = True,
    optimizer: torch.optim.Optimizer | None = None,
) -> list[Stage]:
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
    if isinstance(optimizer, FUSED_OPTIMIZERS):
        plan.append(("optimizer", lambda c: [replace(c, fused=f) for f in (False, True)]))
    return plan


def apply(trainer: Trainer, candidate: Candidate) -> None:
    if isinstance(trainer.model, TunableCNN):
        trainer.model.set_layout(candidate.layout)
    torch.set_num_threads(candidate.threads)
    for group in trainer.optimizer.param_groups:
        # None is torch's default (foreach where it can); fused and foreach may not both be set
        group["fused"] = candidate.fused or None
        group["foreach"] = False if candidate.fused else None


@contextlib.contextmanager
def applied(trainer: Trainer, candidate: Candidate) -> Iterator[None]:
    apply(trainer, candidate)
    yield


@contextlib.contextmanager
def stepping(trainer: Trainer, module: torch.nn.Module) -> Iterator[None]:
    trainer.step_model = module
    yield


def excess(contenders: list[Contender], pace_s: float) -> tuple[float, float]:
    """The contenders' steps (cold, warm-up, timed): their time beyond `pace_s` each, and their time."""
    seconds = [t for c in contenders for t in (c.cold_s, *c.warm_times, *c.times)]
    return sum(seconds) - pace_s * len(seconds), sum(seconds)


def compile_bound(remaining_steps: int) -> dict[str, Any]:
    """Whether torch.compile could pay back even a quick cold compile over the steps still to run."""
    best_saving = remaining_steps * COMPILE_MAX_GAIN
    return {
        "could_pay_back": best_saving > COMPILE_MIN_STEPS,
        "remaining_steps": remaining_steps,
        "reason": f"the rest of the run is {remaining_steps} steps; compiling could save at most "
        f"{COMPILE_MAX_GAIN:.0%} of each, {best_saving:.0f} steps' time, and a cold compile takes about "
        f"{COMPILE_MIN_STEPS} steps' time",
    }


def compiled_steps_failure(run: Callable[[], object], model: torch.nn.Module) -> str | None:
    """What went wrong when `run` trained `model` through torch.compile, or None: an error raised
    (Inductor's code for one CPU can fail where another's works, e.g. a bounds check in an AVX2
    kernel), or weights left non-finite (a wrong kernel trains to NaN)."""
    try:
        run()
    except Exception as error:  # any of torch.compile's many error types: the trial's result, not a crash
        first_line = next(iter(str(error).strip().splitlines()), "")
        return f"{type(error).__name__}: {first_line[:200]}"
    if not all(bool(torch.isfinite(p).all()) for p in model.parameters()):
        return "weights not finite after them"
    return None


def compile_trial(
    trainer: Trainer, step: Callable[[], object], remaining_steps: int, timed: int, timer: StepTimer
) -> dict[str, Any]:
    """Time the compiled model against the eager one on real steps; keep it when it pays back.

    The first compiled step compiles forward and backward: its time less an eager step is the
    compile time, measured. Kept when the saving over the steps still to run exceeds it: the
    compile is spent by then, but the epoch's last, shorter batch compiles once more.
    """
    bound = compile_bound(remaining_steps)
    if not bound["could_pay_back"]:
        return {**bound, "tried": False, "kept": False, "reason": bound["reason"] + ": not tried"}
    eager, compiled = trainer.model, torch.compile(trainer.model)
    contenders = [
        Contender(name, step, trainer.device, lambda m=module: stepping(trainer, m), timer)
        for name, module in (("eager", eager), ("compiled", compiled))
    ]
    before = trainer.trial_state()
    failure = compiled_steps_failure(lambda: time_interleaved(contenders, timed, min(ROUNDS, timed), warmup=1), eager)
    if failure is not None:  # the steps trained the model: undone, and their time is all overhead
        trainer.put_back(before)
        trainer.step_model = eager
        return {
            **bound,
            "tried": True,
            "kept": False,
            "failed": failure,
            "excess_s": 0.0,
            "step_seconds": 0.0,
            "reason": f"the compiled steps failed ({failure}); the weights, the optimizer's state and the "
            "epoch's metrics were put back as before them: not kept",
        }
    eager_s, compiled_s = contenders[0].median_s, contenders[1].median_s
    compile_s = max(contenders[1].cold_s - eager_s, 0.0)
    saving_s = (eager_s - compiled_s) * (remaining_steps - sum(c.steps for c in contenders))
    kept = saving_s > compile_s and compiled_s < eager_s * (1 - MARGIN)
    trainer.step_model = compiled if kept else eager
    excess_s, step_seconds = excess(contenders, compiled_s if kept else eager_s)
    return {
        **bound,
        "tried": True,
        "kept": kept,
        "compile_s": compile_s,
        "eager_step_ms": eager_s * 1e3,
        "compiled_step_ms": compiled_s * 1e3,
        "saving_s": saving_s,
        "steps": sum(c.steps for c in contenders),
        "excess_s": excess_s,
        "step_seconds": step_seconds,
        "reason": f"compiling took {compile_s:.1f} s (measured); a compiled step {compiled_s * 1e3:.1f} ms against "
        f"{eager_s * 1e3:.1f} ms eager would save {saving_s:.1f} s over the rest of the run: "
        + ("kept" if kept else "not kept"),
    }


def autotune(trainer: Trainer, batches: Iterator[tuple[torch.Tensor, torch.Tensor]], epoch: int) -> dict[str, Any]:
    """Time the candidates on the next training steps from `batches`, apply the fastest, return the evidence."""
    model, device = trainer.model, trainer.device
    timer = StepTimer(device)  # one clock for the steps and for the tuning's whole time
    plan = stages(model, device, trainer.config.threads is None, trainer.optimizer)  # the user's --threads stands
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
    start, first_step = timer.now(), trainer.global_step
    batch_size = trainer.config.batch_size

    def step() -> None:
        trainer.train_batch(*next(batches), epoch)

    evidence = []
    excess_s = step_seconds = 0.0
    for stage, make in plan:
        candidates_here = list(dict.fromkeys(make(incumbent)))
        contenders = [Contender(c.name, step, device, lambda c=c: applied(trainer, c), timer) for c in candidates_here]
        time_interleaved(contenders, timed, min(ROUNDS, timed), warmup=1, drop_above=DROP_ABOVE)
        medians = {c: contender.median_s for c, contender in zip(candidates_here, contenders, strict=True)}
        finalists = [c for c, cont in zip(candidates_here, contenders, strict=True) if cont.dropped_after is None]
        best = min(finalists, key=medians.get)
        before = incumbent
        if incumbent not in finalists or medians[best] < medians[incumbent] * (1 - MARGIN):
            incumbent = best
        stage_excess, stage_seconds = excess(contenders, medians[incumbent])
        excess_s, step_seconds = excess_s + stage_excess, step_seconds + stage_seconds
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
                        "dropped_after": contender.dropped_after,
                    }
                    for c, contender in zip(candidates_here, contenders, strict=True)
                ],
            }
        )
    apply(trainer, incumbent)

    def median_step_s(candidate: Candidate) -> float:
        """Over every stage that timed it."""
        ms = [c["step_ms"] for stage in evidence for c in stage["candidates"] if c["name"] == candidate.name]
        return statistics.median(ms) / 1e3

    chosen_step_s, default_step_s = median_step_s(incumbent), median_step_s(initial)
    compiled = compile_trial(trainer, step, run_steps - (trainer.global_step - first_step), timed, timer)
    if compiled["kept"]:
        chosen_step_s = compiled["compiled_step_ms"] / 1e3
    if compiled["tried"]:
        excess_s, step_seconds = excess_s + compiled["excess_s"], step_seconds + compiled["step_seconds"]
    seconds, steps = timer.now() - start, trainer.global_step - first_step
    return {
        "chosen": incumbent.name + (", compiled" if compiled["kept"] else ""),
        "layout": incumbent.layout.to_dict(),
        "threads": incumbent.threads,
        "fused_optimizer": incumbent.fused,
        "stages": evidence,
        "steps": steps,
        "timed_steps_per_candidate": timed,
        "seconds": seconds,
        # the timed steps trained the model: only their time beyond each stage's chosen pace is overhead
        "cost_s": max(excess_s + seconds - step_seconds, 0.0),
        "chosen_samples_per_s": batch_size / chosen_step_s,
        "default": initial.name,
        "default_samples_per_s": batch_size / default_step_s,
        "margin": MARGIN,
        "drop_above": DROP_ABOVE,
        "compile": compiled,
    }
