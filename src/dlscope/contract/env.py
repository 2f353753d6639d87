"""The environment variables dlscope starts a job's processes with (each inherited by the
processes they start: DataLoader workers, torchrun's ranks), the ones a user or a test sets, and the
signals the job answers. Every `DLSCOPE_*` name is spelt here (tests/test_architecture.py)."""

from __future__ import annotations

import signal

# --- set by dlscope on the command it observes (supervise/bootstrap_env.py, supervise/session.py) ---
SRC_ENV = "DLSCOPE_SRC"  # the directory holding the `dlscope` package that injected the bootstrap
RUN_DIR_ENV = "DLSCOPE_RUN_DIR"  # `dlscope run`: the run's processes/ directory; the torch hooks install
PROC_TRACE_ENV = "DLSCOPE_PROC_TRACE_DIR"  # `trace --backend proc`: where the audit hook writes its events
PROFILE_ENV = "DLSCOPE_RUN_PROFILE"  # "start_after:wait:warmup:active"; active 0 turns the profiler off
TRIAL_ENV = "DLSCOPE_DOCTOR"  # a doctor trial's settings (JSON): the one change applied in the job

# --- switches a user or a benchmark sets ---
FAST_ENV = "DLSCOPE_FASTPATH"  # "0": every event through the Python step machine (the C fast path's A/B)
GPU_ENV = "DLSCOPE_GPU_CLOCK"  # "0": no GPU clock (the host's alone, the C fast path kept)
# tests set it (tests/conftest.py): a step field the packing does not know fails loudly there; in a
# user's job it is noted once in the records and the step is kept
STRICT_ENV = "DLSCOPE_STRICT_RECORDS"
CACHE_ENV = "DLSCOPE_CACHE"  # where `dlscope data fetch` keeps MNIST (default: the user cache directory)

# --- the built-in job's fault injection, for the tests of a killed and a hung rank (stages/train.py) ---
KILL_RANK_ENV = "DLSCOPE_TEST_KILL_RANK"
HANG_RANK_ENV = "DLSCOPE_TEST_HANG_RANK"

# --- signals the hang agent answers (injob/hangagent.py), sent by supervise/capture.py ---
STACK_SIGNAL = signal.SIGRTMIN + 6  # answered between bytecodes
STACK_SIGNAL_IN_C = signal.SIGRTMIN + 5  # answered at once, by faulthandler's C handler
