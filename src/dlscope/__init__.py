"""dlscope: what a deep-learning training job does to a machine, layer by layer."""

__version__ = "0.1.0"
