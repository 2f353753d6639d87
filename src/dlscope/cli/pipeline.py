"""dlscope pipeline: prepare, run, sweep."""

from __future__ import annotations

import argparse

from dlscope.cli.common import Parser, from_flags, run_builtin_command
from dlscope.runner import answer


def cmd_pipeline_prepare(args: argparse.Namespace) -> int:
    from dlscope.options import PipelinePrepareOptions

    formats = tuple(f.strip() for f in args.formats.split(","))
    return answer("pipeline-prepare", from_flags(PipelinePrepareOptions, args, formats=formats))


def cmd_pipeline_run(args: argparse.Namespace) -> int:
    from dlscope.options import PipelineRunOptions

    return answer("pipeline-run", from_flags(PipelineRunOptions, args, fmt=args.format))


def cmd_pipeline_sweep(args: argparse.Namespace) -> int:
    from dlscope.config import TrainConfig
    from dlscope.options import PipelineOptions, StepOptions, SweepPlan

    engines = tuple(e.strip() for e in args.engines.split(","))
    plan = from_flags(SweepPlan, args, mnist_samples=args.samples, engines=engines)
    config = TrainConfig(model=args.model, device=args.device, seed=args.seed)
    options = StepOptions(pipeline=PipelineOptions(plan, args.remove_data))
    steps = ["environment", "dataset", "pipeline"]
    return run_builtin_command(args, "pipeline-sweep", steps, config=config, step_options=options)


def register(sub: argparse._SubParsersAction) -> None:
    from dlscope.options import PIPELINE_FORMATS as FORMATS
    from dlscope.options import SweepPlan

    pipeline = sub.add_parser("pipeline", help="input pipelines: small files, shards, read/shuffle buffers, workers")
    pipe_sub = pipeline.add_subparsers(dest="pipeline_command", required=True, parser_class=Parser)

    p = pipe_sub.add_parser("prepare", help="write samples as small files, TFRecord shards and one array")
    p.add_argument("--out", required=True, help="new directory for the dataset")
    p.add_argument("--source", default="mnist", choices=["mnist", "synthetic"])
    p.add_argument("--samples", type=int, default=60_000, help="how many samples (default 60000)")
    p.add_argument("--sample-bytes", type=int, default=472, help="synthetic sample size (472: 550-byte files)")
    p.add_argument("--shards", type=int, default=8, help="TFRecord shards (default 8)")
    p.add_argument("--formats", default=",".join(FORMATS), help=f"comma-separated subset of {','.join(FORMATS)}")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data-dir", default=None, help="MNIST directory (default: embedded)")
    p.set_defaults(func=cmd_pipeline_prepare)

    p = pipe_sub.add_parser("run", help="measure one epoch of one pipeline configuration")
    p.add_argument("data", help="a directory made by `dlscope pipeline prepare`")
    p.add_argument("--format", default="tfrecord", choices=FORMATS)
    p.add_argument("--read-buffer", type=int, default=262_144, metavar="BYTES", help="bytes per read call")
    p.add_argument("--shuffle-buffer", type=int, default=0, metavar="N", help="records (0: no shuffle)")
    p.add_argument("--batch-size", type=int, default=500)
    p.add_argument(
        "--engine",
        default="dlscope",
        choices=["dlscope", "tfdata"],
        help="dlscope's reader stages, or the same row through tf.data (needs the tf extra)",
    )
    p.add_argument(
        "--workers", type=int, default=0, help="DataLoader worker processes; tfdata: interleave threads, -1 AUTOTUNE"
    )
    p.add_argument("--prefetch", type=int, default=2, help="batches prefetched (per worker); tfdata: -1 AUTOTUNE")
    p.add_argument("--warm", action="store_true", help="keep the page cache (default: evict it, a cold run)")
    p.add_argument("--compute-ms", type=float, default=5.0, help="simulated compute per batch (default 5 ms)")
    p.add_argument(
        "--train", default=None, metavar="MODEL", help="train this model (`dlscope models`) instead of simulating"
    )
    p.add_argument("--device", default="auto")
    p.add_argument("--threads", type=int, default=None, help="torch threads of the training consumer")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--epoch", type=int, default=0, help="epoch number (seeds the shuffle)")
    p.set_defaults(func=cmd_pipeline_run)

    p = pipe_sub.add_parser("sweep", help="seed 003's tables and more, with verdicts and a report")
    p.add_argument("--samples", type=int, default=SweepPlan.mnist_samples, help="MNIST samples")
    p.add_argument("--small-files", type=int, default=SweepPlan.small_files, help="550-byte files")
    p.add_argument("--compute-ms", type=float, default=SweepPlan.compute_ms, help="simulated compute per batch")
    p.add_argument("--model", default=SweepPlan.model, help="training consumer, from `dlscope models`")
    p.add_argument("--device", default="auto")
    p.add_argument("--threads", type=int, default=SweepPlan.threads, help="torch threads of the training consumer")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeats", type=int, default=SweepPlan.repeats, help="interleaved runs per row, median kept")
    p.add_argument(
        "--engines",
        default="dlscope",
        help="comma-separated: dlscope, tfdata (each row also through tf.data; needs the tf extra)",
    )
    p.add_argument("--remove-data", action="store_true", help="delete the prepared datasets afterwards")
    p.add_argument("--out", default=None, help="run directory (default runs/pipeline-sweep-<time>)")
    p.add_argument("--data-dir", default=None, help="MNIST laid out like torchvision's MNIST/raw (default: embedded)")
    p.add_argument("--no-progress", action="store_true", help="no live progress bar")
    p.set_defaults(func=cmd_pipeline_sweep)
