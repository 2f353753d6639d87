"""dlscope: what a deep-learning training job does to a machine, layer by layer."""

from dlscope.phases import phase  # a few µs per marker; imports only os and re

__version__ = "0.1.0"
__all__ = ["__version__", "phase"]
