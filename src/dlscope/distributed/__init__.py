"""The built-in job in several processes: torchrun launch, per-rank worker, DCP checkpoints."""
