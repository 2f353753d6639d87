"""`dlscope ckpt scan`: per file the verdict line, what off the allow-list each pickle reached and where,
then the findings; for several files a tally. Not a results.json section: the command prints these
blocks. Every string here comes from a file: the terminal escapes it (console.safe); nothing here prints."""

from __future__ import annotations

from typing import Any

from dlscope.report.blocks import Block, Findings, Para, Table

VERDICT_LEVEL = {"safe": "good", "dangerous": "bad", "damaged": "warn", "skipped": "info"}


def file_blocks(report: dict[str, Any], limit: int | None = 20) -> list[Block]:
    summary = report["summary"]
    blocks: list[Block] = [Findings([(VERDICT_LEVEL[report["verdict"]], f"{report['path']}: {summary}")])]
    for pickle in report["pickles"]:
        events = [e for e in pickle["events"] if not e["allowed"]]
        if not events:
            continue
        shown = events[:limit] if limit else events
        more = len(events) - len(shown)
        blocks.append(
            Table(
                ["off the allow-list", "opcode", "@ byte", "arguments"],
                [[e["name"], e["opcode"], e["position"], e["detail"]] for e in shown],
                caption=f"{pickle['where']}: {len(events):,} imports and calls"
                + (f" ({more:,} more: --limit N, or --json for all)" if more else ""),
                optional=("arguments",),
            )
        )
    # the verdict line already carries its own evidence
    notes = [
        (f["level"], f["what"] + (f" ({f['where']})" if f["where"] else ""))
        for f in report["findings"]
        if f["what"] not in summary
    ]
    if notes:
        blocks.append(Findings(notes[:limit] if limit else notes))
    n = len(report["pickles"])
    blocks.append(Para(f"{report['format']}, {report['file_bytes']:,} bytes, {n} pickle{'s' * (n != 1)} read"))
    return blocks


def render_scan(reports: list[dict[str, Any]], limit: int | None = 20) -> list[Block]:
    """One file in detail; several: the dangerous and damaged files in detail, then one line for each safe
    or skipped file, then the tally."""
    if len(reports) == 1:
        return file_blocks(reports[0], limit)
    blocks: list[Block] = []
    for report in reports:
        if report["verdict"] in ("dangerous", "damaged"):
            blocks.extend(file_blocks(report, limit))
    one_line = [
        (VERDICT_LEVEL[r["verdict"]], f"{r['path']}: {r['summary']}")
        for verdict in ("safe", "skipped")
        for r in reports
        if r["verdict"] == verdict
    ]
    if one_line:
        blocks.append(Findings(one_line))
    tally = {v: sum(r["verdict"] == v for r in reports) for v in VERDICT_LEVEL}
    blocks.append(Para(f"{len(reports):,} files: " + ", ".join(f"{n:,} {v}" for v, n in tally.items())))
    return blocks
