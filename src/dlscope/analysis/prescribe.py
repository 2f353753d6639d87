"""`dlscope doctor`'s reasoning, torch-free and stateless: the baseline's facts in, the candidate
changes the evidence supports (each with its predicted gain) and those it does not (with the
reason) out; then trials in, each candidate's measured gain, noise band, verdict and numerics.

Predictions, from the baseline's anatomy (mean shares applied to the median step):
    input made free   step / (step - data): the ceiling of any input fix (1 / (1 - data share))
    workers w         step / the step with w workers, from CPU times measured in the baseline:
                      the training thread computes (compute × its share of a core) and receives
                      each batch (the hand-over's unpickling, measured by a calibration queue of the
                      batch's own tensors); each worker fetches (data's CPU part), waits (the rest)
                      and sends its batch (the hand-over's pickling). The step is the slower of the
                      training thread and the workers' pipeline (fetch / w), each CPU part divided
                      by the share of a core a runnable thread of ours gets: the baseline's own,
                      scaled as the cores 1, 2, … w + 1 busy processes got when measured here (other
                      jobs, a CPU quota, a scheduler that shares by session: all in the figure),
                      solved to a fixed point with how many of our threads run at once. w = ⌈data /
                      compute⌉, at least 2, at most the cores — twice the cores when fetching
                      mostly waits (the training thread on a CPU < half its time in __next__)
    threads t         data and the loop's own time stay, compute (forward, backward, optimizer)
                      divides by the scaling a matmul showed on this machine from t0 to t threads
    set_to_none       step / (step - zero_grad's measured mean)
    bf16 autocast     the matrix products and convolutions (their self CPU time in the baseline's
                      profiled steps; on a GPU, their self device time) divide by the speed-up a
                      matmul shows under bf16 autocast here; tried only on a CPU with bf16
                      instructions (avx512_bf16, amx_bf16) or a GPU with bf16, and when they are
                      AUTOCAST_PCT of the step or more; it alters numerics
    pinned copies     DataLoader(pin_memory=True) and each copy from the CPU to the GPU
                      non-blocking: step / (step - the host's time in blocking copies a step), an
                      upper bound (the host stops waiting for the GPU there; the GPU still copies,
                      faster from pinned memory, and a later wait, a loss.item(), may take it back)
Noise: a trial's median step has the notch of a box plot, ±1.58 IQR / √n (McGill et al. 1978);
a gain's band is the two trials' notches combined, widened to half the range of the rounds'
ratios (each round pairs a candidate with the baseline run just before it, so a load that moves
between rounds moves both); a change is faster (or slower) only beyond that band.
"""

from __future__ import annotations

import math
from typing import Any

from dlscope.analysis.observed import MODERATELY_PCT
from dlscope.measure.stats import percentile

NOTCH = 1.58
WAITING_FRAC = 0.5  # fetching is waiting when the training thread is on a CPU for less than this share of it
WAITING_WORKERS_PER_CORE = 2  # workers that mostly wait: up to this many per core
AUTOCAST_PCT = 30.0  # bf16 autocast is tried when matrix products and convolutions are this much of the step
GEMM_OPS = ("mm", "conv", "matmul")  # in an operator's name: a matrix product or a convolution
FIXED_POINT_ROUNDS = 60  # of the workers prediction's share of a core: damped, it settles in far fewer
NUMERICS_RTOL = 1e-3  # the first losses of a change that keeps numerics: within this of the baseline's
NOT_BUILT = ("persistent_workers", "prefetch_factor", "channels_last", "compile", "batch")


def candidates(
    baseline: dict[str, Any], cores: int, bf16: bool = False, cuda: bool = False
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(to try, not tried) from the baseline trial's facts: its anatomy, median step, sites,
    threads, zero_grad time and copies to the GPU. Each candidate: key, change (change.py
    settings), predicted gain, the facts it was predicted from and the site to change. `bf16`:
    the device the steps compute on (the GPU where `cuda`, else the CPU) has bf16 arithmetic."""
    anatomy, step_ms, facts = baseline["anatomy"], baseline["median_ms"], baseline["facts"]
    tried: list[dict[str, Any]] = []
    skipped: list[dict[str, Any]] = []
    mean = anatomy.get("mean_ms", {})
    pct = anatomy.get("percent", {})
    loader = anatomy.get("data_source") == "loader"
    data_ms = step_ms * pct.get("data", 0.0) / 100 if loader else 0.0
    compute_ms = step_ms - data_ms
    loaders = [s for s in facts["sites"] if s["what"] == "DataLoader"]
    workers_now = max((s["arguments"].get("num_workers", 0) or 0 for s in loaders), default=0)
    input_facts = {"data_pct": round(pct.get("data", 0.0), 2), "threshold_pct": MODERATELY_PCT}
    if not loader:
        skipped += [{"key": k, "reason": "no_loader"} for k in ("workers", "input_free")]
    elif pct.get("data", 0.0) < MODERATELY_PCT:
        skipped += [{"key": k, "reason": "input_cheap", **input_facts} for k in ("workers", "input_free")]
    else:
        tried.append(
            {
                "key": "input_free",
                "change": {"replay": 8},
                "predicted": round(step_ms / max(compute_ms, 1e-9), 3),
                "basis": {**input_facts, "step_ms": step_ms, "data_ms": round(data_ms, 3)},
                "ceiling": True,
            }
        )
        # fetching that waits (a read, a sleep) rather than computes overlaps beyond the cores
        cpu_frac = facts.get("loader_cpu_frac") if workers_now == 0 else None
        waits = cpu_frac is not None and cpu_frac < WAITING_FRAC
        most = WAITING_WORKERS_PER_CORE * cores if waits else cores
        workers = min(most, max(2, math.ceil(data_ms / max(compute_ms, 1e-9))))
        if cores < 2 and not waits:
            skipped.append({"key": "workers", "reason": "one_core"})
        elif workers_now >= workers:
            skipped.append({"key": "workers", "reason": "workers_enough", "workers": workers_now, "cores": cores})
        else:
            basis = {**input_facts, "workers": workers, "workers_now": workers_now, "cores": cores}
            basis.update(
                step_ms=step_ms,
                data_ms=round(data_ms, 3),
                loader_cpu_frac=cpu_frac,
                thread_share=facts.get("thread_share"),
                machine_idle_frac=facts.get("machine_idle_frac"),
                cores_busy=[float(min(n, cores)) for n in range(1, workers + 2)],
                handover_send_ms=0.0,
                handover_recv_ms=0.0,
            )
            tried.append(
                {
                    "key": "workers",
                    "change": {"loader": {"num_workers": workers}},
                    "predicted": workers_prediction(basis),
                    "basis": basis,
                    "site": first_site(loaders),
                    "argument": ("num_workers", workers),
                }
            )
    threads, beside = facts.get("threads"), facts.get("sharing")
    if beside and beside.get("threads_total") is None:  # another process's threads not known
        beside = None
    compute = sum(mean.get(p, 0.0) for p in ("forward", "backward", "optimizer"))
    compute_share = compute / anatomy["step_ms"] if anatomy.get("step_ms") else 0.0
    share = max(cores // len(beside["pids"]), 1) if beside else cores
    if beside and threads and threads == share:
        at_share = {"threads": threads, "cores": cores, "processes": len(beside["pids"])}
        skipped.append({"key": "threads", "reason": "threads_at_share", **at_share})
    elif beside and threads:
        # several processes training at once: each its share of the cores, whether fewer or more
        tried.append(
            {
                "key": "threads",
                "change": {"threads": share},
                "basis": {
                    "threads_now": threads,
                    "threads": share,
                    "processes": len(beside["pids"]),
                    "threads_total": beside["threads_total"],
                    "cores": cores,
                    "compute_pct": round(100 * compute_share, 2),
                },
                "compute_share": compute_share,
                "site": None,
                "argument": ("torch.set_num_threads", share),
            }
        )
    elif threads is not None and threads < cores:
        tried.append(
            {
                "key": "threads",
                "change": {"threads": cores},
                "basis": {"threads_now": threads, "threads": cores, "compute_pct": round(100 * compute_share, 2)},
                "compute_share": compute_share,
                "site": None,
                "argument": ("torch.set_num_threads", cores),
            }
        )
    elif threads is not None:
        skipped.append({"key": "threads", "reason": "threads_at_cores", "threads": threads, "cores": cores})
    clears = [s for s in facts["sites"] if s["what"].endswith("zero_grad")]
    if any(not s["arguments"].get("set_to_none", True) for s in clears) and facts.get("zero_grad_s"):
        zero_ms = facts["zero_grad_s"] * 1e3
        tried.append(
            {
                "key": "set_to_none",
                "change": {"set_to_none": True},
                "predicted": round(step_ms / max(step_ms - zero_ms, 1e-9), 3),
                "basis": {"zero_grad_ms": round(zero_ms, 4), "step_ms": step_ms},
                "site": first_site([s for s in clears if not s["arguments"].get("set_to_none", True)]),
                "argument": ("set_to_none", True),
            }
        )
    elif clears:
        skipped.append({"key": "set_to_none", "reason": "already_none"})
    gemm = baseline.get("gemm_pct")
    if not bf16:
        skipped.append({"key": "autocast", "reason": "no_bf16", "device": "cuda" if cuda else "cpu"})
    elif gemm is None:
        skipped.append({"key": "autocast", "reason": "no_profile"})
    elif gemm < AUTOCAST_PCT:
        skipped.append({"key": "autocast", "reason": "gemm_small", "pct": gemm, "threshold_pct": AUTOCAST_PCT})
    else:
        device = "cuda" if cuda else "cpu"
        tried.append(
            {
                "key": "autocast",
                "change": {"autocast": "bf16", "autocast_device": device},
                "basis": {"gemm_pct": gemm, "device": device},
                "compute_share": gemm / 100,
                "site": None,
                "argument": ("torch.autocast", f"{device!r}, dtype=torch.bfloat16"),
                "alters_numerics": True,
            }
        )
    if not cuda:
        skipped.append({"key": "pin_memory", "reason": "no_gpu"})
    else:
        pinned = pinned_copies(facts.get("copies"), step_ms, loaders)
        (tried if "change" in pinned else skipped).append(pinned)
    skipped += [{"key": k, "reason": "not_built"} for k in NOT_BUILT]
    return tried, skipped


def pinned_copies(copies: dict[str, Any] | None, step_ms: float, loaders: list[dict[str, Any]]) -> dict[str, Any]:
    """The pinned-copies candidate from the baseline's copies to the GPU (change.py's "copies"
    record), or why it is not tried."""
    if not copies or not copies.get("calls") or not copies.get("steps"):
        return {"key": "pin_memory", "reason": "no_copies"}
    if not copies["blocking"] and copies["pinned"] == copies["calls"]:
        return {"key": "pin_memory", "reason": "copies_async"}
    if copies["pinned"] < copies["calls"] and not loaders:
        return {"key": "pin_memory", "reason": "no_loader_to_pin"}
    blocked_ms = 1e3 * copies["seconds"] / copies["steps"]
    return {
        "key": "pin_memory",
        "change": {"loader": {"pin_memory": True}, "non_blocking": True},
        "predicted": round(step_ms / max(step_ms - blocked_ms, 1e-9), 3),
        "basis": {
            "step_ms": step_ms,
            "copy_ms": round(blocked_ms, 4),
            "copies_per_step": round(copies["calls"] / copies["steps"], 2),
            "mb_per_step": round(copies["bytes"] / copies["steps"] / 1e6, 3),
            "pinned_pct": round(100 * copies["pinned"] / copies["calls"], 1),
            "blocking_pct": round(100 * copies["blocking"] / copies["calls"], 1),
        },
        "site": first_site(loaders),
        "argument": ("pin_memory", True),
    }


def workers_prediction(basis: dict[str, Any]) -> float:
    """The gain of `workers` DataLoader workers (the module's docstring), from the baseline's facts
    in a workers candidate's basis, the hand-over's measured CPU per batch (0 until measured) and
    the cores 1, 2, … w + 1 busy processes got here (the nominal cores until measured)."""
    w, step_ms, data_ms = basis["workers"], basis["step_ms"], basis["data_ms"]
    share_now = basis.get("thread_share") or 1.0
    cpu_frac = basis["loader_cpu_frac"] if basis.get("loader_cpu_frac") is not None else 1.0
    data_cpu = data_ms * cpu_frac * share_now + basis["handover_send_ms"]  # CPU ms a batch, in a worker
    data_wait = data_ms * (1 - cpu_frac)
    main_cpu = (step_ms - data_ms) * share_now + basis["handover_recv_ms"]  # CPU ms a step, training thread
    cores = basis["cores_busy"]  # the cores 1, 2, … w + 1 busy processes of ours got

    def share(runnable: float) -> float:
        """A runnable thread's share of a core with `runnable` of ours at once: the baseline's own,
        scaled as the measured cores (linear between whole counts)."""
        r = min(max(runnable, 1.0), len(cores))
        low = int(r)
        got = cores[low - 1] + (cores[min(low, len(cores) - 1)] - cores[low - 1]) * (r - low)
        return min(1.0, share_now * got / r / cores[0])

    runnable, step = float(w + 1), step_ms
    for _ in range(FIXED_POINT_ROUNDS):  # the share sets the step, the step how many of ours run at once
        s = share(runnable)
        step = max(main_cpu / s, (data_cpu / s + data_wait) / w)
        runnable = (runnable + (main_cpu + data_cpu) / s / step) / 2
    return round(step_ms / step, 3)


def gemm_pct(top10: dict[str, Any], device: bool = False) -> float | None:
    """The share of a profiled step spent in matrix products and convolutions (self CPU time of
    the top-10 operators whose name holds mm, conv or matmul; with `device`, their self device
    time: on a GPU the CPU time is their launches'); None without a profile."""
    steps, step_ms = top10.get("active_steps"), (top10.get("profiled_cost") or {}).get("active_step_ms")
    if not top10.get("rows") or not steps or not step_ms:
        return None
    field = "self_device_us" if device else "self_cpu_us"
    us = sum(r.get(field, 0.0) for r in top10["rows"] if any(k in r["name"].split("::")[-1] for k in GEMM_OPS))
    return round(min(100.0, 100 * us / steps / 1e3 / step_ms), 2)


def scaled_prediction(candidate: dict[str, Any], scaling: float) -> float:
    """Amdahl: the candidate's share of the step (compute for threads, forward and backward for
    autocast) made `scaling` times faster, as a matmul showed on this machine."""
    share = candidate["compute_share"]
    return round(1.0 / (1.0 - share + share / max(scaling, 1e-9)), 3)


def first_site(sites: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The site to change: the first one in the user's code (a file and line were found)."""
    keys = ("file", "line", "source", "what", "built_by")
    return next(({k: s.get(k) for k in keys} for s in sites if s.get("file")), None)


def median_notch(seconds: list[float]) -> tuple[float, float]:
    """(median, its relative notch half-width) of a trial's counted steps."""
    median = percentile(seconds, 50)
    iqr = percentile(seconds, 75) - percentile(seconds, 25)
    return median, NOTCH * iqr / math.sqrt(len(seconds)) / median if median > 0 else 0.0


def measured(pairs: list[tuple[list[float], list[float]]], load_moves: list[float] | None = None) -> dict[str, Any]:
    """A candidate's gain from its (baseline, candidate) step-time pairs, one per round: the median
    of the rounds' ratios of medians, its noise band, and the verdict beyond that band.
    `load_moves`: per round, how much the cores other processes left the job moved between the two
    trials on a shared machine (stages/doctor.py, load_moved): the band is widened to the largest,
    since a step that had that much more or less of the cores can be that much faster or slower."""
    ratios, notches = [], []
    for base, trial in pairs:
        (b, nb), (t, nt) = median_notch(base), median_notch(trial)
        ratios.append(b / t)
        notches.append(math.hypot(nb, nt))
    gain = percentile(ratios, 50)
    spread = (max(ratios) - min(ratios)) / 2 / gain  # the rounds disagree: the machine's load moved
    load = max(load_moves or [0.0])
    noise = max(percentile(notches, 50), spread, load)
    verdict = "faster" if gain - 1 > noise else "slower" if 1 - gain > noise else "same"
    return {
        "gain": round(gain, 3),
        "noise_pct": round(100 * noise, 2),
        "rounds": [round(r, 3) for r in ratios],
        "verdict": verdict,
        **({"load_moved_pct": round(100 * load, 2)} if load else {}),
    }


def numerics(baseline_losses: list[list[float]], losses: list[float]) -> dict[str, Any]:
    """The first losses against the baseline's: within max(NUMERICS_RTOL, the baselines' own
    spread) of each other — or nothing to compare (no scalar loss reached backward())."""
    first = baseline_losses[0] if baseline_losses else []
    n = min(len(first), len(losses))
    if not n:
        return {"key": "unknown", "compared": 0}

    def rel(a: float, b: float) -> float:
        return abs(a - b) / max(abs(a), abs(b), 1e-12)

    own = max((rel(x, y) for other in baseline_losses[1:] for x, y in zip(first, other, strict=False)), default=0.0)
    tolerance = max(NUMERICS_RTOL, own)
    worst = max(rel(x, y) for x, y in zip(first[:n], losses[:n], strict=True))
    return {
        "key": "same" if worst <= tolerance else "differs",
        "compared": n,
        "max_rel_diff": worst,
        "tolerance": tolerance,
    }
