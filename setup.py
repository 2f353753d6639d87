"""The one build step pyproject.toml holds only as an experimental table (a warning at each
install): two extensions in C, each optional (without a C compiler neither is built, and the
Python they stand in for does their work: the same figures, at a higher cost):
  - the step machine's common step (src/dlscope/injob/_fastpath.c), dlscope's own cost
    per training step (about half of it, in Python);
  - the batch x-ray's record of a batch (src/dlscope/injob/_batchpack.c)."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension("dlscope.injob._fastpath", ["src/dlscope/injob/_fastpath.c"], optional=True),
        Extension("dlscope.injob._batchpack", ["src/dlscope/injob/_batchpack.c"], optional=True),
    ]
)
