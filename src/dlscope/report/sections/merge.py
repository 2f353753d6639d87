"""Section merge (`dlscope merge`): one job on several machines — the straggler and what it costs the
others, a hang's verdict across hosts, then per host (clock offset, step) and per rank (step,
anatomy, arrival), the slowest steps, and where the Parquet dataset is."""

from __future__ import annotations

import os
from typing import Any

from dlscope.report.blocks import Block, Code, Para, Table
from dlscope.report.sections.hang import line_of
from dlscope.report.wording import worded

TITLE = "One job across machines: ranks, hosts, stragglers"
SHOWN = 12  # hosts and ranks in a table: past it, the slowest (every one is in results.json and parquet/)


def _ranks(ranks: list[int]) -> str:
    """0-3, 5, 8-9: a list of ranks, runs folded."""
    out, run = [], []
    for r in sorted(ranks):
        if run and r == run[-1] + 1:
            run.append(r)
            continue
        if run:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 2 else ", ".join(map(str, run)))
        run = [r]
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 2 else ", ".join(map(str, run)))
    return ", ".join(out)


def _straggler(v: dict[str, Any]) -> str:
    return (
        f"Straggler: rank {v['rank']} on {v['host']} launches {v['last']:,} of {v['of']:,} collectives last; each "
        f"step the other {v['others']} ranks wait {v['cost_ms']:.1f} ms for it at the step's last collective "
        f"({v['step_pct']:.0f}% of their {v['others_step_ms']:.1f} ms step)."
    )


def _no_straggler(v: dict[str, Any]) -> str:
    counts = ", ".join(f"rank {r['rank']} {r['last']}" for r in v["last_by_rank"])
    return f"No straggler: the last rank to launch varies ({counts} of {v['matched']:,} collectives)."


def _hang(v: dict[str, Any]) -> str:
    never = v["never_arrived"]
    names = []
    for r in never:
        how = "died" if r["died"] else f"is at {line_of(r['where'])}"
        names.append(f"rank {r['rank']} on {r['host']} never arrived: it {how}")
    waiting = (
        f"ranks {_ranks(v['reached'])} reached {v['op']} #{v['seq']}"
        if v["reached"]
        else "no rank entered a collective"
    )
    text = f"Hung across hosts: {waiting}; " + ("; ".join(names) if names else "every captured rank entered it")
    if v["not_captured"]:
        text += f"; no host captured ranks {_ranks(v['not_captured'])}"
    return text + "."


def _offsets(v: dict[str, Any]) -> str:
    return (
        f"Clocks: {v['hosts']} host(s) measured against {v['reference']}, from collectives that end together; "
        f"the farthest, {v['farthest']}, is {v['ms']:+.3f} ms off. Times across hosts are corrected by them."
    )


WORDS = {
    "merge.straggler": _straggler,
    "merge.no_straggler": _no_straggler,
    "merge.no_collectives": lambda v: (
        f"No collective recorded on {v['ranks']} rank(s): no arrival order, no clock offsets."
    ),
    "merge.hang": _hang,
    "merge.missing_ranks": lambda v: (
        f"Missing: ranks {_ranks(v['ranks'])} — no directory given holds their records; the analysis is of the rest."
    ),
    "merge.clock_offsets": _offsets,
}


def _ms(value: float | None) -> str | float:
    return "" if value is None else round(value, 1)


def _slowest(rows: list[dict[str, Any]], keep: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """All the rows when few; else the SHOWN slowest (mean step), in their order, and `keep`."""
    if len(rows) <= SHOWN:
        return rows
    slow = sorted(rows, key=lambda r: -(r["step_ms"] or 0))[:SHOWN]
    chosen = {id(r) for r in slow} | ({id(keep)} if keep is not None else set())
    return [r for r in rows if id(r) in chosen]


def _of(shown: list[dict[str, Any]], every: list[dict[str, Any]], what: str) -> str:
    return "" if len(shown) == len(every) else f" ({len(shown)} of {len(every)} {what}: the slowest)"


def host_table(section: dict[str, Any]) -> Table:
    rows = []
    straggler = section["collectives"]["straggler"]
    keep = next((h for h in section["hosts"] if straggler and h["host"] == straggler["host"]), None)
    shown = _slowest(section["hosts"], keep)
    for h in shown:
        offset = h["offset"]
        rows.append(
            [
                h["host"],
                _ranks(h["ranks"]),
                f"{offset['ms']:+.3f}" if offset else ("0 (ref)" if h["host"] == section["reference_host"] else ""),
                f"{offset['q3_ms'] - offset['q1_ms']:.3f}" if offset else "",
                _ms(h["step_ms"]),
                _ms(h["data_ms"]),
            ]
        )
    return Table(
        ["host", "ranks", "clock ms", "± ms", "step ms", "data ms"],
        rows,
        "Per host" + _of(shown, section["hosts"], "hosts"),
        legend="clock: the host's clock minus the reference host's, the median over the collectives every rank "
        "waits for of the gap between the two hosts' completions; ±: the spread of those gaps (interquartile); "
        "step, data: mean steady step and its data wait over the host's ranks.",
        optional=("± ms", "data ms"),
    )


def rank_table(section: dict[str, Any]) -> Table:
    last = {r["rank"]: r for r in section["collectives"]["last_by_rank"]}
    matched = section["collectives"]["matched"]
    straggler = section["collectives"]["straggler"]
    keep = next((r for r in section["ranks"] if straggler and r["rank"] == straggler["rank"]), None)
    shown = _slowest(section["ranks"], keep)
    rows = [
        [
            str(r["rank"]),  # a name, not a quantity: no thousands separator
            r["host"],
            r["steps"],
            _ms(r["step_ms"]),
            _ms(r["p95_ms"]),
            _ms(r["data_ms"]),
            _ms(r["forward_ms"]),
            _ms(r["backward_ms"]),
            _ms(r["optimizer_ms"]),
            _ms(r["other_ms"]),
            f"{last[r['rank']]['last']}/{matched}" if r["rank"] in last else (f"0/{matched}" if matched else ""),
        ]
        for r in shown
    ]
    return Table(
        ["rank", "host", "steps", "step ms", "p95 ms", "data", "fwd", "bwd", "opt", "other", "last"],
        rows,
        "Per rank (steady steps: not the first, not profiled)" + _of(shown, section["ranks"], "ranks"),
        legend="step, p95: mean and 95th percentile; data … other: the step's anatomy, mean ms; last: the "
        "collectives it launched last of those every rank launched.",
        optional=("p95 ms", "steps", "other"),
    )


def slowest_table(slowest: list[dict[str, Any]]) -> Table:
    rows = [
        [str(s["rank"]), s["host"], s["step"], s["ms"], s["data_ms"], s["forward_ms"], s["backward_ms"], s["other_ms"]]
        for s in slowest
    ]
    return Table(
        ["rank", "host", "step", "ms", "data", "fwd", "bwd", "other"],
        rows,
        "The slowest steady steps of the job",
        optional=("other",),
    )


def render(section: dict[str, Any]) -> list[Block]:
    blocks: list[Block] = [worded(section["findings"], WORDS), host_table(section), rank_table(section)]
    if section["slowest"]:
        blocks.append(slowest_table(section["slowest"]))
    for note in section.get("notes", []):
        blocks.append(Para(f"Rank {note['rank']}: {note['note']}"))
    world = section["job"]["world_size"]
    held = sum(len(i["ranks"]) for i in section["inputs"])
    blocks.append(
        Para(
            f"{held} of {world or '?'} ranks from {len(section['inputs'])} run directories; every rank's steps "
            f"and collectives as Parquet under {section['parquet']}/ in the run directory (host and rank as Hive "
            "partitions), read there as:"
        )
    )
    parquet = os.path.join(section["parquet"], "steps")
    blocks.append(
        Code(
            "import duckdb\n"
            f"duckdb.sql(\"SELECT host, rank, avg(seconds) FROM read_parquet('{parquet}/*/*/*.parquet', "
            'hive_partitioning=true) GROUP BY ALL ORDER BY rank").show()',
            "python",
        )
    )
    return blocks
