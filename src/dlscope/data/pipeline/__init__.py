"""Input-pipeline experiments (seed 003, second half): the same samples as small files, TFRecord
shards and one array; tf.data-like reader stages; a consumer; one measured epoch; sweeps."""

from dlscope.data.pipeline.consumer import SimulatedCompute, TrainingCompute
from dlscope.data.pipeline.measure import EpochMeasurement, evict_page_cache, measure_epoch, verdict
from dlscope.data.pipeline.prepare import FORMATS, Manifest, load_manifest, prepare_dataset, synthetic_samples
from dlscope.data.pipeline.stages import Batch, PipelineDataset, ReaderConfig, iterate_batches, shuffle
from dlscope.data.pipeline.tfrecord import IOCounters, TFRecordError, frame, masked_crc, read_records

__all__ = [
    "FORMATS",
    "Batch",
    "EpochMeasurement",
    "IOCounters",
    "Manifest",
    "PipelineDataset",
    "ReaderConfig",
    "SimulatedCompute",
    "TFRecordError",
    "TrainingCompute",
    "evict_page_cache",
    "frame",
    "iterate_batches",
    "load_manifest",
    "masked_crc",
    "measure_epoch",
    "prepare_dataset",
    "read_records",
    "shuffle",
    "synthetic_samples",
    "verdict",
]
