"""The one build step pyproject.toml holds only as an experimental table (a warning at each
install): the step machine's common step in C (src/dlscope/observe/script/_fastpath.c), dlscope's
own cost per training step. Optional: without a C compiler it is not built, and the Python step
machine takes every step (the same figures, at about twice the cost)."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension("dlscope.observe.script._fastpath", ["src/dlscope/observe/script/_fastpath.c"], optional=True)
    ]
)
