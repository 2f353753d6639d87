"""Section distributed: a data-parallel job per rank — step anatomy (compute, exposed communication,
data wait, idle), communication/compute overlap, all-reduce bytes against the gradients, and who
arrives last at each collective."""

from __future__ import annotations

from functools import partial
from typing import Any

from dlscope.report.blocks import Block, Figure, Findings, Para, Table
from dlscope.report.sections.steps import on_shared_machine
from dlscope.report.wording import worded

TITLE = "Distributed: ranks, communication, stragglers"
PARTS = (
    ("compute_ms", "compute", "#2f5bd3"),
    ("exposed_comm_ms", "exposed comm", "#d62728"),
    ("data_ms", "data wait", "#ff7f0e"),
    ("idle_ms", "idle", "#bbbbbb"),
)
PART_COLUMNS = ["comp ms", "exp ms", "data ms", "idle ms"]
LEGEND = (
    "comp: CPU operators other than communication; exp: communication while nothing else runs; data: "
    "DataLoader fetches; idle: none of these (a sleep, Python between operators); comm: all communication "
    "(c10d ops, gloo's work items on its own threads); ovl: comm overlapped by compute, HTA's |comm ∩ "
    "compute| / |comm|."
)


def anatomy_chart(ranks: list[dict[str, Any]]) -> bytes:
    from dlscope.report import plots  # matplotlib: only when a report draws

    fig, (ax,) = plots.subplots(1, width=6.5, height=0.8 + 0.45 * len(ranks))
    labels = [f"rank {r['rank']}" for r in ranks][::-1]
    left = [0.0] * len(ranks)
    for key, name, color in PARTS:
        values = [r[key] for r in ranks][::-1]
        ax.barh(labels, values, left=left, color=color, label=name)
        left = [a + b for a, b in zip(left, values, strict=True)]
    ax.set(xlabel="mean step (ms)", title="Step anatomy per rank")
    plots.legend_outside(ax)
    return plots.png(fig)


def megabytes(value: int | None) -> float | None:
    return None if value is None else round(value / 1e6, 3)


def rank_table(ranks: list[dict[str, Any]]) -> Table:
    gpu = any("gpu_overlap_pct" in r for r in ranks)
    rows = [
        [
            r["rank"],
            r["step_ms"],
            *(r[key] for key, _, _ in PARTS),
            r["comm_ms"],
            r["overlap_pct"],
            megabytes(r["comm_bytes_per_step"]),
            *([r.get("gpu_overlap_pct")] if gpu else []),
        ]
        for r in ranks
    ]
    columns = ["rank", "step ms", *PART_COLUMNS, "comm ms", "ovl %", "MB/step", *(["GPU ovl %"] if gpu else [])]
    return Table(
        columns,
        rows,
        f"Mean profiled step per rank ({ranks[0]['steps']} steps each)",
        legend=LEGEND
        + " MB/step: the collectives' payload per step."
        + (" GPU ovl: NCCL kernels overlapped." if gpu else ""),
        optional=("comm ms", "MB/step"),
    )


def step_table(steps: list[dict[str, Any]]) -> Table:
    rows = [
        [s["rank"], s["step"], s["ms"], *(s[key] for key, _, _ in PARTS), s["overlap_pct"], s["collectives"]]
        for s in steps
    ]
    return Table(
        ["rank", "step", "ms", *PART_COLUMNS, "ovl %", "coll"],
        rows,
        "Each profiled step of each rank (ProfilerStep#N)",
        legend="coll: collectives the rank launched in the step.",
        optional=("coll",),
    )


def straggler_table(stragglers: dict[str, Any]) -> Table:
    rows = [
        [r["rank"], f"{r['last']}/{r['of']}", r["median_late_ms"], r["max_late_ms"], r["mean_normalised_start"]]
        for r in stragglers["by_rank"]
    ]
    return Table(
        ["rank", "last", "med late ms", "max late ms", "norm start"],
        rows,
        "Arrival at the collectives: who enqueues last",
        legend="last: collectives this rank launched last, of all matched across ranks; late: its launch "
        "after the first rank's; norm start: (launch − first launch) ÷ mean step, averaged (HTA's measure).",
    )


def left_out_note(left_out: list[dict[str, Any]]) -> list[Block]:
    if not left_out:
        return []
    listed = ", ".join(f"rank {s['rank']} step {s['step']} ({s['ms']:.1f} ms)" for s in left_out[:6])
    return [Para(f"Left out, no collective launched (no training step): {listed}.")]


def _kinds(v: dict[str, Any]) -> str:
    """ "allgather ×21, reduce_scatter ×11": each kind of collective and how often a step (a result
    written before kinds were kept: their number)."""
    kinds = v.get("kinds")
    if not kinds:
        return f"{v['collectives_per_step']:g} collectives"
    return ", ".join(f"{kind} ×{n:g}" for kind, n in kinds.items())


def _no_straggler(v: dict[str, Any]) -> str:
    counts = ", ".join(f"rank {rank} {last}" for rank, last in v["last_by_rank"].items())
    return f"No straggler: the last rank to arrive varies ({counts} of {v['of']})."


def _exposed_comm(v: dict[str, Any]) -> str:
    overlap = f"{v['overlap_pct']:.0f}%" if v["overlap_pct"] is not None else "—"
    why = f", waiting for the straggler, rank {v['straggler']}" if v["straggler"] is not None else ""
    return (
        f"Rank {v['rank']} spends {v['exposed_comm_pct']:.0f}% of its {v['step_ms']:.1f} ms step in communication "
        f"that nothing overlaps ({v['exposed_comm_ms']:.1f} ms{why}; overlap with compute {overlap}; ≥ "
        f"{v['comm_high_pct']:.0f}% is high)."
    )


WORDS = {
    "distributed.straggler": lambda v: (
        f"Rank {v['rank']} is the straggler: it enqueued {v['last']} of {v['of']} collectives last, "
        f"a median {v['median_gap_ms']:.1f} ms after the next-latest rank ({v['step_pct']:.0f}% of the "
        f"{v['mean_step_ms']:.1f} ms mean step); the other ranks wait that long inside the collectives."
    ),
    "distributed.no_straggler": _no_straggler,
    "distributed.exposed_comm": _exposed_comm,
    "distributed.comm_bytes_unknown": lambda v: (
        "Collective bytes unknown: the traces record no tensor shapes (profile with record_shapes=True "
        "to compare them with the gradients)."
    ),
    "distributed.no_collectives": lambda v: (
        f"None of the {v['ranks']} ranks launched a collective in its profiled steps: they trained apart (the "
        "first finding of The observed command says what makes them data-parallel); the tables compare their "
        "compute alone."
    ),
    "distributed.comm_bytes": lambda v: (
        f"The collectives move {v['comm_bytes_per_step']:,} B per step per rank, {v['bytes_vs_grad']:.2f}× the "
        f"model's {v['grad_bytes']:,} B of gradients ({_kinds(v)} a step)."
    ),
}


HEADLINES = {  # the summary's words for the warnings it shows
    "distributed.straggler": lambda v: (
        f"Rank {v['rank']} is the straggler: last at {v['last']} of {v['of']} collectives, a median "
        f"{v['median_gap_ms']:.1f} ms ({v['step_pct']:.0f}% of the step) after the others, which wait for it."
    ),
    "distributed.exposed_comm": lambda v: (
        f"Rank {v['rank']} spends {v['exposed_comm_pct']:.0f}% of its {v['step_ms']:.1f} ms step in communication "
        "that nothing overlaps" + (f", waiting for rank {v['straggler']}." if v["straggler"] is not None else ".")
    ),
}


CHANGES = {  # the summary's words for the change this finding suggests
    "distributed.straggler": lambda v: (
        f"rank {v['rank']}'s pace: the other ranks wait for it at the collectives, a median "
        f"{v['median_gap_ms']:.1f} ms ({v['step_pct']:.0f}% of the step); the report's Distributed section shows its "
        "steps beside theirs."
    ),
}


TIMED = ("distributed.straggler", "distributed.no_straggler", "distributed.exposed_comm")  # rest on the step times


def timed_findings(section: dict[str, Any]) -> Findings:
    """The section's findings; those that rest on the ranks' times say so when the machine was shared."""
    shared = on_shared_machine(section.get("machine_shared"))
    return Findings(
        [
            (level, text + shared if f["key"] in TIMED else text)
            for f, (level, text) in zip(section["findings"], worded(section["findings"], WORDS).items, strict=True)
        ]
    )


def render(section: dict[str, Any]) -> list[Block]:
    if "ranks" not in section:
        return [Para(section["note"])]
    ranks = section["ranks"]
    grad = section.get("grad_bytes")
    blocks: list[Block] = [
        Para(
            f"World size {section['world_size']}, backend {section.get('backend') or 'unknown'}; "
            f"{len(ranks)} rank(s) profiled, from their own Kineto traces "
            f"({', '.join(section['traces'].values())}). Gradients: "
            f"{'—' if grad is None else f'{grad:,} B'} ({section.get('grad_bytes_source') or 'unknown'})."
        ),
        timed_findings(section),
        *left_out_note(section.get("left_out_steps", [])),
        rank_table(ranks),
        Figure("distributed_anatomy", partial(anatomy_chart, ranks), "Mean profiled step per rank"),
        step_table(section["steps"]),
    ]
    if section["stragglers"]["collectives"]:
        blocks.append(straggler_table(section["stragglers"]))
    return blocks
