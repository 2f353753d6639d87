"""Input-pipeline experiments (seed 003, second half): the same samples as small files, TFRecord
shards and one array; tf.data-like reader stages; a consumer; one measured epoch; sweeps."""

from __future__ import annotations

from dlscope.lazy import lazy_exports

# imported on first use: `dlscope --help` must not pay for torch
_API = {
    "Batch": "dlscope.experiments.pipeline.readers",
    "EpochMeasurement": "dlscope.experiments.pipeline.epoch",
    "FORMATS": "dlscope.experiments.pipeline.prepare",
    "IOCounters": "dlscope.experiments.pipeline.tfrecord",
    "Manifest": "dlscope.experiments.pipeline.prepare",
    "PipelineDataset": "dlscope.experiments.pipeline.readers",
    "ReaderConfig": "dlscope.experiments.pipeline.readers",
    "SimulatedCompute": "dlscope.experiments.pipeline.consumer",
    "TFRecordError": "dlscope.experiments.pipeline.tfrecord",
    "TrainingCompute": "dlscope.experiments.pipeline.consumer",
    "evict_page_cache": "dlscope.experiments.pipeline.epoch",
    "frame": "dlscope.experiments.pipeline.tfrecord",
    "iterate_batches": "dlscope.experiments.pipeline.readers",
    "load_manifest": "dlscope.experiments.pipeline.prepare",
    "masked_crc": "dlscope.experiments.pipeline.tfrecord",
    "measure_epoch": "dlscope.experiments.pipeline.epoch",
    "prepare_dataset": "dlscope.experiments.pipeline.prepare",
    "read_records": "dlscope.experiments.pipeline.tfrecord",
    "shuffle": "dlscope.experiments.pipeline.readers",
    "synthetic_samples": "dlscope.experiments.pipeline.prepare",
    "verdict": "dlscope.experiments.pipeline.epoch",
}

__all__ = list(_API)


__getattr__ = lazy_exports(__name__, _API)
