"""Section steps (`dlscope run`): the training steps of the observed script, summarised from its
step file — percentiles, percentiles over the run's windows, when the step time changed, the
slowest steps, the first and last ones."""

from __future__ import annotations

from functools import partial
from typing import Any

from dlscope.findings import Finding
from dlscope.report.blocks import Block, Figure, Findings, Method, Para, Table, fmt

TITLE = "Training steps"
SKIPPED_WARN_PCT = 1.0  # GradScaler skips past the start of the run, in % of the steps: a warning from this
PARTS = ("data", "gap", "forward", "backward", "optimizer", "other")
FORWARDS_MOVED = 1.2  # the forwards a step moved by this factor or more: the work a step changed
CARRIES = 0.6  # a part whose median moved by this share of the step's median carries the change
ALIKE = 1.3  # parts whose ratios are all within this factor of the step's ratio moved alike
SHOWN_PCT = 5.0  # a part under this share of the step on both sides is left out of a change's text
SHARED_SLOWER = 1.5  # steps beside other training processes this much slower than alone: a warning
# a census's subnormal share of the float values its step made, from which they are the slowdown's
# cause: an operator with subnormal operands runs ~7-170× slower on a CPU (BENCHMARKS.md), so
# 0.1% of them can cost ~10% of a step
SUBNORMAL_PCT = 0.1
# a change's words, by its direction
SLOWER_WORDS = {
    "count": "more",
    "grew": "grew",
    "amount": "more",
    "length": "longer",
    "speed": "slower",
    "machine": "busier",
}
FASTER_WORDS = {
    "count": "fewer",
    "grew": "shrank",
    "amount": "less",
    "length": "shorter",
    "speed": "faster",
    "machine": "quieter",
}
SHORT = {"data": "data", "gap": "gap", "forward": "fwd", "backward": "bwd", "optimizer": "opt", "other": "other"}


def on_shared_machine(shared: dict[str, Any] | None) -> str:
    """What a verdict that rests on the steps' times adds when the machine was shared (analysis/machine.py)."""
    if not shared:
        return ""
    return (
        f" Measured on a shared machine: other processes took {shared['others_pct']:.0f}% of the job's "
        f"{shared['cores']} cores while the steps ran (The observed command says more)."
    )


def mebibytes(value: int | None) -> float | None:
    return None if value is None else round(value / 2**20, 1)


def instrumented(row: dict[str, Any]) -> str:
    """What of dlscope's ran in a step and slowed it: the profiler's phase, a subnormal census."""
    return ", ".join(filter(None, [row["profiled"], "census" if row.get("census") else None]))


def step_rows(rows: list[dict[str, Any]], parts: tuple[str, ...]) -> list[list[Any]]:
    return [
        [r["step"], r["ms"], *(r[f"{p}_ms"] for p in parts), mebibytes(r["peak_rss_bytes"]), instrumented(r)]
        for r in rows
    ]


def shown_parts(section: dict[str, Any]) -> tuple[str, ...]:
    """The parts that hold time in this run (gap only when some step had no data source)."""
    rows = section.get("edge_rows", []) + section.get("slowest", [])
    return tuple(p for p in PARTS if p not in ("data", "gap") or any(r[f"{p}_ms"] for r in rows))


def windows_chart(windows: list[dict[str, Any]], changes: list[dict[str, Any]]) -> bytes:
    from dlscope.report import plots  # matplotlib: only when a report draws

    fig, (ax,) = plots.subplots(1, width=6.5, height=2.8)
    steps = [w["first"] for w in windows]
    for key, label in (("p50_ms", "median"), ("p90_ms", "p90"), ("max_ms", "max")):
        ax.plot(steps, [w[key] for w in windows], label=label, drawstyle="steps-post")
    for c in changes:
        ax.axvline(c["step"], color="grey", linestyle=":", linewidth=1)
    ax.set_yscale("log")
    ax.set(xlabel="step", ylabel="step time (ms)", title="Step time per window of the run (dotted: a change)")
    plots.legend_outside(ax)
    return plots.png(fig)


def shown_in_change(change: dict[str, Any]) -> list[str]:
    """The parts a change's text names: those holding SHOWN_PCT of the step on either side."""
    parts = change["parts_ms"]
    return [p for p in PARTS if max(parts[p]) >= SHOWN_PCT / 100 * max(change["before_ms"], change["after_ms"])]


def carrying_part(change: dict[str, Any]) -> str | None:
    """The part whose median moved by CARRIES of the step's change or more, if one did."""
    parts = change.get("parts_ms")
    delta = change["after_ms"] - change["before_ms"]
    if not parts or not delta:
        return None
    carrier = max(shown_in_change(change), key=lambda p: (parts[p][1] - parts[p][0]) / delta, default=None)
    return carrier if carrier is not None and (parts[carrier][1] - parts[carrier][0]) / delta >= CARRIES else None


def change_parts(change: dict[str, Any]) -> tuple[str, bool]:
    """Which parts a change in step time is in — one part carrying most of it, every part alike
    (more of the same work, or a process slower as a whole), or several — and whether the work a
    step does explains it: the forwards a step moved with it, by as much as the step time or more."""
    parts = change.get("parts_ms")
    if not parts:
        return "", False
    before, after = change["before_ms"], change["after_ms"]
    delta, ratio = after - before, after / before
    w = SLOWER_WORDS if delta > 0 else FASTER_WORDS
    shown = shown_in_change(change)
    moves = ", ".join(f"{p} {fmt(parts[p][0])} → {fmt(parts[p][1])} ms" for p in shown)
    calls = change.get("forwards") or [0, 0]
    # the forwards a step moved with the step time, by as much as a change is: more (or less) work a step
    work = min(calls) > 0 and (calls[1] - calls[0]) * delta > 0 and max(calls) >= FORWARDS_MOVED * min(calls)
    explained = work and max(ratio, 1 / ratio) <= ALIKE * max(calls) / min(calls)
    ran = f"each step ran {w['count']} forwards (median {calls[0]:g} → {calls[1]:g})"
    carrier = carrying_part(change)
    if carrier is not None:
        return f"the change is in {carrier} ({moves})" + (f"; {ran}" if work else ""), explained
    alike = all(min(parts[p]) > 0 and 1 / ALIKE <= parts[p][1] / parts[p][0] / ratio <= ALIKE for p in shown)
    if not (shown and alike):
        return f"spread over several parts ({moves})" + (f"; {ran}" if work else ""), explained
    if work:
        return (
            f"every part {w['grew']} alike ({moves}) and {ran}: each step did {w['amount']} work "
            f"(a {w['length']} episode, {w['count']} micro-batches), not {w['speed']} work"
        ), explained
    same = f" with the same forwards a step ({calls[0]:g})" if calls[0] and calls[0] == calls[1] else ""
    return (
        f"every part {w['grew']} alike ({moves}){same}: each step did {w['amount']} of the same work "
        f"(a {w['length']} sequence or batch), or the whole process ran {w['speed']} (a {w['machine']} "
        "machine, a changed clock)"
    ), False


def scaler_skipped(skipped: dict[str, Any], steps: int) -> tuple[str, str]:
    """The GradScaler's skipped steps: expected while the loss scale comes down at the start (and
    one now and then as it grows back); a warning when more than SKIPPED_WARN_PCT of the steps
    past that start were skipped."""
    n, leading, first = skipped["count"], skipped["leading"], skipped["first_steps"]
    later = n - leading
    where = step_ranges(first) + (", …" if n > len(first) else "")
    text = (
        f"{n} of {steps} steps were skipped by the GradScaler: it found inf or NaN gradients and did not call "
        f"the optimizer's step (step{'s' if n > 1 else ''} {where}). Each is still a step here: its forward "
        "and backward ran."
    )
    if 100.0 * later / steps >= SKIPPED_WARN_PCT:
        return "warn", (
            f"{text} {later} of them ({100.0 * later / steps:.2g}% of the steps) came after the start of the run, "
            f"past the ≥ {SKIPPED_WARN_PCT:g}% where this warns: float16 gradients overflowing again and again, or "
            "NaN losses (a model diverging, a learning rate too high)."
        )
    if leading:
        text += (
            f" The first {leading} are the loss scale coming down from its initial value until float16 holds the "
            "gradients, as at the start of any mixed-precision training."
        )
    return "info", text


def eval_mode_steps(moded: dict[str, Any], steps: int) -> tuple[str, str]:
    """Training steps whose model ran in eval mode: a model.train() missing after an evaluation."""
    n, layers = moded["steps"], ", ".join(moded["layers"])
    span = f"step {moded['first']}" if n == 1 else f"steps {moded['first']}–{moded['last']}"
    return "warn", (
        f"{n} of {steps} steps trained {moded['module']} in eval mode ({span}): its forward ran with grad while "
        f"the module was in eval mode, and the optimizer stepping updates its parameters, so its {layers} "
        "layers behaved as in evaluation (no dropout; batch norm with its running statistics, which are not "
        "updated). A model.train() missing after an evaluation? If on purpose (batch norm frozen for "
        "fine-tuning), nothing to change."
    )


def step_ranges(steps: list[int]) -> str:
    """0, 1, 2, 5, 7, 8 → "0–2, 5, 7–8"."""
    runs: list[list[int]] = []
    for step in steps:
        if runs and step == runs[-1][1] + 1:
            runs[-1][1] = step
        else:
            runs.append([step, step])
    return ", ".join(f"{a}–{b}" if b > a else f"{a}" for a, b in runs)


def subnormal_finding(census: dict[str, Any], shared: dict[str, Any] | None = None) -> tuple[str, str]:
    """A census of a step run after the steps' CPU time grew (subnormals.py): whether subnormal
    floats are why, from what it counted, and what to change. `shared`: the machine was shared
    (analysis/machine.py), which grows a step's CPU time too."""
    sampled, subnormal = census["sampled"], census["subnormal"]
    pct = 100 * subnormal / sampled if sampled else 0.0
    slowed = (
        f"The steps' CPU time grew from {fmt(census['lowest_cpu_ms'])} ms to {fmt(census['slowed_cpu_ms'])} ms a "
        f"step (rolling medians, all the process's threads; wall time {fmt(census['lowest_ms'])} → "
        f"{fmt(census['slowed_ms'])} ms)"
    )
    if shared:
        slowed += (
            f" — on a shared machine (other processes took {shared['others_pct']:.0f}% of the job's "
            f"{shared['cores']} cores while the steps ran), where an intra-op thread that waits for a core keeps "
            "the others spinning: CPU time that grows with the machine's load, not with the script's work"
        )
    slowed += (
        f". Step {census['step']} ran under a census of the float values its "
        f"operators made (slower for it: left out of the anatomy, marked in the step tables): "
    )
    if census.get("error"):
        why = "another dispatch mode was entered above it" if census["error"] == "mode_above" else census["error"]
        return "info", slowed + f"it stopped counting ({why})."
    counted = f"{sampled:,} values" + (f" sampled of {census['values']:,}" if sampled < census["values"] else "")
    load = " The machine's load is the likelier cause." if shared else ""
    if not subnormal:
        return "info", slowed + f"none of {counted} was subnormal: not subnormal floats.{load}"
    if pct < SUBNORMAL_PCT:
        return "info", slowed + f"{subnormal:,} of {counted} were subnormal ({pct:.3g}%), too few to be why.{load}"
    makers = [o for o in census["ops"] if o["subnormal"]]
    named = ", ".join(
        f"{o['op']} ({100 * o['subnormal'] / o['sampled']:.3g}% of its {o['values']:,} values, "
        f"{o['calls']} call{'s' if o['calls'] > 1 else ''})"
        for o in makers[:3]
    )
    return "warn", slowed + (
        f"{pct:.3g}% of {counted} were subnormal (below the smallest normal float, 1.2e-38 in float32), "
        f"made by {named}. A CPU computes with subnormal floats in microcode, many times slower. Call "
        "torch.set_flush_denormal(True) at the start of the script, before its first forward: it sets "
        "flush-to-zero in the calling thread and the threads started after it, and subnormals become zeros "
        f"(a change below 1.2e-38 in the numbers). Predicted: ~{fmt(census['lowest_ms'])} ms a step again (the "
        "wall time a step where its CPU time was lowest); measure it with dlscope run and dlscope diff."
    )


def oversubscribed(beside: dict[str, Any] | None) -> bool:
    """More intra-op threads among the processes training at once than cores."""
    if not beside or beside.get("threads_total") is None or beside.get("cores") is None:
        return False
    return beside["threads_total"] > beside["cores"]


def sharing_finding(beside: dict[str, Any], main: int, machine_shared: dict[str, Any] | None = None) -> tuple[str, str]:
    """Processes that trained at once: their threads against the cores, and this process's step
    beside them and alone where both were seen (`machine_shared`: on a machine others shared too)."""
    pids, cores, total = beside["pids"], beside["cores"], beside["threads_total"]
    others = ", ".join(str(p) for p in pids[1:])
    text = f"{len(pids)} processes trained at once on this machine (pid {main} and {others})"
    over = oversubscribed(beside)
    if total is not None and cores is not None:
        counts = sorted({beside["threads"][str(p)] for p in pids})
        each = f"{counts[0]} each" if len(counts) == 1 else "between them"
        text += f", with {total} intra-op threads ({each}, torch.get_num_threads) on {cores} cores"
        text += (
            ": oversubscribed — a thread waits for a core, and each process's waiting threads spin on the cores "
            "the others need."
            if over
            else "."
        )
    else:
        text += "."
    alone, shared = beside["alone_ms"], beside["shared_ms"]
    slower = alone is not None and shared is not None and shared >= SHARED_SLOWER * alone
    if alone is not None and shared is not None:
        text += (
            f" This process's median step was {fmt(shared)} ms while another trained ({beside['shared_steps']} "
            f"steps) and {fmt(alone)} ms alone ({beside['alone_steps']} steps): {shared / alone:.3g}×."
        )
    else:
        text += " No stretch of this process's steps ran alone, to compare the steps beside the others' with."
    if over:
        share = max(cores // len(pids), 1)
        text += (
            f" Give each process its share of the cores: torch.set_num_threads({share}) in each, before it "
            "trains (or OMP_NUM_THREADS, as torchrun sets it); `dlscope doctor` tries it and measures the gain."
        )
    return ("warn" if over or slower else "info"), text + on_shared_machine(machine_shared)


def change_findings(section: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    """Each change point of the step time: its level, its sentence and the change itself."""
    # where an optimizer that stepped after another one took over: a change there is its steps'
    taking_over = {o["first"]: (n, o["class"]) for n, o in enumerate(section.get("optimizers_in_sequence", [])) if n}
    changes = []
    for c in section["change_points"]:
        text = (
            f"From step {c['step']} ({c['start_s']:.1f} s into the run) the median step went from "
            f"{fmt(c['before_ms'])} ms to {fmt(c['after_ms'])} ms ({c['after_ms'] / c['before_ms']:.3g}×)"
        )
        over = next((taking_over[s] for s in (c["step"], c["step"] - 1, c["step"] + 1) if s in taking_over), None)
        where, more_work = change_parts(c)
        if over is not None:
            changes.append(("info", f"{text}: where optimizer {over[0] + 1} ({over[1]}) takes over.", c))
        else:
            level = "info" if more_work else "warn" if c["after_ms"] > c["before_ms"] else "good"
            said = (f"{text}: {where}." if where else f"{text}.") + on_shared_machine(section.get("machine_shared"))
            if oversubscribed(section.get("sharing")):  # the likelier cause, said above
                said += " Other processes trained at once on too few cores (above): their contention comes and goes."
            changes.append((level, said, c))
    return changes


def thread_change(section: dict[str, Any]) -> dict[str, Any] | None:
    """The intra-op threads `dlscope doctor` would try: each process training at once its share of
    the cores, or one training alone all of them (when it has fewer); None where they are so."""
    own, beside = section.get("threads"), section.get("sharing")
    if own is None:
        return None
    if beside:
        if beside.get("threads_total") is None:
            return None  # another process's threads are not known
        share = max(own["cores"] // len(beside["pids"]), 1)
        if own["threads"] == share:
            return None
        return {"threads": own["threads"], "to": share, "cores": own["cores"], "processes": len(beside["pids"])}
    if sum(1 for p in section["processes"] if p["count"]) > 1:
        return None  # other processes stepped too, too briefly to say whether beside this one (ranks of a short job)
    if own["threads"] < own["cores"]:
        return {"threads": own["threads"], "to": own["cores"], "cores": own["cores"], "processes": 1}
    return None


def summary_findings(section: dict[str, Any], sections: dict[str, Any]) -> list[Finding]:
    """The warnings of the steps (a slowdown that stays, processes contending for the cores, skipped
    or eval-mode steps, subnormal floats) and the changes they suggest, as facts."""
    if not section.get("count"):
        return []
    found = [
        Finding(
            "steps.slowdown",
            "warn",
            {k: c[k] for k in ("step", "start_s", "before_ms", "after_ms")} | {"part": carrying_part(c)},
        )
        for level, _, c in change_findings(section)
        if level == "warn"
    ]
    beside = section.get("sharing")
    if beside and sharing_finding(beside, section["main_pid"])[0] == "warn":
        slower = beside["shared_ms"] / beside["alone_ms"] if beside["shared_ms"] and beside["alone_ms"] else None
        values = {"processes": len(beside["pids"]), "threads_total": beside["threads_total"], "cores": beside["cores"]}
        found.append(Finding("steps.sharing", "warn", values | {"over": oversubscribed(beside), "slower": slower}))
    skipped = section.get("scaler_skipped")
    if skipped and scaler_skipped(skipped, section["count"])[0] == "warn":
        found.append(Finding("steps.scaler_skipped", "warn", {"later": skipped["count"] - skipped["leading"]}))
    moded = section.get("eval_mode_steps")
    if moded:
        found.append(Finding("steps.eval_mode", "warn", {k: moded[k] for k in ("steps", "module", "first", "last")}))
    for census in section.get("subnormals", []):
        if subnormal_finding(census)[0] == "warn":
            values = {k: census[k] for k in ("step", "lowest_ms", "slowed_ms")}
            values["pct"] = 100 * census["subnormal"] / census["sampled"]
            values["gain"] = census["slowed_ms"] / census["lowest_ms"]
            found.append(Finding("steps.subnormals", "warn", values))
    threads = thread_change(section)
    if threads is not None and (sections.get("anatomy") or {}).get("clock") != "gpu":
        found.append(Finding("steps.threads", "info", threads))
    return found


def _span(v: dict[str, Any]) -> str:
    return f"step {v['first']}" if v["first"] == v["last"] else f"steps {v['first']}–{v['last']}"


HEADLINES = {  # the summary's words for the warnings it shows
    "steps.slowdown": lambda v: (
        f"The step slowed for good from step {v['step']} ({v['start_s']:.0f} s in): median {fmt(v['before_ms'])} → "
        f"{fmt(v['after_ms'])} ms ({v['after_ms'] / v['before_ms']:.3g}×)"
        + (f", in {v['part']}." if v["part"] else ".")
    ),
    "steps.sharing": lambda v: (
        f"{v['processes']} processes trained at once on this machine"
        + (f", {v['threads_total']} intra-op threads on {v['cores']} cores: oversubscribed" if v["over"] else "")
        + (f"; this process's step was {v['slower']:.3g}× slower beside them" if v["slower"] else "")
        + "."
    ),
    "steps.scaler_skipped": lambda v: (
        f"The GradScaler skipped {v['later']} steps past the start of the run (inf or NaN gradients): float16 "
        "overflowing again and again, or a diverging loss."
    ),
    "steps.eval_mode": lambda v: (
        f"{v['steps']} steps trained {v['module']} in eval mode ({_span(v)}): a model.train() missing after an "
        "evaluation?"
    ),
    "steps.subnormals": lambda v: (
        f"Subnormal floats: {v['pct']:.3g}% of the values step {v['step']} made were subnormal, and the steps slowed "
        f"from {fmt(v['lowest_ms'])} to {fmt(v['slowed_ms'])} ms."
    ),
}
CHANGES = {  # the summary's words for the changes these findings suggest
    "steps.threads": lambda v: (
        f"torch.set_num_threads({v['to']}) in each of the {v['processes']} processes that train at once (one has "
        f"{v['threads']} intra-op threads now, on {v['cores']} cores)."
        if v["processes"] > 1
        else f"torch.set_num_threads({v['to']}): the training process computes with {v['threads']} intra-op "
        f"thread{'s' * (v['threads'] != 1)} on {v['cores']} cores."
    ),
    "steps.subnormals": lambda v: (
        "torch.set_flush_denormal(True) at the start of the script: subnormal floats slowed the steps; predicted "
        f"~{fmt(v['lowest_ms'])} ms a step again ({v['gain']:.3g}×)."
    ),
}


def render(section: dict[str, Any]) -> list[Block]:
    source = {
        "optimizer": "optimizer steps (calls of a torch optimizer's step)",
        "backward": "backward() or autograd.grad calls (no optimizer)",
        "update": "the script's own parameter updates (no torch optimizer: "
        + ", ".join(
            (
                f"the writes through .data from {p['file']}:{p['line']} in {p['function']} (outside torch.no_grad())"
                if p.get("kind") == "data"
                else f"the torch.no_grad() block at {p['file']}:{p['line']} in {p['function']}"
            )
            + f", {p['steps']} steps"
            for p in section.get("update_places", [])
        )
        + "; each one's time is the step's optimizer part)",
    }
    if not section.get("count"):
        return [
            Para(
                "No training step was seen: no process ran an optimizer step, a backward(), or an "
                "autograd.grad not kept differentiable."
            )
        ]
    per_process = ", ".join(f"pid {p['pid']}: {p['count']}" for p in section["processes"] if p["count"])
    parts = shown_parts(section)
    header = ["step", "ms", *(SHORT[p] for p in parts), "MB", "profiler"]
    q = section["percentiles_ms"]
    changes = [(level, text) for level, text, _ in change_findings(section)]
    shared = section.get("machine_shared")
    blocks: list[Block] = [
        Para(
            f"{section['count']} steps in the training process (pid {section['main_pid']}), counted from "
            f"{source[section['source']]}. All processes with steps: {per_process}. Every step is a row of "
            f"{section['file']}."
        ),
        Table(
            ["min", "median", "p90", "p99", "max", "mean"],
            [[q["min_ms"], q["p50_ms"], q["p90_ms"], q["p99_ms"], q["max_ms"], q["mean_ms"]]],
            "Step time (ms) over all steps",
        ),
        Findings(changes or [("good", "The step time did not change for good at any point of the run.")]),
    ]
    if section.get("sharing"):
        blocks.insert(1, Findings([sharing_finding(section["sharing"], section["main_pid"], shared)]))
    if section.get("subnormals"):
        blocks.append(Findings([subnormal_finding(c, shared) for c in section["subnormals"]]))
    in_turn = section.get("optimizers_in_turn")
    if in_turn:
        names = ", ".join(f"{o['class']} ({o['steps']} steps)" for o in in_turn)
        blocks.insert(
            1,
            Findings(
                [
                    (
                        "info",
                        f"{len(in_turn)} torch optimizers stepped in turn: {names}. Each step of any of "
                        f"them is a step here, so a loop iteration that steps each once (a GAN's "
                        f"discriminator and generator, an actor and a critic) is {len(in_turn)} steps, and "
                        "the step times and shares are per optimizer step.",
                    )
                ]
            ),
        )
    moded = section.get("eval_mode_steps")
    if moded:
        blocks.insert(1, Findings([eval_mode_steps(moded, section["count"])]))
    skipped = section.get("scaler_skipped")
    if skipped:
        blocks.insert(1, Findings([scaler_skipped(skipped, section["count"])]))
    in_sequence = section.get("optimizers_in_sequence")
    if in_sequence:
        ranges = ", ".join(
            f"{o['class']} (step {o['first']})"
            if o["steps"] == 1
            else f"{o['class']} (steps {o['first']}–{o['first'] + o['steps'] - 1})"
            for o in in_sequence
        )
        blocks.insert(
            1,
            Findings(
                [
                    (
                        "info",
                        f"{len(in_sequence)} torch optimizers stepped one after another, each taking "
                        f"over from the one before: {ranges} (a sweep's or k-fold's models, say, or an "
                        "optimizer made anew each epoch). Read the step times per optimizer.",
                    )
                ]
            ),
        )
    if len(section["windows"]) >= 4:
        chart = partial(windows_chart, section["windows"], section["change_points"])
        blocks.append(Figure("steps_over_time", chart, "Step time over the run (windows)"))
    blocks += [
        Table(header, step_rows(section["slowest"], parts), f"The {len(section['slowest'])} slowest steps (ms)"),
        Table(
            header,
            step_rows(section["edge_rows"], parts),
            "First and last steps (ms; data = inside a DataLoader, gap = before the first training forward when "
            "no data source was seen; MB = peak RSS in the step)",
        ),
        Method(
            f"Each step is a row of {section['file']} ({section['row_bytes']} bytes; StepFile in "
            "dlscope.analysis.stepfile reads it, or numpy/pandas with the dtype in its header)."
        ),
    ]
    return blocks
