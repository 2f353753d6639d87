"""Section anatomy (`dlscope run`): the mean step split into data, gap, forward, backward,
optimizer and other, and the verdict on input — worded here from the facts the analysis measured
(a key, a level, the numbers and the thresholds it used)."""

from __future__ import annotations

from typing import Any

from dlscope.findings import Finding
from dlscope.report.blocks import Block, Findings, Method, Para, Table
from dlscope.report.sections.batches import READY_PCT
from dlscope.report.sections.steps import PARTS, mebibytes, on_shared_machine

TITLE = "Step anatomy"
LEVEL_STYLE = {"highly": "bad", "moderately": "warn", "not": "good"}
PART_NAMES = {
    "data": "data (inside a data source)",
    "gap": "gap (before the first training forward)",
    "forward": "forward",
    "backward": "backward",
    "optimizer": "optimizer",
    "other": "other",
}


def verdict(v: dict[str, Any], shared: dict[str, Any] | None = None) -> tuple[str, str]:
    """The finding for the analysis's verdict facts: its level and its sentence, numbers shown
    (`shared`: the machine was shared while the steps ran, analysis/machine.py)."""
    level, text = _verdict(v)
    return level, text + on_shared_machine(shared)


def _verdict(v: dict[str, Any]) -> tuple[str, str]:
    if v.get("clock") == "gpu":
        over = f"{v['step_ms']:.3g} ms mean step over {v['steps']} steps, on the GPU's clock"
    else:
        over = f"{v['step_ms']:.3g} ms mean step over {v['steps']} steps, dlscope's own cost taken out"
    if v["key"] == "input_bound":
        t = v["thresholds_pct"]
        level = v["level"]
        said = {"highly": "HIGHLY input-bound", "moderately": "MODERATELY input-bound", "not": "NOT input-bound"}
        text = (
            f"Your program is {said[level]}: {v['data_pct']:.1f}% of the step ({v['data_ms']:.3g} ms; {over}) "
            "is spent in the DataLoader (its __next__, and the __iter__ that starts a pass's workers), waiting for "
            f"a batch. Thresholds: ≥ {t['highly']:.0f}% highly, "
            f"{t['moderately']:.0f}–{t['highly']:.0f}% moderately (TensorFlow's input-pipeline analyser)."
        )
        if v.get("batches_elsewhere"):
            text += (
                f" Another thread of the process also drew from a DataLoader ({v['batches_elsewhere']} calls of "
                "its __next__: a prefetcher's): that time is the thread's, not the loop's."
            )
        ready = v.get("batches_ready_pct")
        if level != "not" and ready is not None and ready >= READY_PCT:
            text += (
                f" Yet the workers had {ready:.1f}% of the batches built before the loop asked for them (see "
                "Batches): the wait goes to handing batches over (received and unpickled in this process) or "
                "to waiting for a core, not to building them, and more workers would not shorten it."
            )
        return LEVEL_STYLE[level], text
    elsewhere = v.get("batches_elsewhere", 0)
    seen = (
        "The steps' thread drew no batch from a DataLoader: another thread of the process drew them (a "
        f"prefetcher's: {elsewhere} calls of DataLoader's __next__), so the loop's wait for them, if any, is "
        "not timed inside a DataLoader. "
        if elsewhere
        else "No data source was seen (no DataLoader iterated), so nothing is said about input: the loop may "
        "prefetch, build its batches in the loop body or read no data at all. "
    )
    text = (
        f"{seen}The gap between a step's start and its first training forward is {v['gap_pct']:.1f}% of the "
        f"step ({v['gap_ms']:.3g} ms; {over}); it holds whatever the loop does there (zero_grad, moving a "
        f"batch, {'taking a batch from the prefetcher, ' if elsewhere else ''}forwards without grad such as "
        "a target network's, Python work)"
    )
    if v["gap_holds_update"]:
        text += (
            ", and, with no torch optimizer (a step ends at backward() or autograd.grad), the weight "
            "update as well (Keras's optimizer, a hand-written SGD)"
        )
    return "info", text + "."


def render(section: dict[str, Any]) -> list[Block]:
    if not section.get("steps_used"):
        return [Para("No training step was seen, so there is no step anatomy.")]
    loader = section["data_source"] == "loader"
    parts = [p for p in PARTS if p not in ("data", "gap") or section["mean_ms"][p] or (p == "data" and loader)]
    rows = [[PART_NAMES[p], section["mean_ms"][p], section["percent"][p]] for p in parts]
    on_gpu = section.get("clock") == "gpu"
    if on_gpu:  # the host's shares beside: where the host's clock put the GPU's time
        rows = [[*row, section["host_percent"].get(p, 0.0)] for row, p in zip(rows, parts, strict=True)]
    used = {
        "steady": "the steady steps (not the first, not the profiler's warm-up and active ones)",
        "all": "all steps (too few to leave out the first and the profiled ones)",
    }[section["used"]]
    if section.get("census_steps"):  # a subnormal census counted values there (steps.py says why)
        used = used[:-1] + f", not the {section['census_steps']} step(s) a subnormal census ran in)"
    own = section.get("dlscope_us_per_step")
    cost = (
        f"dlscope's own cost, calibrated in the process at start: {own:.1f} µs a step, taken out of the step "
        'and of "other" before the shares.'
        if own is not None
        else "dlscope's own cost per step was not calibrated in this process: the shares include it."
    )
    memory = f"Peak RSS in a step: {mebibytes(section['peak_rss_bytes'])} MB."
    if section.get("peak_cuda_bytes") is not None:
        memory += f" Peak CUDA memory: {mebibytes(section['peak_cuda_bytes'])} MB."
    if on_gpu:  # the clocks explain the table's columns: said beside it
        clocks = (
            "The script trains on CUDA, so the parts are timed on the GPU's clock: a CUDA event recorded at each "
            "point the host's clock is read, each step's read once its events completed (no synchronisation "
            "inside a step). On the host's clock (last column) a part's kernels are only queued; their time "
            "lands wherever the script next waits for the GPU (a .item(), a copy, a full launch queue). See GPU."
        )
        return [
            Findings([verdict(section["verdict"], section.get("machine_shared"))]),
            Table(["part", "GPU ms", "% of step", "host %"], rows, f"Mean step anatomy over {used}"),
            Para(f"{clocks} {memory}"),
        ]
    return [
        Findings([verdict(section["verdict"], section.get("machine_shared"))]),
        Table(["part", "mean ms", "% of step"], rows, f"Mean step anatomy over {used}"),
        Para(memory),
        Method(cost),
    ]


def summary_findings(section: dict[str, Any], sections: dict[str, Any]) -> list[Finding]:
    """The input's change, where the loop waits for its batches a moderate share of the step or more;
    its gain at most the step with the input made free, 1 / (1 - data share)."""
    v = section.get("verdict") or {}
    if not section.get("steps_used") or v.get("key") != "input_bound" or v["level"] == "not":
        return []
    loaders = [lo for lo in (sections.get("batches") or {}).get("loaders") or [] if lo.get("in_steps")]
    values = {
        "data_pct": v["data_pct"],
        "gain": 100 / max(100 - v["data_pct"], 1e-9),
        "ready_pct": v.get("batches_ready_pct"),
        "workers": max((lo.get("num_workers") or 0 for lo in loaders), default=None),
        "cores": ((sections.get("steps") or {}).get("threads") or {}).get("cores"),
    }
    return [Finding("anatomy.input", "bad" if v["level"] == "highly" else "warn", values)]


def _input_change(v: dict[str, Any]) -> str:
    """Where the wait goes decides the change: batches built ahead wait in their hand-over; with
    fewer workers than cores, more build at once; with as many, each batch must cost less."""
    waits, gain = f"the loop waits {v['data_pct']:.1f}% of the step for batches", f"up to {v['gain']:.3g}×"
    if v["ready_pct"] is not None and v["ready_pct"] >= READY_PCT:
        return (
            f"the batches' hand-over: {waits} its workers had built ahead ({v['ready_pct']:.0f}% of them), so more "
            f"workers would not help ({gain} if the input were free)."
        )
    if v["workers"] is not None and v["cores"] is not None and v["workers"] >= v["cores"]:
        return (
            f"cheaper batches: {waits}, and its {v['workers']} workers already have the {v['cores']} cores; each "
            f"batch must cost less to build ({gain} if the input were free; see the report's Batches)."
        )
    now = f" (num_workers={v['workers']} now)" if v["workers"] is not None else ""
    return f"more DataLoader workers{now}: {waits} ({gain} if the input were free)."


CHANGES = {"anatomy.input": _input_change}  # the summary's words for the change this finding suggests
