"""Steps of the commands that answer on the terminal and keep no run directory: each reads its
files, returns its section (what --json prints, what the renderer shows) and the exit status its
verdict gives. The runner (dlscope.runner.answer) shows them."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from dlscope.errors import CheckpointError
from dlscope.options import (
    AttachOptions,
    FileOptions,
    MnistOptions,
    PipelinePrepareOptions,
    PipelineRunOptions,
    RunDiffOptions,
    StacksOptions,
)

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
        bad = [f.to_json() for f in anatomy.findings if f.level == "bad"]
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
    verdict = {"verdict": scan.verdict, "exit_code": scan.exit_code, "evidence": scan.evidence()} if scan else {}
    if scan is not None and scan.verdict != "safe":
        status = scan.exit_code  # dangerous 1, damaged 2
    else:
        status = 0 if anatomy.safe_to_load and not anatomy.corrupt else 1  # a CRC mismatch (--stats) is 1
    return {**anatomy.to_dict(), **verdict}, status


def run_diff(options: RunDiffOptions) -> Answer:
    """Two runs of `dlscope run` compared (dlscope.stages.rundiff); exit 1 when the step time changed
    beyond its noise, 0 when not."""
    from dlscope.stages.rundiff import compare

    section = compare(Path(options.run_a), Path(options.run_b), options.min_change_pct)
    return section, int(section["step"]["significant"])


def ckpt_diff(options: FileOptions) -> Answer:
    from dlscope.ckpt.diff import diff_checkpoints

    result = diff_checkpoints(*options.paths)
    return result, 0 if result["identical"] else 1


def pipeline_run(options: PipelineRunOptions) -> Answer:
    """One epoch of one configuration; a batch delivered twice or a sample lost is exit status 1."""
    from dlscope.experiments.pipeline import (
        ReaderConfig,
        SimulatedCompute,
        TrainingCompute,
        load_manifest,
        measure_epoch,
    )

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


def pipeline_prepare(options: PipelinePrepareOptions) -> Answer:
    """MNIST's first samples (or synthetic ones) written in each format, with the manifest."""
    from dlscope.experiments.pipeline import prepare_dataset, synthetic_samples

    if options.source == "mnist":
        from dlscope.data.mnist import load_mnist

        mnist = load_mnist(options.data_dir)
        n = min(options.samples, len(mnist.train_labels))
        labels = mnist.train_labels[:n].numpy().astype("uint8")
        samples = mnist.train_images[:n].reshape(n, -1).numpy()
    else:
        labels, samples = synthetic_samples(options.samples, options.sample_bytes, options.seed)
    manifest = prepare_dataset(options.out, labels, samples, options.source, options.shards, options.formats)
    section = {"out": options.out, "samples": manifest.samples, "sample_bytes": manifest.sample_bytes}
    section["format_bytes"] = {fmt: manifest.data_bytes(fmt) for fmt in manifest.formats}
    return {**section, "record_file_bytes": manifest.record_file_bytes}, 0


def models(options: FileOptions) -> Answer:
    from dlscope.models import MODELS, build_model

    def params(name: str) -> int:
        return sum(p.numel() for p in build_model(name).parameters())

    return {"zoo": [{"name": n, "params": params(n), "description": m.description} for n, m in MODELS.items()]}, 0


def data_fetch(options: MnistOptions) -> Answer:
    from dlscope.data.mnist import fetch_mnist

    raw = fetch_mnist(options.mirror, options.dest)
    return {"raw": str(raw), "data_dir": str(raw.parent.parent)}, 0


def data_verify(options: MnistOptions) -> Answer:
    from dlscope.data.mnist import load_mnist

    data = load_mnist(options.data_dir)
    files = {key: str(path) for key, path in data.files.items()}
    return {"files": files, "train": len(data.train_labels), "test": len(data.test_labels), "s": data.load_seconds}, 0


def environment(options: FileOptions) -> Answer:
    from dlscope.instruments.environment import collect_environment

    return collect_environment(), 0


def stacks(options: StacksOptions) -> Answer:
    """Every process of a running job now (the hang watchdog's capture, on demand)."""
    from dlscope.supervise.ondemand import capture_target

    return capture_target(options.target), 0


def attach(options: AttachOptions, task: Any = None) -> Answer:
    """The profiler on demand in a running job: each process's window, as `dlscope run` records it.
    Status 1 when a process ended, or the wait timed out, before its window was written."""
    from dlscope.analysis.observed import profile_window, window_cost
    from dlscope.analysis.stepfile import StepFile
    from dlscope.analysis.steptable import open_stream
    from dlscope.contract.records import steps_path
    from dlscope.errors import ConfigError
    from dlscope.supervise.attach import request_profile, target_processes

    if options.profile_steps < 1:
        raise ConfigError(f"--profile-steps must be at least 1, got {options.profile_steps}")
    directory, views = target_processes(options.target)  # a bad target: one line, before any progress bar
    with task(f"waiting for the next {options.profile_steps} steps to be profiled", total=len(views)) as bar:
        shown = 0

        def progress(done: int, total: int) -> None:
            nonlocal shown
            bar.update(advance=done - shown)
            shown = done

        found = request_profile(directory, views, options.profile_steps, options.timeout, progress)
    for process in found["processes"]:
        record = process.pop("profile")
        process["window"] = None if record is None else profile_window(process["pid"], record, "self_cpu")
        if process["window"] is not None and process["window"]["first_step"] is not None:
            steps = StepFile(Path(steps_path(directory, process["pid"])))
            window = process["window"]
            window["cost"] = window_cost(open_stream(steps)[1], steps.codes, window["first_step"], window["last_step"])
        taken = process.pop("taken")
        process["taken_at_step"] = None if taken is None else taken["step"]
    delivered = all(p["window"] is not None for p in found["processes"])
    return found, 0 if delivered else 1
