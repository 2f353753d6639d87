"""Step doctor (`dlscope doctor -- CMD`): what to change in the user's script, the gain predicted
from its anatomy, and the gain measured — trials of the unchanged script, each with one change the
bootstrap applies, interleaved with baselines (A B C A B C …) and repeated as the budget allows.

    1. baseline-1: the script as run (ended after its counted steps): anatomy, sites, threads
    2. candidates the evidence supports (analysis/prescribe.py), each with its prediction
    3. rounds: [baseline, candidate, …] × R, R and the steps per trial fitted into --budget
    4. each candidate: measured gain and noise band, numerics against the baseline's losses

Trials run in scratch working directories (supervise/trials.py); the script's files are
hashed before and after. Facts out; report/sections/doctor.py words them.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from dlscope.analysis import prescribe
from dlscope.errors import ConfigError, RunDirError
from dlscope.stages import rundiff
from dlscope.stages.base import Context, Step
from dlscope.supervise.trials import MIN_STEPS, PROFILE, Stop, TrialResult, absolute_command, cores, run_trial

MARGIN_S = 3.0  # kept back from the budget: reading the trials, writing the report
BASELINE_SHARE = 0.3  # of the budget, the first observation's counted steps at most


def run(ctx: Context) -> dict[str, Any]:
    options = ctx.steps.doctor
    if options is None:
        raise ConfigError("the doctor step needs a command")
    began = time.monotonic()
    command = absolute_command(options.command, Path.cwd())
    hashes = file_hashes(command)
    n_cores = cores()

    def left() -> float:
        return options.budget_s - (time.monotonic() - began) - MARGIN_S

    trials: list[TrialResult] = []

    def trial(name: str, change: dict[str, Any], stop: Stop, profile: bool = False) -> TrialResult:
        ctx.say(f"doctor: trial {name} ({describe(change)})")
        start = time.monotonic()
        result = run_trial(ctx.run, name, command, change, stop, options.extra_env, profile)
        result.cost_s = time.monotonic() - start  # the command and dlscope's reading of it
        trials.append(result)
        return result

    # the first observation also profiles a few steps (which operators the step runs), before its counted ones
    warmup = max(options.warmup_steps, sum(PROFILE) + 1)
    first = Stop(warmup, options.max_steps, options.budget_s * BASELINE_SHARE, deadline_s=left() / 2)
    baseline = trial("baseline-1", {}, first, profile=True)
    on_gpu = cuda()  # the steps compute on a GPU (where there is one, the script uses it)
    section: dict[str, Any] = {
        "command": options.command,
        "budget_s": options.budget_s,
        "cores": n_cores,
        "load": [round(os.getloadavg()[0], 2)],  # the machine's 1-min load at the start, then at the end
        "baseline": baseline_facts(baseline, on_gpu),
    }
    if not baseline.ok:
        return finish(ctx, section, trials, began, hashes, {"key": "baseline_failed", **failure(baseline)})
    bf16 = cuda_bf16() if on_gpu else bf16_cpu()
    tried, skipped = prescribe.candidates(section["baseline"], n_cores, bf16=bf16, cuda=on_gpu)
    for candidate in tried:
        if candidate["key"] == "workers":
            basis = candidate["basis"]
            basis["cores_busy"] = cores_busy(len(basis["cores_busy"]))
            if section["baseline"]["facts"].get("batch_tensors"):
                basis["handover_send_ms"], basis["handover_recv_ms"] = handover_cost(
                    section["baseline"]["facts"]["batch_tensors"]
                )
            candidate["predicted"] = prescribe.workers_prediction(basis)
            continue
        if candidate["key"] == "threads" and candidate["basis"].get("processes", 1) > 1:
            basis = candidate["basis"]
            scaling = shared_matmul_speedup(basis["processes"], basis["threads_now"], basis["threads"])
        elif candidate["key"] == "threads":
            scaling = matmul_speedup(threads=(candidate["basis"]["threads_now"], candidate["basis"]["threads"]))
        elif candidate["key"] == "autocast" and on_gpu:
            scaling = cuda_matmul_speedup()
        elif candidate["key"] == "autocast":
            scaling = matmul_speedup(bf16=True)
        else:
            continue
        candidate["basis"]["matmul_speedup"] = scaling
        candidate["predicted"] = prescribe.scaled_prediction(candidate, scaling)
    shared = baseline.machine if baseline.machine and baseline.machine["shared"] else None
    if shared is not None:
        # predictions rest on the baseline's times and on calibrations made at that load: withheld, and
        # no candidate is left out for one (measured, each trial beside its round's baseline, they decide)
        for candidate in tried:
            candidate["withheld"] = True
    hopeless = [
        {"key": c["key"], "reason": "no_gain", "predicted": p}
        for c in tried
        if (p := c["predicted"]) <= 1 and not c.get("withheld")
    ]
    skipped = hopeless + skipped
    tried = [c for c in tried if c["predicted"] > 1 or c.get("withheld")]
    tried.sort(key=lambda c: (bool(c.get("ceiling")), -c["predicted"]))  # the ceiling only if room is left
    plan = fit(tried, baseline, left(), options.rounds)
    count = plan[1] if plan else 0
    skipped = [{"key": c["key"], "reason": "budget", "budget_s": options.budget_s} for c in tried[count:]] + skipped
    tried = tried[:count]
    if plan is not None:
        rounds, _, steady = plan
        section.update(rounds=rounds, steady_s=round(steady, 3))
        startup = max(baseline.cost_s - sum(baseline.seconds), 0.0)
        with ctx.task("doctor trials", total=rounds * (len(tried) + 1) - 1) as bar:
            for r in range(1, rounds + 1):
                order = ([] if r == 1 else [("baseline", {})]) + [(c["key"], c["change"]) for c in tried]
                if r > 1 and left() < len(order) * (startup + steady):
                    break  # a round is whole, or not run: its baseline pairs with its candidates
                for key, change in order:
                    stop = Stop(
                        options.warmup_steps, options.max_steps, steady, min(left(), 2 * (startup + steady) + 5)
                    )
                    trial(f"{key}-{r}", change, stop)
                    bar.update(advance=1)
        section["rounds"] = max(trial_round(t.name)[1] for t in trials)
    section["candidates"] = [judge(c, trials) for c in tried]
    section["not_tried"] = skipped
    found = verdict(section["candidates"])
    if found["key"] == "prescribe":
        section["diff"] = where_time_went(ctx.run.path, found["order"][0], trials)
    return finish(ctx, section, trials, began, hashes, found)


def where_time_went(run: Path, key: str, trials: list[TrialResult]) -> dict[str, Any] | None:
    """`dlscope diff` of the top prescription's last trial against the baseline of its round: the
    parts of the step the change moved, with their noise bands (the same comparison as `diff`)."""
    ok = {t.name: t for t in trials if t.ok}
    rounds = sorted((r for k, r in map(trial_round, ok) if k == key), reverse=True)
    for r in rounds:
        if f"baseline-{r}" in ok:
            try:
                section = rundiff.compare(ok[f"baseline-{r}"].run, ok[f"{key}-{r}"].run)
            except RunDirError:  # a trial too short to compare: the table above still stands
                return None
            for side in ("a", "b"):
                section[side]["path"] = str(Path(section[side]["path"]).relative_to(run))
            return section
    return None


def fit(tried: list[dict[str, Any]], baseline: TrialResult, seconds: float, most_rounds: int) -> tuple | None:
    """(rounds, candidates kept, counted seconds per trial) that fit in `seconds`: the most
    candidates (best predicted first, the ceiling last), then the most rounds, each trial given at
    least MIN_STEPS steps. A trial costs what baseline-1 cost beyond its counted steps, plus them."""
    startup = max(baseline.cost_s - sum(baseline.seconds), 0.0)
    step = prescribe.median_notch(baseline.seconds)[0]
    least = MIN_STEPS * step
    for count in range(len(tried), 0, -1):
        for rounds in range(most_rounds, 0, -1):
            runs = rounds * (count + 1) - 1  # baseline-1 is round 1's baseline
            room = seconds / runs - startup
            if room >= least:
                return rounds, count, min(room, max(sum(baseline.seconds), least))
    return None


def trial_round(name: str) -> tuple[str, int]:
    """A trial's name, `<key>-<round>`, as (key, round)."""
    key, _, r = name.rpartition("-")
    return key, int(r)


def judge(candidate: dict[str, Any], trials: list[TrialResult]) -> dict[str, Any]:
    """The candidate's trials against the baseline of the same round: gain, noise, numerics."""
    baselines = {trial_round(t.name)[1]: t for t in trials if t.ok and t.name.startswith("baseline-")}
    own = [t for t in trials if trial_round(t.name)[0] == candidate["key"]]
    paired = [(baselines[r], t) for t in own if t.ok and (r := trial_round(t.name)[1]) in baselines]
    pairs = [(b.seconds, t.seconds) for b, t in paired]
    out = {k: v for k, v in candidate.items() if k != "compute_share"}
    out["trials"] = [t.name for t in own]
    failed = [t for t in own if not t.ok]
    if failed:
        out["failed"] = failure(failed[0])
    if not pairs:
        out["measured"] = None
        return out
    out["measured"] = prescribe.measured(pairs, [load_moved(b.machine, t.machine) for b, t in paired])
    if not candidate.get("withheld"):
        out["prediction_error_pct"] = round(100 * (candidate["predicted"] / out["measured"]["gain"] - 1), 1)
    losses = [b.facts["losses"] for b in baselines.values()]
    out["numerics"] = prescribe.numerics(losses, next(t.facts["losses"] for t in own if t.ok))
    return out


def load_moved(baseline: dict[str, Any] | None, trial: dict[str, Any] | None) -> float:
    """How much the cores other processes left the job moved between a trial and its round's
    baseline (a share of the larger), where the machine was shared in either; 0 on a quiet machine."""
    if not baseline or not trial or not (baseline["shared"] or trial["shared"]):
        return 0.0
    free = (max(baseline["free_cores"], 0.0), max(trial["free_cores"], 0.0))
    return abs(free[0] - free[1]) / max(*free, 1e-9)


def verdict(judged: list[dict[str, Any]]) -> dict[str, Any]:
    """The prescription: the changes measured faster beyond noise, best first, the ceiling apart."""
    faster = [c for c in judged if c.get("measured") and c["measured"]["verdict"] == "faster" and not c.get("ceiling")]
    faster.sort(key=lambda c: -c["measured"]["gain"])
    if faster:
        return {"key": "prescribe", "order": [c["key"] for c in faster]}
    measured_ = [c["key"] for c in judged if c.get("measured") and not c.get("ceiling")]
    return {"key": "at_best", "tried": measured_}


def finish(
    ctx: Context, section: dict[str, Any], trials: list[TrialResult], began: float, hashes: dict, found: dict
) -> dict[str, Any]:
    section["trials"] = [t.to_json(ctx.run.path) for t in trials]
    section["machine"] = machine_summary(trials)
    section["verdict"] = found
    section["elapsed_s"] = round(time.monotonic() - began, 3)
    section["load"].append(round(os.getloadavg()[0], 2))
    after = file_hashes(list(hashes))
    section["script_files"] = [{"file": f, "unchanged": after.get(f) == h} for f, h in hashes.items()]
    section["refused"] = sorted({p for t in trials for p in t.facts["refused"]})
    ok = found["key"] != "baseline_failed"
    section.update(run_status="ok" if ok else "failed", exit_code=0 if ok else 1)
    return section


def machine_summary(trials: list[TrialResult]) -> dict[str, Any]:
    """What other processes took of the cores across the trials (analysis/machine.py's facts)."""
    seen = {t.name: t.machine for t in trials if t.machine}
    first = trials[0].machine if trials else None
    return {
        "trials": len(seen),
        "shared": [name for name, m in seen.items() if m["shared"]],
        "others_pct_max": max((m["others_pct"] for m in seen.values()), default=None),
        "baseline_others_pct": first["others_pct"] if first else None,
        "baseline_shared": bool(first and first["shared"]),
    }


def baseline_facts(baseline: TrialResult, on_gpu: bool = False) -> dict[str, Any]:
    return {
        "median_ms": round(prescribe.median_notch(baseline.seconds)[0] * 1e3, 4) if baseline.seconds else None,
        "gemm_pct": prescribe.gemm_pct(baseline.top10, device=on_gpu),
        "anatomy": {k: baseline.anatomy.get(k) for k in ("percent", "mean_ms", "step_ms", "data_source", "verdict")},
        "facts": {k: v for k, v in baseline.facts.items() if k not in ("wrote", "refused", "stopped")},
    }


def failure(t: TrialResult) -> dict[str, Any]:
    return {
        "trial": t.name,
        "exit_code": t.exit_code,
        "steps": len(t.seconds),
        "refused": t.facts["refused"],
        "past_deadline_s": round(t.deadline_s, 1) if t.past_deadline else None,
        "output_tail": t.facts.get("output_tail", []),
    }


def describe(change: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in change.items()) or "as written"


def file_hashes(command: list[str]) -> dict[str, str]:
    """sha256 of each file the command names (the script, its config): checked unchanged after."""
    found = {}
    for arg in command:
        path = Path(arg)
        interpreter = os.access(path, os.X_OK) and path.suffix != ".py"  # python itself, torchrun: not the user's
        if path.is_absolute() and path.is_file() and not interpreter:
            found[arg] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


def matmul_speedup(threads: tuple[int, int] | None = None, bf16: bool = False) -> float:
    """How much faster a 256×256 float matmul runs here: on threads[1] than on threads[0] threads,
    or under CPU bf16 autocast than in float32. The two are timed in turn, 7 times: the median of
    the paired ratios (a busy machine's hiccup in one timing moves one ratio, not the answer)."""
    import statistics

    import torch

    saved = torch.get_num_threads()
    a = torch.randn(256, 256)
    before, after = (threads or (saved, saved)), bf16

    def timed(n: int, autocast: bool) -> float:
        torch.set_num_threads(n)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            a @ a  # warm: the first bf16 call packs its kernels
            start = time.perf_counter()
            for _ in range(20):
                a @ a
            return time.perf_counter() - start

    try:
        ratios = [timed(before[0], False) / timed(before[1], after) for _ in range(7)]
        return round(statistics.median(ratios), 3)
    finally:
        torch.set_num_threads(saved)


def cuda_matmul_speedup() -> float:
    """How much faster a 2048×2048 matmul runs on the GPU under bf16 autocast than in float32
    (torch's default: no TF32), each timed with CUDA events, in turn, 7 times: the median of the
    paired ratios."""
    import statistics

    import torch

    a = torch.randn(2048, 2048, device="cuda")

    def timed(autocast: bool) -> float:
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            a @ a  # warm
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(20):
                a @ a
            end.record()
            end.synchronize()
            return start.elapsed_time(end)

    return round(statistics.median(timed(False) / timed(True) for _ in range(7)), 3)


def cuda_bf16() -> bool:
    """The GPU computes in bf16 natively (Ampere and later)."""
    import torch

    return torch.cuda.is_bf16_supported(including_emulation=False)


# a process standing in for one of the other training processes: 256×256 matmuls on the threads
# it is told on its standard input, line by line (0: stop)
MATMUL_NEIGHBOUR = """
import sys, threading, torch
a, told = torch.randn(256, 256), [int(sys.argv[1])]
def listen():
    for line in sys.stdin:
        told[0] = int(line)
threading.Thread(target=listen, daemon=True).start()
torch.set_num_threads(told[0]); a @ a
print("ready", flush=True)
now = told[0]
while told[0]:
    if told[0] != now:
        now = told[0]; torch.set_num_threads(now)
    a @ a
"""


SHARED_TIMED_S = 0.1  # each timing of shared_matmul_speedup


def shared_matmul_speedup(processes: int, before: int, after: int, rounds: int = 9) -> float:
    """How much faster a 256×256 float matmul runs here on `after` threads than on `before` while
    `processes` - 1 other processes run the same matmuls on as many threads (the training
    processes of a job beside each other). Both settings timed in turn, each time with the
    others switched to it: the lower quartile of the paired ratios."""
    import statistics

    import torch

    saved = torch.get_num_threads()
    a = torch.randn(256, 256)
    argv = [sys.executable, "-c", MATMUL_NEIGHBOUR, str(before)]
    pipes = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE, "text": True}
    others = [subprocess.Popen(argv, **pipes) for _ in range(processes - 1)]

    def rate(n: int) -> float:
        """Matmuls a second on n threads, the others on n too: over SHARED_TIMED_S (the threads'
        contention comes and goes over tens of ms: a few matmuls would catch one moment of it)."""
        for other in others:
            other.stdin.write(f"{n}\n")  # type: ignore[union-attr]
            other.stdin.flush()  # type: ignore[union-attr]
        torch.set_num_threads(n)
        time.sleep(0.05)  # the others on their new count
        a @ a
        done, start = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - start) < SHARED_TIMED_S:
            a @ a
            done += 1
        return done / elapsed

    try:
        for other in others:
            other.stdout.readline()  # type: ignore[union-attr]  # its torch imported, its first matmul run
        ratios = sorted(rate(after) / rate(before) for _ in range(rounds))
        # the lower quartile: the contention comes and goes (a round's ratio from ~1.5× to ~30× on
        # 2 cores), and a prediction that holds needs its low side
        return round(statistics.quantiles(ratios, n=4, method="inclusive")[0], 3)
    finally:
        torch.set_num_threads(saved)
        for other in others:
            other.kill()
            other.wait()


HANDOVER_BATCHES = 400  # batches a hand-over calibration sends, at most
HANDOVER_S = 1.5  # or for this long


def handover_cost(tensors: list[list[Any]]) -> tuple[float, float]:
    """(worker, training thread) CPU milliseconds a batch of these tensors ([shape, dtype]) costs
    to hand from a DataLoader worker to the training process — pickling into shared memory, the
    queue, unpickling — measured by a DataLoader of 2 workers whose dataset returns that batch
    ready-made: the workers' CPU (their rusage once joined) and the training thread's, a batch."""
    import resource

    import torch
    from torch.utils.data import DataLoader, Dataset

    batch = tuple(torch.zeros(shape, dtype=getattr(torch, dtype)) for shape, dtype in tensors)

    class Ready(Dataset):
        def __len__(self) -> int:
            return HANDOVER_BATCHES

        def __getitem__(self, i: int) -> tuple:
            return batch

    def children_cpu() -> float:
        use = resource.getrusage(resource.RUSAGE_CHILDREN)
        return use.ru_utime + use.ru_stime

    workers_from = children_cpu()
    iterator = iter(DataLoader(Ready(), batch_size=None, num_workers=2))
    next(iterator)  # the workers started, the first batch through
    received, start, thread_from = 0, time.perf_counter(), time.thread_time()
    for _ in iterator:
        received += 1
        if time.perf_counter() - start > HANDOVER_S:
            break
    thread_cpu = time.thread_time() - thread_from
    del iterator  # its workers joined: their CPU is in this process's children's rusage
    sent = received + 1 + 2 * 2  # and those prefetched (2 workers × prefetch 2), taken or not
    return round(1e3 * (children_cpu() - workers_from) / sent, 4), round(1e3 * thread_cpu / max(received, 1), 4)


BUSY_S = 0.25  # each count of busy processes spins this long, BUSY_ROUNDS times in turn
BUSY_ROUNDS = 2


def _spin(start: Any, shares: Any, seconds: float) -> None:
    """Busy for `seconds` once all the spinners are ready: the share of a core this one got."""
    start.wait()
    wall, cpu = time.perf_counter(), time.process_time()
    while time.perf_counter() - wall < seconds:
        pass
    shares.put((time.process_time() - cpu) / (time.perf_counter() - wall))


def cores_busy(most: int) -> list[float]:
    """The cores 1, 2, … `most` busy processes of this one's got here, now: each count spins for
    BUSY_S, all at once (each its own CPU over its own wall time: forking and joining not
    counted), the counts in turn BUSY_ROUNDS times, the median. What other jobs, a CPU quota or a
    scheduler that shares the CPUs by session (autogroup) leave a DataLoader's workers, measured."""
    import multiprocessing
    import statistics

    context = multiprocessing.get_context("fork")
    got: dict[int, list[float]] = {n: [] for n in range(1, most + 1)}
    for _ in range(BUSY_ROUNDS):
        for n in got:
            start, shares = context.Barrier(n), context.Queue()
            spinners = [context.Process(target=_spin, args=(start, shares, BUSY_S)) for _ in range(n)]
            for p in spinners:
                p.start()
            got[n].append(sum(shares.get() for _ in spinners))
            for p in spinners:
                p.join()
    return [round(statistics.median(v), 3) for v in got.values()]


def bf16_cpu() -> bool:
    """The CPU has bf16 instructions (without them, CPU autocast to bf16 is emulated: slower)."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def cuda() -> bool:
    import torch

    return torch.cuda.is_available()


STEP = Step("doctor", run)
