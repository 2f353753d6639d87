"""The one build step pyproject.toml holds only as an experimental table (a warning at each
install): two extensions in C, each optional (without a C compiler neither is built, and the
Python they stand in for does their work: the same figures, at a higher cost):
  - the step machine's common step (src/dlscope/observe/script/_fastpath.c), dlscope's own cost
    per training step (about half of it, in Python);
  - the batch x-ray's record of a batch (src/dlscope/observe/script/_batchpack.c)."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension("dlscope.observe.script._fastpath", ["src/dlscope/observe/script/_fastpath.c"], optional=True),
        Extension("dlscope.observe.script._batchpack", ["src/dlscope/observe/script/_batchpack.c"], optional=True),
    ]
)
