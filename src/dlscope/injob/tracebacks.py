"""An error in the observed program reads as it would without dlscope: the frames of dlscope's
wrappers (a timed module call, `backward()`, an optimizer's `step`, a DataLoader's `__next__`
or fetch, `torch.save`/`torch.load`) are left out of the traceback Python prints at exit, and
out of the traceback a DataLoader worker sends to the training process. A traceback whose
error was raised inside dlscope's own code keeps every frame: that is dlscope's fault, shown.

Only what is printed changes: the exception, its type, its message and the exit status are the
program's, and a program that formats tracebacks itself (logging, `traceback.print_exc()`)
still sees the wrappers' frames.

The error is also recorded ("uncaught": its type, its message's first line, and the program's own
line it came through), so that the report says what ended the command rather than guessing."""

from __future__ import annotations

import contextlib
import os
import re
import sys
import time
import types
from collections.abc import Callable
from typing import Any

from dlscope.contract.owncode import is_dlscope_code

OBSERVERS = os.path.dirname(os.path.abspath(__file__))  # dlscope/injob: what runs in the job
STDLIB = os.path.dirname(os.__file__)
MESSAGE_CHARS = 300  # of the message's first line, kept
ESCAPES = re.compile(r"\x1b\[[0-9;]*m")  # terminal colours some messages carry (torch.load's)


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


def _programs(name: str) -> bool:
    """A file of the program's own: not dlscope's, the standard library's or an installed package's."""
    return not (
        name.startswith("<")
        or is_dlscope_code(name)
        or name.startswith(STDLIB + os.sep)
        or f"{os.sep}site-packages{os.sep}" in name
        or f"{os.sep}dist-packages{os.sep}" in name
    )


def uncaught(kind: type[BaseException], error: BaseException, tb: types.TracebackType | None) -> dict[str, Any]:
    """The error that ends the process, as a record: its type, its message's first line, the
    innermost frame of the program's own code it passed through (the line that called torch.load,
    not torch's), else the innermost frame, and when (the first of several ranks' errors is
    usually the cause of the others')."""
    frames = []
    while tb is not None:
        frames.append(tb)
        tb = tb.tb_next
    names = [t.tb_frame.f_code.co_filename for t in frames]  # "<frozen runpy>", "<string>": no file
    names = [name if name.startswith("<") else os.path.abspath(name) for name in names]
    at = next((i for i in reversed(range(len(frames))) if _programs(names[i])), len(frames) - 1)
    # the first line that says something (torchrun's ChildFailedError opens with a rule of "="s)
    lines = [line.strip() for line in ESCAPES.sub("", str(error)).splitlines()]
    message = next((line for line in lines if any(c.isalnum() for c in line)), "")[:MESSAGE_CHARS]
    record: dict[str, Any] = {"k": "uncaught", "type": kind.__name__, "message": message, "ts": time.time()}
    if frames:
        record.update(file=names[at], line=frames[at].tb_lineno, function=frames[at].tb_frame.f_code.co_name)
    return record


def install(record: Callable[[dict[str, Any]], None] | None = None) -> None:
    """Print an uncaught error's traceback without dlscope's frames, through whatever
    `sys.excepthook` the process had (a program that sets its own later replaces this one); and
    hand it to `record` first (not a Ctrl-C: the run says it was interrupted)."""
    printer = sys.excepthook

    def excepthook(kind: type[BaseException], error: BaseException, tb: types.TracebackType | None) -> None:
        tb = without_our_frames(tb)
        error.__traceback__ = tb
        _strip_chain(error.__cause__, {id(error)})
        _strip_chain(error.__context__, {id(error)})
        if record is not None and not issubclass(kind, KeyboardInterrupt):
            with contextlib.suppress(Exception):  # the program's error is printed whatever happens here
                record(uncaught(kind, error, tb))
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
