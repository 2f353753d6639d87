"""The summary of a `dlscope run`: the answer first, one screen at 80 columns, and the first section of
its report.

    what bounds the step, with its share       the anatomy's shares (communication, when a rank's
                                                communication that nothing overlaps outweighs its compute)
    the change most likely to pay               the sections' CHANGES, the highest gain first
      and `dlscope doctor -- CMD` to measure it
    warnings                                    the sections' HEADLINES, of findings at warn or bad

A finding reaches the summary by registration, never by a case written here. A section module
offers its findings (key, level, values) with `summary_findings(section, sections)`, or they are
its stored `findings`; its `HEADLINES` table words in one short sentence each finding it promotes
when the finding's level is warn or bad (those in its `FIRST` come before what bounds the step,
with the failures: ranks that trained apart are not the training the launch meant), and its
`CHANGES` table words each change a finding suggests (`values["gain"]`: the step's speed-up at
most, where measured). The full sentences, the
tables and the reasoning stay in the sections; sentences on dlscope's own cost and method go to
"How this was measured" (blocks.Method)."""

from __future__ import annotations

from collections.abc import Iterator
from types import ModuleType
from typing import Any

from dlscope.findings import Finding
from dlscope.report.blocks import Block, Code, Findings, Para, fmt
from dlscope.rundir import SCHEMA_VERSION

SUMMARY = ("summary", "Summary")
PROMOTED = ("bad", "warn")  # the levels at which a registered finding becomes a warning of the summary
MAX_WARNINGS = 4  # shown; the others are counted and left to the report
DOCTOR = "`dlscope doctor`, which tries each change it can make and measures its gain:"
BOUND_LEVEL = {"highly": "bad", "moderately": "warn", "not": "info"}


def summary_blocks(results: dict[str, Any]) -> list[Block]:
    """The summary of a run's results (a `dlscope run`'s: one with a "run" section), else nothing;
    nothing either for results an older dlscope wrote that this one cannot read (their report says
    so, section by section)."""
    if "run" not in results["sections"]:
        return []
    try:
        return summary_of(results)
    except (KeyError, TypeError, ValueError, IndexError):
        if results["schema_version"] >= SCHEMA_VERSION:
            raise
        return []


def summary_of(results: dict[str, Any]) -> list[Block]:
    """How the command ended; its failures (a hang, a straggler); what bounds the step; the change
    most likely to pay, for a command that ran to its end or until the user stopped it; the other
    warnings."""
    sections = results["sections"]
    offered = list(offered_findings(results))
    bound = verdict(sections, offered)
    run = sections["run"]
    ran = steps_seen(sections) and (run.get("exit_code") == 0 or bool(run.get("interrupted")))
    best = best_change(offered) if ran else None
    said = [bound[2] if bound is not None else None, best[1] if best is not None else None]  # not said twice
    every = promoted([(m, f) for m, f in offered if not any(f is s for s in said)])
    warnings = every[:MAX_WARNINGS]
    blocks: list[Block] = [Para(headline(sections))]
    failures = [w[:2] for w in warnings if w[0] == "bad" or w[2]]  # and what every verdict rests on
    if failures:
        blocks.append(Findings(failures))
    if bound is not None:
        blocks.append(Findings([bound[:2]]))
    if ran:
        blocks += change_blocks(sections, best)
    if len(warnings) > len(failures):
        blocks.append(Findings([w[:2] for w in warnings if not (w[0] == "bad" or w[2])]))
    more = len(every) - len(warnings)
    if more:
        blocks.append(Para(f"{more} more warning{'s' * (more != 1)} in the report."))
    return blocks


def promoted(offered: list[tuple[ModuleType, Finding]]) -> list[tuple[str, str, bool]]:
    """The warnings: each registered finding at a promoted level, as (level, sentence, whether its
    module says it FIRST): those said first, then failures, in the report's order; of several with
    one key (ten slow files), the first, said to have more like it."""
    first: dict[str, tuple[str, str, bool]] = {}
    alike: dict[str, int] = {}
    for module, f in offered:
        if f.level in PROMOTED and f.key in getattr(module, "HEADLINES", {}):
            if f.key in first:
                alike[f.key] = alike.get(f.key, 0) + 1
            else:
                first[f.key] = (f.level, module.HEADLINES[f.key](f.values), f.key in getattr(module, "FIRST", ()))
    said = [
        (level, text + (f" ({alike[key]} more like it in the report.)" if key in alike else ""), head)
        for key, (level, text, head) in first.items()
    ]
    return sorted(said, key=lambda w: (not w[2], PROMOTED.index(w[0])))  # stable: the report's order within


def offered_findings(results: dict[str, Any]) -> Iterator[tuple[ModuleType, Finding]]:
    """Each section's findings with its module, in the report's order."""
    from dlscope.report.sections import SECTIONS

    sections = results["sections"]
    for key in results.get("steps") or list(sections):
        module, section = SECTIONS.get(key), sections.get(key)
        if module is None or section is None:
            continue
        offer = getattr(module, "summary_findings", None)
        if offer is not None:
            found = offer(section, sections)
        else:
            stored = section.get("findings")
            found = [Finding.from_json(f) for f in stored] if isinstance(stored, list) else []
        yield from ((module, f) for f in found)


def steps_seen(sections: dict[str, Any]) -> bool:
    return bool((sections.get("anatomy") or {}).get("steps_used"))


def headline(sections: dict[str, Any]) -> str:
    """The command, how it ended and its steps: "`python train.py`: exit status 0 after 5.47 s; 15
    training steps (pid 21265), median 59.4 ms."."""
    run, steps = sections["run"], sections.get("steps") or {}
    text = (
        f"`{' '.join(run.get('command', []))}`: exit status {run.get('exit_code')} after "
        f"{fmt(float(run.get('wall_seconds', 0)))} s"
    )
    if steps.get("count"):
        median = steps["percentiles_ms"]["p50_ms"]
        text += f"; {steps['count']:,} training steps (pid {steps['main_pid']}), median {fmt(median)} ms"
    return text + "."


def verdict(sections: dict[str, Any], offered: list[tuple[ModuleType, Finding]]) -> tuple[str, str, Any] | None:
    """What bounds the step, with its share: (level, sentence, the finding it rests on if one was
    offered, so it is not said again as a warning); measured on a shared machine, it says so."""
    found = bound(sections, offered)
    shared = (sections.get("anatomy") or {}).get("machine_shared")
    if found is None or not shared:
        return found
    said = f" (Measured on a shared machine: other processes took {shared['others_pct']:.0f}% of the cores.)"
    return found[0], found[1] + said, found[2]


def bound(sections: dict[str, Any], offered: list[tuple[ModuleType, Finding]]) -> tuple[str, str, Any] | None:
    """What bounds the step, with its share (verdict's)."""
    anatomy = sections.get("anatomy") or {}
    if not anatomy.get("steps_used"):
        return None
    pct, step = anatomy["percent"], anatomy["step_ms"]
    clock = " on the GPU's clock" if anatomy.get("clock") == "gpu" else ""
    loader = anatomy.get("data_source") == "loader"
    data = pct.get("data", 0.0) if loader else 0.0
    compute = sum(pct.get(p, 0.0) for p in ("forward", "backward", "optimizer"))
    loop = sum(pct.get(p, 0.0) for p in ("gap", "other")) + (0.0 if loader else pct.get("data", 0.0))
    comm = main_rank_exposed(sections, offered)
    if comm is not None:
        v = comm.values
        if v["exposed_comm_pct"] >= max(data, loop, compute - v["exposed_comm_pct"]):
            waits = f", waiting for rank {v['straggler']}" if v.get("straggler") is not None else ""
            return (
                "warn",
                f"Communication bounds the step: rank {v['rank']} spends {v['exposed_comm_pct']:.0f}% of its "
                f"{fmt(v['step_ms'])} ms profiled step in communication that nothing overlaps{waits}.",
                comm,
            )
    level = (anatomy.get("verdict") or {}).get("level", "not")
    if loader and data >= max(compute, loop):
        highly = anatomy["verdict"]["thresholds_pct"]["highly"]
        return (
            BOUND_LEVEL[level],
            f"Input bounds the step: the loop waits for a batch in the DataLoader {data:.1f}% of the "
            f"{fmt(step)} ms mean step{clock} ({level.upper()} input-bound; ≥ {highly:.0f}% is highly).",
            None,
        )
    if loop > compute:
        return (
            "info",
            f"The loop's own work bounds the step: {loop:.1f}% of the {fmt(step)} ms mean step{clock} is in none "
            f"of {'the DataLoader, ' if loader else ''}forward, backward or optimizer (the loop's Python, "
            f"zero_grad, {'logging' if loader else 'building or moving a batch'}, or any other work there).",
            None,
        )
    # steps that end at backward(): no optimizer step was seen, so no optimizer share was measured
    unseen = (sections.get("steps") or {}).get("source") == "backward"
    parts = ", ".join(f"{p} {pct.get(p, 0.0):.0f}%" for p in ("forward", "backward", "optimizer")[: 2 if unseen else 3])
    text = f"Compute bounds the step: {parts} of the {fmt(step)} ms mean step{clock}."
    if unseen:
        text += (
            " No optimizer step was seen (each step ends at its backward()): a weight update the script"
            f" writes itself outside torch.no_grad() is in the {pct.get('gap', 0.0):.0f}% before the next forward."
        )
    top = (sections.get("top10") or {}).get("rows") or []
    if top:
        name, share = top[0]["name"].removeprefix("aten::"), top[0]["self_cpu_pct"]
        text += f" Top operator: {name}, {share:.0f}% of the operators' own time in the profiled steps."
    if loader:
        said = f" ({level.upper()} input-bound)" if level != "not" else ""
        text += f" The DataLoader's wait: {data:.1f}%{said}."
    return "info", text, None


def main_rank_exposed(sections: dict[str, Any], offered: list[tuple[ModuleType, Finding]]) -> Finding | None:
    """The distributed section's finding on the training process's rank's exposed communication."""
    main = (sections.get("steps") or {}).get("main_pid")
    rank = next((p["rank"] for p in sections["run"].get("processes", []) if p["pid"] == main), None)
    if rank is None:
        return None
    return next((f for _, f in offered if f.key == "distributed.exposed_comm" and f.values["rank"] == rank), None)


def best_change(offered: list[tuple[ModuleType, Finding]]) -> tuple[ModuleType, Finding] | None:
    """The change most likely to pay: the highest gain; one without a measured gain after any with
    one, in the report's order."""
    changes = [(module, f) for module, f in offered if f.key in getattr(module, "CHANGES", {})]
    return max(changes, key=lambda c: c[1].values.get("gain") or 0.0) if changes else None


def change_blocks(sections: dict[str, Any], best: tuple[ModuleType, Finding] | None) -> list[Block]:
    """The change most likely to pay, and `dlscope doctor` to measure it."""
    doctor = Code(f"dlscope doctor -- {' '.join(sections['run'].get('command', []))}", "bash")
    if best is None:
        return [Para(f"No one change stands out in what this run measured; ask {DOCTOR}"), doctor]
    module, finding = best
    return [Para(f"Most likely to pay: {module.CHANGES[finding.key](finding.values)} Measure it with {DOCTOR}"), doctor]
