"""`dlscope ckpt scan`: per file the verdict line, what off the allow-list each pickle reached and where,
then the findings; for several files a tally. Not a results.json section: the command prints these
blocks. Every string here comes from a file: the terminal escapes it (console.safe); nothing here prints."""

from __future__ import annotations

from typing import Any

from dlscope.report.blocks import Block, Findings, Para, Table
from dlscope.report.wording import Words, located, sentence

VERDICT_LEVEL = {"safe": "good", "dangerous": "bad", "damaged": "warn", "skipped": "info"}
# a local header's fields against the central directory's (zip.local_header)
HEADER_FIELDS = {
    "name": lambda local, central: f"name {local!r}, the central directory {central!r}",
    "compression": lambda local, central: f"compression {local}, the central directory {central}",
    "crc": lambda local, central: f"CRC {local:08x}, the central directory {central:08x}",
    "compressed_bytes": lambda local, central: f"{local:,} compressed bytes, the central directory {central:,}",
    "bytes": lambda local, central: f"{local:,} bytes, the central directory {central:,}",
}
# what the scanner (dlscope.ckpt.scan) and the zip audit (dlscope.ckpt.zipdir) found; the place follows
WORDS: Words = {
    "scan.empty": lambda v: "empty file: not a checkpoint",
    "scan.unknown_format": lambda v: f"not a checkpoint: unknown format (first bytes {v['first_bytes']})",
    "scan.over_limit": lambda v: f"over {v['limit']:,} bytes of pickle: only the first {v['limit']:,} were scanned",
    "scan.after_stop": lambda v: f"{v['bytes']:,} bytes after the last STOP are not a pickle",
    "scan.no_pickle": lambda v: "no pickle where one was expected",
    "scan.stream_breaks": lambda v: f"the stream breaks @ {v['at']} ({v['error']})",
    "scan.elided": lambda v: "over 500,000 containers: the tree was elided, every opcode still scanned",
    "scan.safetensors_header_size": lambda v: (
        f"safetensors header of {v['bytes']:,} bytes runs past the end of the file or its 100 MB limit"
    ),
    "scan.safetensors_not_json": lambda v: f"safetensors header is not JSON: {v['error']}",
    "scan.safetensors_not_object": lambda v: "safetensors header is not a JSON object",
    "scan.storage_keys": lambda v: "the storage key list does not match the object's storages",
    "scan.storage_cut": lambda v: f"storage {v['storage']} is cut off: truncated",
    "scan.storage_past_end": lambda v: (
        f"storage {v['storage']} ({v['elements']:,} elements) runs past the end of the file"
    ),
    "scan.after_storages": lambda v: f"{v['bytes']:,} bytes after the last storage",
    "scan.zip_corrupt": lambda v: f"truncated or corrupt zip: {v['error']}",
    "scan.decompress": lambda v: f"cannot decompress: {v['error']}",
    "scan.partly_scanned": lambda v: f"only the first {v['scanned']:,} of {v['bytes']:,} bytes were scanned",
    "scan.npy_magic": lambda v: "not a .npy array (wrong magic)",
    "scan.npy_version": lambda v: f"unknown .npy version {v['version']}",
    "scan.npy_header_size": lambda v: f".npy header of {v['bytes']:,} bytes is over numpy's limit or past the end",
    "scan.npy_header": lambda v: f".npy header is not a valid dict: {v['error']}",
    "scan.npy_shape": lambda v: f".npy shape {v['shape']} is not a tuple of sizes",
    "scan.npy_array": lambda v: (
        f"dtype {v['dtype']}, shape {v['shape']}, fortran order {v['fortran']}, data @ {v['at']}"
    ),
    "scan.npy_dtype": lambda v: f"dtype {v['dtype']} not recognised: data size not checked",
    "scan.npy_truncated": lambda v: f"array data is {v['bytes']:,} bytes, the header needs {v['needs']:,}: truncated",
    "scan.npy_trailing": lambda v: f"{v['bytes']:,} bytes after the array data",
    "zip.duplicate": lambda v: (
        f"member name {v['member']!r} appears twice (also @ {v['also_at']}): zipfile reads "
        "the last copy, other readers the first"
    ),
    "zip.encrypted": lambda v: f"{v['member']} is encrypted: its bytes cannot be scanned",
    "zip.no_local_header": lambda v: f"{v['member']}: no local header at offset {v['offset']}",
    "zip.local_header": lambda v: (
        f"{v['member']}: local header says " + HEADER_FIELDS[v["field"]](v["local"], v["central"])
    ),
    "zip.past_end": lambda v: f"{v['member']} runs past the end of the file",
    "zip.bomb": lambda v: (
        f"{v['member']} declares {v['declared']:,} bytes from {v['compressed']:,}: over "
        f"{v['ratio']}×, not inflated (a zip bomb?)"
    ),
    "zip.crc": lambda v: f"{v['member']}: CRC32 or size differs from the directory's (torch.load checks neither)",
    "zip.before_first": lambda v: f"{v['bytes']:,} bytes before the first member",
    "zip.overlap": lambda v: "two members overlap (one's data is inside another's)",
    "zip.between": lambda v: f"{v['bytes']:,} bytes between members that no member owns",
    "zip.after_directory": lambda v: f"{v['bytes']:,} bytes after the end of the central directory",
    "zip.after_last": lambda v: f"{v['bytes']:,} bytes after the last member",
}
SKIPPED = {
    "empty": lambda v: "empty",
    "unknown format": lambda v: f"unknown format (first bytes {v['first_bytes']})",
    "text": lambda v: f"text, not a pickle: it breaks @ {v['breaks_at']}",
}


def summary(evidence: dict[str, Any]) -> str:
    """The verdict in one line, with its evidence (ScanReport.evidence): the first dangerous call, or
    the first fault."""
    v, verdict = evidence, evidence["verdict"]
    if verdict == "dangerous":
        action = "called by" if v["call"] else "imported by"
        line = f"DANGEROUS: {v['name']} {action} {v['opcode']} @ {v['position']}"
        line += f" in {v['where']}" if v["where"] != "pickle" else ""
        if v["broken_at"] is not None:
            line += f", before the stream breaks @ {v['broken_at']} ({v['error']})"
        others = v["others"]
        return line + (f"; {others:,} more name{'s' * (others != 1)} off the allow-list" if others else "")
    if verdict == "skipped":
        return f"SKIPPED: not a model file: {SKIPPED[v['reason']](v)}"
    if verdict == "damaged":
        return f"DAMAGED: {located(v['finding'], WORDS)[1]}"
    if not v["pickles"]:
        return f"SAFE: {v['format']}, no pickle: data only, nothing in it can run"
    n = v["pickles"]
    return f"SAFE: {n} pickle{'s' * (n != 1)}, all {v['globals']} globals on the allow-list"


def file_blocks(report: dict[str, Any], limit: int | None = 20) -> list[Block]:
    said = summary(report["evidence"])
    blocks: list[Block] = [Findings([(VERDICT_LEVEL[report["verdict"]], f"{report['path']}: {said}")])]
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
    notes = [located(f, WORDS) for f in report["findings"] if sentence(f, WORDS)[1] not in said]
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
        (VERDICT_LEVEL[r["verdict"]], f"{r['path']}: {summary(r['evidence'])}")
        for verdict in ("safe", "skipped")
        for r in reports
        if r["verdict"] == verdict
    ]
    if one_line:
        blocks.append(Findings(one_line))
    tally = {v: sum(r["verdict"] == v for r in reports) for v in VERDICT_LEVEL}
    blocks.append(Para(f"{len(reports):,} files: " + ", ".join(f"{n:,} {v}" for v, n in tally.items())))
    return blocks
