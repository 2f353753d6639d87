"""Which files are dlscope's own code. No place that names the user's file, stack or line — a
batch's or a sample's file, the syscall tables' files, a sync's or an allocation's line, a
traceback, a hung process's line, a doctor trial's call site — names one of these as the user's:
they are in the job's stacks (dlscope's wrappers of torch's calls), and torch's own walks of the
stack (`torch.manual_seed` formats it for its lazy CUDA, XPU and MTIA seeding: a stat() and a
first read of every frame's file) touch them. Both sides read it: the job as it walks its frames,
dlscope as it reads their paths afterwards. Stdlib only."""

from __future__ import annotations

import os

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# the package as the interpreter names its files (the path it was imported from) and as the file
# system has it (a tracer's paths are the kernel's, links resolved)
PACKAGE_DIRS = tuple(dict.fromkeys(path + os.sep for path in (_PACKAGE, os.path.realpath(_PACKAGE))))
# what observes a job (in it, beside it, afterwards): never the built-in job's own line either
MACHINERY = tuple(
    directory + room
    for directory in PACKAGE_DIRS
    for room in ("injob/", "contract/", "measure/", "supervise/", "analysis/", "instruments/", "phases.py")
)


# its code as the interpreter runs it and a tracer sees it read: sources, bytecode, extensions
# (not the data it ships: the vendored MNIST is the built-in job's dataset)
CODE_SUFFIXES = (".py", ".pyc", ".so")


def is_dlscope_code(path: str) -> bool:
    """`path` (absolute, as a frame or a tracer names it) is a file of dlscope's code."""
    return path.startswith(PACKAGE_DIRS) and path.endswith(CODE_SUFFIXES)


def is_machinery(path: str) -> bool:
    """`path` is dlscope's observing code, not the built-in job's training code (`dlscope lab`'s)."""
    return path.startswith(MACHINERY)
