"""torch.profiler's native chatter on stderr hidden, the rest passed on: one way for the lab's
profiler, the memory peak, the sweep and the profiler `dlscope run` drives inside a job (stdlib only:
the job may import it)."""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import warnings
from collections.abc import Iterator

NATIVE_NOISE = ("USDT:", "profiler results will not include", "Memory block of unknown size")


# torch ≥ 2.11 warns once a process when a profiler with a schedule is prepared (torch/profiler/profiler.py)
PROFILER_CYCLE_WARNING = "Warning: Profiler clears events"


@contextlib.contextmanager
def quiet_native_stderr(drop: tuple[str, ...] = NATIVE_NOISE) -> Iterator[None]:
    """Hide the profiler's C++ chatter (USDT markers, allocator notes) and its one Python warning
    about schedules (it clears its events after each cycle: every schedule here has one); pass
    other lines on."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured, warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=PROFILER_CYCLE_WARNING)
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            for line in captured.read().decode(errors="replace").splitlines():
                if line.strip() and not any(d in line for d in drop):
                    print(line, file=sys.stderr)
