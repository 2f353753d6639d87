"""An error in the observed program reads as it would without dlscope: the frames of dlscope's
wrappers (a timed module call, `backward()`, an optimizer's `step`, a DataLoader's `__next__`
or fetch, `torch.save`/`torch.load`) are left out of the traceback Python prints at exit, and
out of the traceback a DataLoader worker sends to the training process. A traceback whose
error was raised inside dlscope's own code keeps every frame: that is dlscope's fault, shown.

Only what is printed changes: the exception, its type, its message and the exit status are the
program's, and a program that formats tracebacks itself (logging, `traceback.print_exc()`)
still sees the wrappers' frames."""

from __future__ import annotations

import os
import sys
import types
from collections.abc import Callable
from typing import Any

OBSERVERS = os.path.dirname(os.path.abspath(__file__))  # dlscope/injob: what runs in the job


def _ours(tb: types.TracebackType) -> bool:
    return tb.tb_frame.f_code.co_filename.startswith(OBSERVERS)


def without_our_frames(tb: types.TracebackType | None) -> types.TracebackType | None:
    """`tb` less dlscope's frames, unless the error was raised in one of them (then `tb`)."""
    frames = []
    while tb is not None:
        frames.append(tb)
        tb = tb.tb_next
    if not frames or _ours(frames[-1]) or not any(_ours(t) for t in frames):
        return frames[0] if frames else None
    rebuilt = None
    for t in reversed(frames):
        if not _ours(t):
            rebuilt = types.TracebackType(rebuilt, t.tb_frame, t.tb_lasti, t.tb_lineno)
    return rebuilt


def _strip_chain(error: BaseException | None, seen: set[int]) -> None:
    """The same for the exceptions `error` was raised from or while handling."""
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        error.__traceback__ = without_our_frames(error.__traceback__)
        _strip_chain(error.__cause__, seen)
        error = error.__context__


def install() -> None:
    """Print an uncaught error's traceback without dlscope's frames, through whatever
    `sys.excepthook` the process had (a program that sets its own later replaces this one)."""
    printer = sys.excepthook

    def excepthook(kind: type[BaseException], error: BaseException, tb: types.TracebackType | None) -> None:
        tb = without_our_frames(tb)
        error.__traceback__ = tb
        _strip_chain(error.__cause__, {id(error)})
        _strip_chain(error.__context__, {id(error)})
        printer(kind, error, tb)

    sys.excepthook = excepthook


def attach_torch(torch: Any, wrap: Callable[[Callable, Callable], Callable]) -> None:
    """A DataLoader worker formats its error's traceback into the message the training process
    raises again (`torch._utils.ExceptionWrapper`): formatted without dlscope's fetcher."""
    wrapper = torch._utils.ExceptionWrapper
    wrapper.__init__ = wrap(wrapper.__init__, _wrapped_without_our_frames)


def _wrapped_without_our_frames(
    init: Callable, wrapper: Any, exc_info: Any = None, where: str = "in background"
) -> None:
    kind, error, tb = sys.exc_info() if exc_info is None else exc_info
    init(wrapper, (kind, error, without_our_frames(tb)), where)
