"""Section doctor (`dlscope doctor`): the prescription — each change tried, its predicted and
measured gain, the noise, the numerics, the exact edit at the line of the user's script — what was
not tried and why, and the trials themselves. Worded here from the step's facts."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

from dlscope.report.blocks import Block, Code, Para, Table
from dlscope.report.sections import rundiff
from dlscope.report.wording import Words, worded

TITLE = "Doctor: what to change, predicted and measured"
CHANGE_NAMES = {
    "workers": "DataLoader num_workers",
    "input_free": "input made free (ceiling)",
    "threads": "intra-op threads",
    "set_to_none": "zero_grad(set_to_none=True)",
    "pin_memory": "pinned memory, non-blocking copies",
    "persistent_workers": "DataLoader persistent_workers",
    "prefetch_factor": "DataLoader prefetch_factor",
    "channels_last": "channels-last memory format",
    "autocast": "bf16 autocast (alters numerics)",
    "compile": "torch.compile",
    "batch": "a larger batch",
}
REASONS = {
    "no_loader": lambda v: "no DataLoader fed the training steps: nothing to tune on the input side",
    "input_cheap": lambda v: (
        f"input is {v['data_pct']:.1f}% of the step, under {v['threshold_pct']:.0f}%: nothing to gain there"
    ),
    "one_core": lambda v: "one core: a worker process would compete with training for it",
    "workers_enough": lambda v: f"already {v['workers']} workers for {v['cores']} cores",
    "threads_at_cores": lambda v: f"already {v['threads']} threads for {v['cores']} cores",
    "threads_at_share": lambda v: (
        f"already {v['threads']} thread(s) in each of the {v['processes']} training processes, for {v['cores']} cores"
    ),
    "already_none": lambda v: "zero_grad already sets gradients to None",
    "not_built": lambda v: "this version of doctor does not try it",
    "no_gpu": lambda v: "no GPU: pinned memory only speeds host-to-device copies",
    "no_copies": lambda v: "no copy from the CPU to the GPU in the counted steps (.to/.cuda)",
    "copies_async": lambda v: "the copies to the GPU are already from pinned memory and non-blocking",
    "no_loader_to_pin": lambda v: (
        "the tensors copied to the GPU are not pinned and no DataLoader built them: pin them where they are "
        "made (tensor.pin_memory()), then copy with non_blocking=True"
    ),
    "no_bf16": lambda v: (
        "this GPU has no native bf16 (before Ampere): autocast would be emulated"
        if v.get("device") == "cuda"
        else "this CPU has no bf16 instructions (avx512_bf16, amx_bf16): autocast would be emulated"
    ),
    "gemm_small": lambda v: (
        f"matrix products and convolutions are {v['pct']:.0f}% of the step (under "
        f"{v['threshold_pct']:.0f}%): bf16 would speed up too little"
    ),
    "no_profile": lambda v: "the baseline's profiled steps did not say which operators the step runs",
    "no_gain": lambda v: f"predicted {v['predicted']:.2f}× from this machine's measurements: no gain to measure",
    "budget": lambda v: f"no room left in the {v['budget_s']:.0f} s budget (--budget)",
}


# a setting a trainer library offers for an argument of the DataLoader it builds
LIBRARY_SETTINGS = {"num_workers": {"transformers": "TrainingArguments(dataloader_num_workers=...)"}}


def _gain(v: Mapping[str, Any]) -> str:
    predicted = "prediction withheld: shared machine" if v.get("withheld") else f"predicted {v['predicted']:.2f}×"
    return f"{v['gain']:.2f}× measured ({predicted}, noise ±{v['noise_pct']:.1f}%)"


def _shared(v: Mapping[str, Any]) -> str:
    """Other processes took a material share of the cores during the trials (analysis/machine.py)."""
    text = (
        f"The machine was shared while doctor measured: other processes took up to {v['others_pct_max']:.0f}% of "
        f"the {v['cores']} cores, a material share in {len(v['shared'])} of its {v['trials']} trials."
    )
    if v["baseline_shared"]:
        text += (
            f" Its first run among them (others took {v['baseline_others_pct']:.0f}%): the predictions, which rest "
            "on that run's times and on calibrations made at that load, are withheld, and every change was "
            "measured whatever it predicted."
        )
    return text + (
        " A gain's noise band is widened by how much the cores left to the script moved between a change's trial "
        "and its round's baseline; measure again on a quiet machine before relying on a small one."
    )


WORDS: Words = {
    "doctor.prescribe": lambda v: f"Change {v['name']}: {_gain(v)}; the edit is below.",
    "doctor.also": lambda v: f"Also faster: {v['name']}, {_gain(v)}.",
    "doctor.at_best": lambda v: (
        f"Already at its best as far as doctor can tell: none of the {v['tried']} change(s) tried beat the noise."
        if v["tried"]
        else "Already at its best as far as doctor can tell: the baseline shows nothing the changes it knows would "
        "improve (see what was not tried, and why)."
    ),
    "doctor.input_left": lambda v: (
        f"No change doctor tried made it faster ({', '.join(v['tried'])}), yet input made free runs "
        f"{v['gain']:.2f}× (below): the time is in building the batches themselves — a cheaper dataset "
        "__getitem__ or collate, or batches built once and kept — which doctor does not edit."
    ),
    "doctor.ceiling": lambda v: (
        f"Input made free (the first batches replayed from memory) runs {_gain(v)}: the "
        "most any input-side fix can give."
    ),
    "doctor.numerics": lambda v: (
        f"{v['name']} changes the first losses by up to {100 * v['max_rel_diff']:.2g}% "
        f"(tolerance {100 * v['tolerance']:.2g}%): check its accuracy before adopting it."
    ),
    "doctor.failed": lambda v: (
        f"The trial {v['trial']} did not finish its steps (exit status {v['exit_code']}, {v['steps']} steps)."
    ),
    "doctor.baseline_failed": lambda v: (
        f"The script ran past the {v['past_deadline_s']:.0f} s doctor gave its first run (within --budget) "
        "and was ended: nothing could be measured; give a larger --budget."
        if v.get("past_deadline_s")
        else f"The script did not reach its counted steps under doctor (exit status {v['exit_code']}, "
        f"{v['steps']} steps): nothing could be measured."
        + (f" Its last words: {' / '.join(v['output_tail'][-2:])}" if v.get("output_tail") else "")
    ),
    "doctor.refused": lambda v: (
        f"The script wrote outside its scratch directory: {', '.join(v['paths'])} — refused "
        "(a trial never overwrites your files); make the path relative or configurable to let doctor measure it."
    ),
    "doctor.changed": lambda v: f"The script file {v['file']} changed while doctor ran.",
    "doctor.shared": _shared,
    "doctor.busy": lambda v: (
        f"The machine was busy (load {v['load']:.1f} on {v['cores']} cores): other jobs "
        "took cores the trials shared. The workers prediction counts the cores our processes got when it was made, "
        "but a load that moves between trials moves what gains that need idle cores (workers, threads) "
        "measure; measure again when it is quieter."
    ),
}


def findings(section: dict[str, Any]) -> list[dict[str, Any]]:
    verdict = section["verdict"]
    judged = {c["key"]: c for c in section.get("candidates", [])}
    found = []
    if verdict["key"] == "baseline_failed":
        found.append({"key": "doctor.baseline_failed", "level": "bad", "values": verdict})
    elif verdict["key"] == "prescribe":
        for i, key in enumerate(verdict["order"]):
            c = judged[key]
            values = {"name": CHANGE_NAMES[key], "predicted": c["predicted"], "withheld": c.get("withheld")}
            values.update(c["measured"])
            found.append({"key": "doctor.also" if i else "doctor.prescribe", "level": "good", "values": values})
    else:
        ceiling = next((c for c in judged.values() if c.get("ceiling") and c.get("measured")), None)
        if ceiling is not None and ceiling["measured"]["verdict"] == "faster":  # input still costs what it did
            tried = [
                f"{CHANGE_NAMES[k]}: {judged[k]['measured']['gain']:.2f}×"
                if judged.get(k, {}).get("measured")
                else CHANGE_NAMES[k]
                for k in verdict["tried"]
            ]
            found.append(
                {"key": "doctor.input_left", "level": "info", "values": {"tried": tried, **ceiling["measured"]}}
            )
        else:
            found.append({"key": "doctor.at_best", "level": "good", "values": {"tried": len(verdict["tried"])}})
    for c in judged.values():
        if c.get("ceiling") and c.get("measured"):
            values = {"predicted": c["predicted"], "withheld": c.get("withheld"), **c["measured"]}
            found.append({"key": "doctor.ceiling", "level": "info", "values": values})
        if (c.get("numerics") or {}).get("key") == "differs" and not c.get("ceiling"):
            found.append(
                {"key": "doctor.numerics", "level": "warn", "values": {"name": CHANGE_NAMES[c["key"]], **c["numerics"]}}
            )
        if c.get("failed"):
            found.append({"key": "doctor.failed", "level": "warn", "values": c["failed"]})
    if section.get("refused"):
        found.append({"key": "doctor.refused", "level": "warn", "values": {"paths": section["refused"]}})
    machine = section.get("machine")
    if machine is not None:  # measured (a run by an older dlscope has the load average alone)
        if machine["shared"]:
            found.append({"key": "doctor.shared", "level": "warn", "values": {**machine, "cores": section["cores"]}})
    elif (busiest := max(section.get("load") or [0.0])) > section.get("cores", 1):
        found.append({"key": "doctor.busy", "level": "warn", "values": {"load": busiest, "cores": section["cores"]}})
    for f in section.get("script_files", []):
        if not f["unchanged"]:
            found.append({"key": "doctor.changed", "level": "bad", "values": f})
    return found


def snippet(candidate: dict[str, Any]) -> str:
    """The exact edit: the user's line as written and as changed, named by file:line."""
    name, value = candidate["argument"]
    site = candidate.get("site")
    if candidate["key"] == "autocast":
        device = candidate["change"].get("autocast_device", "cpu")
        return (
            "# around the forward and the loss, in the training loop (bf16 alters numerics: check accuracy)\n"
            f"with torch.autocast({device!r}, dtype=torch.bfloat16):\n    loss = loss_fn(model(x), y)"
        )
    if candidate["key"] == "pin_memory":  # the loader's argument, and the copies that can then overlap
        loader = argument_edit(name, value, site)
        return f"{loader}\n# and where each batch moves to the GPU:\nx = x.to(device, non_blocking=True)"
    if candidate["key"] == "threads" and candidate["basis"].get("processes", 1) > 1:
        basis = candidate["basis"]
        return (
            f"# in each of the {basis['processes']} training processes, before it trains (they ran "
            f"{basis['threads_total']} threads on {basis['cores']} cores)\n"
            f"import torch\ntorch.set_num_threads({value})  # or launch with OMP_NUM_THREADS={value}"
        )
    if candidate["key"] == "threads":
        now = candidate["basis"]["threads_now"]
        return f"import torch\ntorch.set_num_threads({value})  # once, before training (the script ran on {now})"
    return argument_edit(name, value, site)


def argument_edit(name: str, value: Any, site: dict[str, Any] | None) -> str:
    """`name=value` passed at the call `site` records (a DataLoader's, a zero_grad's): the line
    as written and as changed, or where to pass it when the line cannot be rewritten."""
    if not site:
        return f"# the call was built outside your code: pass {name}={value!r}"
    relative = os.path.relpath(site["file"])
    where = f"# {site['file'] if relative.startswith('..') else relative}:{site['line']}"
    line = site.get("source")
    if site.get("built_by"):  # a library built it (a trainer): the change goes through its own setting
        library = site["built_by"]
        how = LIBRARY_SETTINGS.get(name, {})
        setting = next((hint for part, hint in how.items() if f"/{part}/" in library), None)
        return f"{where}  (the {site['what']} is built inside {library})\n" + (
            f"# set {setting.replace('...', repr(value))}" if setting else f"# pass {name}={value!r} to it"
        )
    if line is None:
        return f"{where}\n# pass {name}={value!r} to the {site['what']} built here"
    pattern = rf"\b{re.escape(name)}\s*=\s*[^,)]+"
    if re.search(pattern, line):
        changed = re.sub(pattern, f"{name}={value!r}", line, count=1)
    elif site["what"].endswith("zero_grad") and "zero_grad()" in line:
        changed = line.replace("zero_grad()", f"zero_grad({name}={value!r})", 1)
    elif line.rstrip().endswith(")"):
        stripped = line.rstrip()
        changed = f"{stripped[:-1]}, {name}={value!r})"
    else:
        return f"{where}\n{line}\n# add {name}={value!r} to this {site['what']} call"
    return f"{where}\n- {line.strip()}\n+ {changed.strip()}"


def pinned_basis(b: dict[str, Any]) -> str:
    """How the pinned-copies prediction was made, in the baseline's measured terms."""
    return (
        f"Pinned copies predicted from: {b['copies_per_step']:g} copies to the GPU a step "
        f"({b['mb_per_step']:.3g} MB; {b['pinned_pct']:.0f}% from pinned memory, {b['blocking_pct']:.0f}% "
        f"blocking) held the host {b['copy_ms']:.3g} ms of the {b['step_ms']:.3g} ms step; made non-blocking, "
        "at most that much is saved (the GPU still copies them, and a later wait for it, a loss.item(), "
        "may take some back): an upper bound, which the trial measures."
    )


def workers_basis(b: dict[str, Any]) -> str:
    """How the workers prediction was made, in the baseline's measured terms."""
    cpu = b.get("loader_cpu_frac")
    share = b.get("thread_share")
    fetch = f"{b['data_ms']:.3g} ms of fetching a step" + ("" if cpu is None else f" ({100 * cpu:.0f}% on a CPU)")
    busy = ", ".join(f"{n}: {c:.2f}" for n, c in enumerate(b["cores_busy"], 1))
    return (
        f"Workers predicted from: {fetch} moved to {b['workers']} workers; handing a batch over costs "
        f"{b['handover_send_ms']:.2f} ms of a worker's CPU and {b['handover_recv_ms']:.2f} ms of the training "
        "thread's (measured on a DataLoader of this batch's tensors); the training thread had "
        + ("a whole core" if share is None or share >= 0.95 else f"{share:.2f} of a core")
        + f", and busy processes of ours got these cores here (processes: cores) {busy}"
        + (
            "."
            if (idle := b.get("machine_idle_frac")) is None
            else f"; the CPUs were {100 * idle:.0f}% idle in the first run."
        )
    )


def _rounded(value: float | None, digits: int) -> float | int | None:
    """A number cell (right-aligned, '—' when missing) at the precision its measurement carries."""
    return None if value is None else round(value, digits or None)


def render(section: dict[str, Any]) -> list[Block]:
    blocks: list[Block] = [worded(findings(section), WORDS)]
    base = section["baseline"]
    anatomy = base.get("anatomy") or {}
    if base.get("median_ms") is not None:
        pct = anatomy.get("percent") or {}
        shares = ", ".join(
            f"{p} {pct[p]:.0f}%" for p in ("data", "forward", "backward", "optimizer", "other") if p in pct
        )
        text = (
            f"Baseline (the script as written): median step {base['median_ms']:.3g} ms; {shares}; "
            f"{section['cores']} cores."
        )
        blocks.append(Para(text))
    candidates = section.get("candidates", [])
    if candidates:
        rows = [
            [
                CHANGE_NAMES[c["key"]],
                None if c.get("withheld") else _rounded(c["predicted"], 2),
                _rounded((m := c.get("measured") or {}).get("gain"), 2),
                _rounded(m.get("noise_pct"), 0),
                " ".join(f"{r:.2f}" for r in m.get("rounds", [])) or "—",
                m.get("verdict", "failed"),
                (c.get("numerics") or {}).get("key", "—"),
            ]
            for c in candidates
        ]
        blocks.append(
            Table(
                ["change", "predicted ×", "measured ×", "noise ±%", "rounds ×", "verdict", "numerics"],
                rows,
                "Each change against the baseline of its round (interleaved)",
                legend="measured: median of the rounds' ratios of median steps; noise: the notch of the median "
                "(1.58·IQR/√n) of both trials, or half the range of the rounds' ratios if wider; faster/slower "
                "only beyond it. numerics: the first losses against the baseline's.",
                optional=("rounds ×", "numerics"),
            )
        )
    workers = next((c for c in candidates if c["key"] == "workers"), None)
    if workers is not None and "cores_busy" in workers["basis"]:  # runs before the hand-over was measured: none
        blocks.append(Para(workers_basis(workers["basis"])))
    pinned = next((c for c in candidates if c["key"] == "pin_memory"), None)
    if pinned is not None:
        blocks.append(Para(pinned_basis(pinned["basis"])))
    for key in section["verdict"].get("order", []):
        c = next(c for c in candidates if c["key"] == key)
        blocks.append(Code(snippet(c), "diff"))
    diff = section.get("diff")
    if diff:
        text = (
            f"Where the time went, the top change against its round's baseline (`dlscope diff "
            f"{diff['a']['path']} {diff['b']['path']}`):"
        )
        blocks.append(Para(text))
        blocks += rundiff.render(diff, limit=5)
    not_tried = section.get("not_tried", [])
    if not_tried:
        rows = [[CHANGE_NAMES[s["key"]], REASONS[s["reason"]](s)] for s in not_tried]
        blocks.append(Table(["not tried", "why"], rows, "What was not tried, and why"))
    trials = section.get("trials", [])
    if trials:
        rows = [
            [t["name"], _rounded(t["median_ms"], 2), t["steps"], round(t["wall_s"], 1), "ok" if t["ok"] else "failed"]
            for t in trials
        ]
        blocks.append(Table(["trial", "median ms", "steps", "wall s", "status"], rows, "The trials, in the order run"))
    unchanged = all(f["unchanged"] for f in section.get("script_files", []))
    wrote = sum(t["wrote"]["count"] for t in trials)
    text = (
        f"{len(trials)} trials in {section['elapsed_s']:.0f} s of a {section['budget_s']:.0f} s budget, each in a "
        "scratch working directory of its own that reads as yours (removed after it: "
        f"{wrote} file(s) the script wrote there), each a "
        f"run directory under trials/. The script's files are {'unchanged' if unchanged else 'CHANGED'} (sha256)."
    )
    blocks.append(Para(text))
    return blocks
