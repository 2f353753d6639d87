"""Steps of the commands that answer on the terminal and keep no run directory: each reads its
files, returns its section (what --json prints, what the renderer shows) and the exit status its
verdict gives. The runner (dlscope.runner.answer) shows them."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from dlscope.errors import CheckpointError
from dlscope.options import FileOptions, PipelineRunOptions, RunDiffOptions, StacksOptions

Answer = tuple[dict[str, Any], int]
WORST_FIRST = ("dangerous", "damaged", "safe", "skipped")


def ckpt_verify(options: FileOptions) -> Answer:
    """A dlscope checkpoint: a fresh model's test predictions against the saved fingerprint; a TF
    checkpoint or SavedModel: every tensor's CRC32C, as TF checks them on restore."""
    from dlscope.ckpt.tf_fmt import bundle_index

    path = options.paths[0]
    index = bundle_index(Path(path))
    if index is not None:
        from dlscope.ckpt.tf_fmt import verify_bundle

        anatomy = verify_bundle(index)
        bad = [{"where": f.where, "what": f.what} for f in anatomy.findings if f.level == "bad"]
        return {"path": str(index), "format": "tf", "mismatches": bad, "tensors": len(anatomy.tensors)}, int(bool(bad))
    from dlscope.checkpoint import verify_checkpoint, verify_dict
    from dlscope.data.loaders import normalise
    from dlscope.data.mnist import load_mnist

    data = load_mnist(options.data_dir)
    result = verify_checkpoint(path, normalise(data.test_images), data.test_labels)
    return {**verify_dict(result), "path": path, "format": "dlscope"}, 0 if result.ok else 1


def ckpt_scan(options: FileOptions) -> Answer:
    from dlscope.ckpt.scan import EXIT_CODES, scan_paths

    reports = [r.to_dict() for r in scan_paths(options.paths, frozenset(options.allow))]
    if not reports:
        raise CheckpointError("no files to scan", options.paths[0])
    worst = min((r["verdict"] for r in reports), key=WORST_FIRST.index)
    return {"verdict": worst, "exit_code": EXIT_CODES[worst], "files": reports}, EXIT_CODES[worst]


def ckpt_inspect(options: FileOptions) -> Answer:
    """The anatomy, with the scanner's verdict (which decides the exit status); a file that cannot
    be dissected but whose loading would run code: the scan alone (the attack, not a corrupt file)."""
    from dlscope.ckpt.inspect import inspect_checkpoint
    from dlscope.ckpt.scan import scan_file

    path = options.paths[0]
    # a TF prefix or shard is no single file the scanner knows
    scan = scan_file(path, crc=options.stats) if Path(path).is_file() else None
    scan = scan if scan is not None and scan.format != "unknown" else None
    try:
        anatomy = inspect_checkpoint(path, stats=options.stats)
    except CheckpointError:
        if scan is None or scan.verdict != "dangerous":
            raise
        return scan.to_dict(), scan.exit_code
    if scan is not None and scan.verdict == "dangerous":
        anatomy.safe_to_load = False  # e.g. a second pickle after the one torch.load reads
    verdict = {"verdict": scan.verdict, "exit_code": scan.exit_code, "summary": scan.summary()} if scan else {}
    if scan is not None and scan.verdict != "safe":
        status = scan.exit_code  # dangerous 1, damaged 2
    else:
        status = 0 if anatomy.safe_to_load and not anatomy.corrupt else 1  # a CRC mismatch (--stats) is 1
    return {**anatomy.to_dict(), **verdict}, status


def run_diff(options: RunDiffOptions) -> Answer:
    """Two runs of `dlscope run` compared (dlscope.steps.rundiff); exit 1 when the step time changed
    beyond its noise, 0 when not."""
    from dlscope.steps.rundiff import compare

    section = compare(Path(options.run_a), Path(options.run_b), options.min_change_pct)
    return section, int(section["step"]["significant"])


def ckpt_diff(options: FileOptions) -> Answer:
    from dlscope.ckpt.diff import diff_checkpoints

    result = diff_checkpoints(*options.paths)
    return result, 0 if result["identical"] else 1


def pipeline_run(options: PipelineRunOptions) -> Answer:
    """One epoch of one configuration; a batch delivered twice or a sample lost is exit status 1."""
    from dlscope.data.pipeline import ReaderConfig, SimulatedCompute, TrainingCompute, load_manifest, measure_epoch

    manifest = load_manifest(options.data, options.fmt)
    reader_fields = {f.name for f in dataclasses.fields(ReaderConfig)}
    reader = ReaderConfig(**{k: v for k, v in dataclasses.asdict(options).items() if k in reader_fields})
    consumer = (
        TrainingCompute(options.train, options.device, manifest.sample_bytes, options.seed, options.threads)
        if options.train
        else SimulatedCompute(options.compute_ms / 1000)
    )
    m = measure_epoch(options.data, manifest, reader, consumer, cold=not options.warm, epoch=options.epoch)
    section = {"label": options.fmt, **m.to_dict(), "reader": dataclasses.asdict(reader)}
    section["manifest"] = {"samples": manifest.samples, "sample_bytes": manifest.sample_bytes}
    return section, 0 if m.exactly_once else 1


def environment(options: FileOptions) -> Answer:
    from dlscope.observe.environment import collect_environment

    return collect_environment(), 0


def stacks(options: StacksOptions) -> Answer:
    """Every process of a running job now (the hang watchdog's capture, on demand)."""
    from dlscope.observe.hang.ondemand import capture_target

    return capture_target(options.target), 0
