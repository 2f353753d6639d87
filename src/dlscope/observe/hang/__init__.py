"""Hung jobs: a live status file per observed process, the stacks and kernel state of every
process on demand, and the watchdog of `dlscope run` that captures them when steps stop."""
