"""Section scaling: the job's samples/s on N ranks against one rank on the same cores as threads,
and against one rank on one rank's cores, from short interleaved trainings (stages/scaling.py)."""

from __future__ import annotations

from typing import Any

from dlscope.report.blocks import Block, Findings, Para, Table, fmt
from dlscope.report.wording import worded

TITLE = "Scaling: ranks against threads on this machine's cores"


def scaling_table(section: dict[str, Any]) -> Table:
    base = section["baseline"]
    keys = ("ranks", "threads", "samples_per_s", "speedup", "ideal", "efficiency_pct", "exposed_comm_pct")
    rows = [[r[k] for k in keys] for r in section["rows"]]
    return Table(
        ["ranks", "threads", "samples/s", "speed-up", "ideal", "eff %", "exp comm %"],
        rows,
        f"Median of {section['rounds']} rounds against {base['ranks']} rank × {base['threads']} thread(s)",
        legend="threads: per rank; ideal: cores used ÷ the baseline's; eff: speed-up ÷ ideal; exp comm: "
        "communication nothing overlaps, % of the step.",
        optional=("exp comm %",),
    )


def rounds_table(section: dict[str, Any]) -> Table:
    configs = sorted({(r["ranks"], r["threads"]) for r in section["runs"]}, key=lambda c: (c[0] * c[1], c[0]))
    by_round = {(r["round"], r["ranks"], r["threads"]): r["samples_per_s"] for r in section["runs"]}
    rows = [
        [f"{ranks} × {threads}", *(fmt(by_round[(n, ranks, threads)]) for n in range(1, section["rounds"] + 1))]
        for ranks, threads in configs
    ]
    return Table(
        ["ranks × threads", *(f"round {n}" for n in range(1, section["rounds"] + 1))],
        rows,
        "samples/s of each run, in the order the rounds ran",
    )


def _same_cores(v: dict[str, Any]) -> str:
    text = (
        f"On {v['cores']} cores, {v['fast.ranks']} rank(s) × {v['fast.threads']} thread(s) run "
        f"{v['fast.samples_per_s'] / v['slow.samples_per_s']:.2f}× the samples/s of {v['slow.ranks']} rank(s) × "
        f"{v['slow.threads']} thread(s)"
    )
    if v["multi.exposed_comm_pct"] is not None:
        text += (
            f"; the {v['multi.ranks']}-rank run spends {v['multi.exposed_comm_pct']:.0f}% of its step in exposed "
            "communication"
        )
        if v["multi.step_ms"] is not None:
            text += f" (mean profiled step {v['multi.step_ms']:.1f} ms)"
    if v["single.gemm_efficiency_pct"] is not None:
        text += (
            f"; one rank's {v['single.threads']} threads reach {v['single.efficiency_pct']:.0f}% of ideal "
            f"samples/s, and {v['single.gemm_efficiency_pct']:.0f}% of ideal on a GEMM"
        )
    return text + "."


WORDS = {"scaling.same_cores": _same_cores}


def render(section: dict[str, Any]) -> list[Block]:
    cost = section["cost"]
    return [
        Para(
            f"{section['rounds']} rounds of {len(section['rows'])} short trainings ({section['steps']} steps "
            f"of the global batch {section['batch_size']}), each launched by torchrun as the job is; "
            f"samples/s of the training steps only. Measuring took {cost['wall_seconds']:.0f} s in "
            f"{cost['launches']} launches, {cost['train_seconds']:.1f} s of it training steps."
        ),
        scaling_table(section),
        shared_runs(worded(section["findings"], WORDS), section.get("machine_shared")),
        rounds_table(section),
    ]


def shared_runs(found: Findings, shared: dict[str, Any] | None) -> Findings:
    """The findings, each saying it rests on runs during which others took a material share of the cores."""
    if not shared:
        return found
    note = (
        f" Measured on a shared machine: other processes took up to {shared['others_pct_max']:.0f}% of the "
        f"{shared['cores']} cores during {shared['runs']} of the runs, so a split's samples/s are partly the "
        "others' doing."
    )
    return Findings([(level, text + note) for level, text in found.items])
