"""Input-pipeline experiments (seed 003, second half): the same samples as small files, TFRecord
shards and one array; tf.data-like reader stages; a consumer; one measured epoch; sweeps."""

from __future__ import annotations

from dlscope.lazy import lazy_exports

# imported on first use: `dlscope --help` must not pay for torch
_API = {
    "Batch": "dlscope.data.pipeline.stages",
    "EpochMeasurement": "dlscope.data.pipeline.measure",
    "FORMATS": "dlscope.data.pipeline.prepare",
    "IOCounters": "dlscope.data.pipeline.tfrecord",
    "Manifest": "dlscope.data.pipeline.prepare",
    "PipelineDataset": "dlscope.data.pipeline.stages",
    "ReaderConfig": "dlscope.data.pipeline.stages",
    "SimulatedCompute": "dlscope.data.pipeline.consumer",
    "TFRecordError": "dlscope.data.pipeline.tfrecord",
    "TrainingCompute": "dlscope.data.pipeline.consumer",
    "evict_page_cache": "dlscope.data.pipeline.measure",
    "frame": "dlscope.data.pipeline.tfrecord",
    "iterate_batches": "dlscope.data.pipeline.stages",
    "load_manifest": "dlscope.data.pipeline.prepare",
    "masked_crc": "dlscope.data.pipeline.tfrecord",
    "measure_epoch": "dlscope.data.pipeline.measure",
    "prepare_dataset": "dlscope.data.pipeline.prepare",
    "read_records": "dlscope.data.pipeline.tfrecord",
    "shuffle": "dlscope.data.pipeline.stages",
    "synthetic_samples": "dlscope.data.pipeline.prepare",
    "verdict": "dlscope.data.pipeline.measure",
}

__all__ = list(_API)


__getattr__ = lazy_exports(__name__, _API)
