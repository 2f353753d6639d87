"""The parameter update a script writes itself, with no torch optimizer — Keras 3 on torch (its
own optimizers, which its train_step runs under `torch.no_grad()`), a hand-written SGD — found by
what it does: a `torch.no_grad()` block entered after the backward() that ended a step, before the
next one, that writes in place a leaf tensor which requires grad (a parameter: `p -= lr * p.grad`,
`p.add_(...)`, `p.copy_(...)`, `p.data.add_(...)`, `torch._foreach_add_(params, ...)`). Its time is
the step's optimizer part and the step ends where it ends, as at a torch optimizer's `step`: the
block is fed to the step machine as optimizer_begin/optimizer_end (so the C fast path takes such
steps too). Before, the update was the next step's "other" and the optimizer read 0%.

Cost. Until a torch optimizer is created in the process (its steps are then the steps, and both
wrappers go), `no_grad.__enter__` and `__exit__` run one frame more. Only an outermost block (grad
on before it), in the steps' thread, after a step-ending backward() since the last update, looks
further: its place in the script (the code and line of the `with`, or of the call of a function
decorated with `@torch.no_grad()`) is looked up among the places met before. The first block at a
place is watched by a TorchFunctionMode for such a write (one Python call per torch call, in that
block only); at a place where one was seen every later block is the update, at a place where none
was, none is (a metric computed under no_grad after backward()). Not seen: an update outside
no_grad (`p.data -= ...` alone), a functional one (`torch.func`, new tensors each step).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

MAX_PLACES = 64  # places learnt; past them a new place is no update (code generated anew each step)
# what an in-place write to a tensor is named in torch's dispatch (besides `name_` methods)
INPLACE_OPERATORS = frozenset(
    {
        "__iadd__",
        "__isub__",
        "__imul__",
        "__itruediv__",
        "__ifloordiv__",
        "__imod__",
        "__ipow__",
        "__imatmul__",
        "__iand__",
        "__ior__",
        "__ixor__",
        "__ilshift__",
        "__irshift__",
        "__setitem__",
    }
)
Place = tuple[Any, int]  # (code object, line)


class Updates:
    """One per process, beside the step machine (`machine`: optimizer_begin/optimizer_end, and
    `backwards_now`, `step_thread`, `optimizer_depth` to read)."""

    def __init__(self, machine: Any, thread_id: Callable[[], int], clock: Callable[[], float] = time.time) -> None:
        self.machine, self.thread_id, self.clock = machine, thread_id, clock
        self.places: dict[Place, bool] = {}  # place → an update was seen there
        self.counted: dict[Place, int] = {}  # place → updates counted as steps there
        self.after = 0  # the machine's step-ending backward() calls when the last update ended
        # the outermost block being timed: (its context manager, place, None) at an update's place;
        # (…, place, (start, the mode watching it, the machine's state at its start)) when learnt
        self.open: tuple[Any, Place, tuple[float, Any, tuple] | None] | None = None
        self.watchers: list[Any] = []  # modes left on torch's stack (another mode pushed above them)
        self.removed: Callable[[], None] | None = None  # restores no_grad's own methods
        self.watcher_class: Any = None

    def attach(self, torch: Any) -> None:
        """Wrap `torch.no_grad`'s `__enter__` and `__exit__` (with statements and the decorator
        alike). The common case, a block at an update's place, is inline in the two wrappers."""
        import torch.utils._contextlib as contextlib_module

        decorator_file = contextlib_module.__file__
        no_grad = torch.autograd.grad_mode.no_grad
        enter_, exit_ = no_grad.__dict__["__enter__"], no_grad.__dict__["__exit__"]
        machine, places, counted, thread_id, clock = self.machine, self.places, self.counted, self.thread_id, self.clock

        def enter(context: Any) -> None:
            enter_(context)
            # outermost (grad was on before it), after a step-ending backward() since the last
            # update, in the steps' thread, outside an optimizer step (torch.compile's tracing
            # never runs this: it models a no_grad block's grad mode itself)
            if not context.prev or machine.backwards_now() <= self.after or machine.optimizer_depth:
                return
            if thread_id() != machine.step_thread:
                return
            frame = sys._getframe(1)  # the `with` statement's
            if frame.f_code.co_filename == decorator_file and frame.f_back is not None:
                frame = frame.f_back  # @torch.no_grad(): the decorated function's call
            place = (frame.f_code, frame.f_lineno)
            known = places.get(place)
            if known:
                self.open = (context, place, None)
                machine.optimizer_begin(clock())
            elif known is None and len(places) < MAX_PLACES:
                self.learn(context, place)

        def exit(context: Any, *exc_info: Any) -> None:
            exit_(context, *exc_info)
            opened = self.open
            if opened is None or opened[0] is not context:
                return
            self.open = None
            if opened[2] is None:  # also when it raised, as a timed optimizer step ends
                machine.optimizer_end(clock())
                counted[opened[1]] = counted.get(opened[1], 0) + 1
                self.after = machine.backwards  # (settled by the step's end: exact)
            else:
                self.learnt(opened[1], opened[2], exc_info[0] is None)

        def remove() -> None:
            no_grad.__enter__, no_grad.__exit__ = enter_, exit_

        no_grad.__enter__, no_grad.__exit__ = enter, exit
        self.removed = remove

    def detach(self) -> None:
        """A torch optimizer exists: its steps are the steps; no_grad runs bare from now on."""
        if self.removed is not None:
            self.removed()
            self.removed = None
        if self.open is not None and self.open[2] is not None:
            self._stop(self.open[2][1])
        self.open = None

    def forked(self) -> None:
        """A forked child: its own steps (the machine was reset), nothing counted yet."""
        self.after, self.open, self.watchers = 0, None, []
        self.counted.clear()  # (the wrappers hold this dict)

    def learn(self, context: Any, place: Place) -> None:
        """The first block at `place`: watched for a write to a parameter, timed from now."""
        if self.watcher_class is None:
            self.watcher_class = watcher_class()
        watcher = self.watcher_class()
        start = self.clock()
        watcher.__enter__()
        self.open = (context, place, (start, watcher, self._state()))

    def learnt(self, place: Place, learning: tuple[float, Any, tuple], completed: bool) -> None:
        """The first block at `place` ended (`completed`: without an exception): an update there?"""
        now = self.clock()
        start, watcher, state = learning
        self._stop(watcher)
        self.places[place] = watcher.wrote
        # timed after the fact: only when nothing else reached the machine meanwhile (a forward
        # inside the block: the update is taken from the next block at this place on)
        if watcher.wrote and completed and self._state() == state:
            self.machine.optimizer_begin(start)
            self.machine.optimizer_end(now)
            self.counted[place] = self.counted.get(place, 0) + 1
            self.after = self.machine.backwards

    def _state(self) -> tuple:
        """What an event reaching the machine changes (read without replaying the C path's events)."""
        m = self.machine
        return (m.unsettled, m.backwards_now(), m.forwards, m.batches, m.quiet_forwards, m.in_eval, m.part)

    def _stop(self, watcher: Any) -> None:
        """Pop the watching mode — and any left below a mode pushed meanwhile, once on top again."""
        from torch.overrides import _get_current_function_mode_stack

        self.watchers.append(watcher)
        while self.watchers:
            stack = _get_current_function_mode_stack()
            if not stack or stack[-1] is not self.watchers[-1]:
                return  # another mode on top: popped at a later block's end
            self.watchers.pop().__exit__(None, None, None)

    def records(self) -> list[dict[str, Any]]:
        """The places whose blocks were counted as steps: file, line, function, steps."""
        return [
            {"file": code.co_filename, "line": line, "function": code.co_name, "steps": steps}
            for (code, line), steps in self.counted.items()
        ]


def watcher_class() -> type:
    """A TorchFunctionMode that notes whether the torch calls it sees write a parameter in place:
    a leaf tensor that requires grad, or its `.data` or `.detach()` (built at first use: torch is
    imported by then, never by dlscope)."""
    import torch
    from torch.overrides import TorchFunctionMode

    class ParameterWrites(TorchFunctionMode):
        def __init__(self) -> None:
            super().__init__()
            self.wrote = False
            self.views: list[Any] = []  # `.data` and `.detach()` of parameters taken in the block

        def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: Any = None) -> Any:
            result = func(*args, **(kwargs or {}))
            if self.wrote or not args:
                return result
            name = getattr(func, "__name__", "")
            if (name.endswith("_") and not name.endswith("__")) or name in INPLACE_OPERATORS:
                first = args[0]
                self.wrote = any(self.parameter(t) for t in (first if isinstance(first, list | tuple) else (first,)))
            elif name in ("__get__", "__set__", "detach") and self.parameter(args[0]):
                field = getattr(getattr(func, "__self__", None), "__name__", "")
                if name == "__set__" and field == "data":  # p.data = ...
                    self.wrote = True
                elif name == "detach" or field == "data":
                    self.views.append(result)
            return result

        def parameter(self, t: Any) -> bool:
            if not isinstance(t, torch.Tensor):
                return False
            return (t.requires_grad and t.is_leaf) or any(t is v for v in self.views)

    return ParameterWrites
