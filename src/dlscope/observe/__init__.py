"""Observers and measurements of a training job: TensorBoard, profiler, summary, environment."""
