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
was, none is (a metric computed under no_grad after backward()).

Outside no_grad, the old style (`p.data.add_(p.grad, alpha=-lr)`, `p.data = p.data - lr * p.grad`:
pytorch/examples' word_language_model and regression): while no torch optimizer exists,
`Tensor.data` is a property of ours (+~0.1 µs an access). The first `.data` of a parameter after a
step-ending backward(), in the steps' thread, outside an optimizer step and a no_grad block, opens
a window. The window closes at the machine's next event (a forward, a backward, train(), a
checkpoint: each wrapped on the machine while the window is open, and stamped again after), as a
DataLoader call starts (before it reads its clock), at a no_grad block, or at exit. Writes seen:
the update, from that first `.data` to the end of the last write, is fed to the machine then,
before the event (only when nothing reached the machine meanwhile). The first window at a place
(the `.data`'s line) is watched by the same mode (every torch call in it); a place whose window saw
no write (a weight norm logged after backward()) opens none again; at a place where one was seen,
each parameter's `.data` in the window is a DataView, a tensor type whose own `__torch_function__`
times the writes to it, so that only the calls on those views cost (~2 µs each), not the others.
Not seen: a functional update (`torch.func`, new tensors each step), `p.detach().add_()` alone,
and the first update through `.data` that nothing but the next backward() follows (no module
called, no DataLoader: the C fast path times backward() with no event a window can close at).
Such a window is found stale at the next `.data`; backward() is then timed through Python (a
frame a step, in this process only), whose event closes the next windows.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

from dlscope.contract.owncode import is_dlscope_code

MAX_PLACES = 64  # places learnt; past them a new place is no update (code generated anew each step)
# torch calls a window's mode looks at, at most: a window that nothing closes (no forward of a
# module, no DataLoader, no no_grad block, no `.data` again) costs no more than the mode's dispatch
WATCHED_CALLS = 10_000
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
# the machine's events that close an open window of an update outside no_grad: the next step's
# work; each stamped before its call, where its work then starts, so stamped again once the update
# is fed (a DataLoader call, whose work comes before its event, closes the window as it starts: hooks.py)
WINDOW_CLOSERS = ("forward_begin", "backward_begin", "train_mode", "checkpoint_begin")


class Updates:
    """One per process, beside the step machine (`machine`: optimizer_begin/optimizer_end, and
    `backwards_now`, `step_thread`, `optimizer_depth` to read)."""

    def __init__(
        self,
        machine: Any,
        thread_id: Callable[[], int],
        clock: Callable[[], float] = time.time,
        backward_events: Callable[[], None] | None = None,
    ) -> None:
        self.machine, self.thread_id, self.clock = machine, thread_id, clock
        # asks for backward() timed through the machine's Python-visible events (hooks.py): once,
        # for an update through `.data` that only the next backward() follows
        self.backward_events = backward_events
        self.places: dict[Place, bool] = {}  # place → an update was seen there
        self.counted: dict[Place, int] = {}  # place → updates counted as steps there
        self.after = 0  # the machine's step-ending backward() calls when the last update ended
        # the outermost block being timed: (its context manager, place, None) at an update's place;
        # (…, place, (start, the mode watching it, the machine's state at its start)) when learnt
        self.open: tuple[Any, Place, tuple[float, Any, tuple] | None] | None = None
        self.watchers: list[Any] = []  # modes left on torch's stack (another mode pushed above them)
        self.removed: Callable[[], None] | None = None  # restores no_grad's and Tensor.data's own
        self.watcher_class: Any = None
        self.bare_places: dict[Place, bool] = {}  # a `.data`'s place → a window it opened saw a write
        # the open window of an update outside no_grad: (start, its writes (wrote, last), the
        # mode watching it (None at an update's place), the machine's state at its start, place,
        # the machine's events it replaced: name → what was there)
        self.window: tuple[float, Any, Any, tuple, Place, dict[str, Any]] | None = None
        self.view_class: Any = None  # DataView, built at first use
        self.closers = {name: self._closing(name) for name in WINDOW_CLOSERS}

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
            if self.window is not None:  # an update outside no_grad ends where a no_grad block starts
                self.close_window()
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

        tensor = torch.Tensor
        data = torch._C.TensorBase.__dict__["data"]
        get_, set_ = data.__get__, data.__set__
        own_data = tensor.__dict__.get("data")  # (none in torch 2.x: TensorBase's descriptor)

        def opens(t: Any) -> bool:
            """`t` is a parameter whose `.data` may start an update outside no_grad now."""
            return (
                self.window is None
                and t.requires_grad
                and t.is_leaf
                and self.open is None
                and not machine.optimizer_depth
                and machine.backwards_now() > self.after
                and thread_id() == machine.step_thread
            )

        def data_get(t: Any) -> Any:
            view = get_(t)
            window = self.window
            if window is not None and machine.backwards_now() != window[3][1]:
                # a backward() passed it unclosed (the C fast path's, which wraps no machine event:
                # a loop with no module, no DataLoader). Its update is lost; for the next ones,
                # backward() is timed through the machine's events from now on, and they close at
                # it. If that cannot be (done already), its place is left untimed
                self.close_window(feed=False)
                retry = window[1].wrote and self.backward_events is not None
                if retry:
                    self.backward_events()  # type: ignore[misc]
                    self.backward_events = None
                self.bare_places[window[4]] = retry
                window = None
            if window is None:
                if not opens(t) or not self.open_window(sys._getframe(1)):
                    return view
                window = self.window
                if window[2] is not None:  # learning: the mode watches the view
                    window[2].seen(view)
                    return view
            elif window[2] is not None or not (t.requires_grad and t.is_leaf) or thread_id() != machine.step_thread:
                return view
            # at an update's place: the view times its own writes, nothing else is watched
            return view.as_subclass(self.view_class)

        def data_set(t: Any, value: Any) -> None:
            if self.window is None and opens(t):
                self.open_window(sys._getframe(1))
            set_(t, value)  # (seen by a learning window's mode as a write)
            window = self.window
            if window is not None and window[2] is None and t.requires_grad and t.is_leaf:
                window[1].wrote, window[1].last = True, self.clock()

        def remove() -> None:
            no_grad.__enter__, no_grad.__exit__ = enter_, exit_
            if own_data is None:
                del tensor.data
            else:
                tensor.data = own_data

        no_grad.__enter__, no_grad.__exit__ = enter, exit
        tensor.data = DataProperty(data_get, data_set, doc=data.__doc__)
        self.removed = remove

    def detach(self) -> None:
        """A torch optimizer exists: its steps are the steps; no_grad and `.data` run bare from now on."""
        if self.removed is not None:
            self.removed()
            self.removed = None
        if self.open is not None and self.open[2] is not None:
            self._stop(self.open[2][1])
        self.open = None
        self.close_window(feed=False)

    def forked(self) -> None:
        """A forked child: its own steps (the machine was reset), nothing counted yet."""
        self.close_window(feed=False)  # (its mode is popped in the child only)
        self.after, self.open, self.watchers = 0, None, []
        self.counted.clear()  # (the wrappers hold this dict)

    def open_window(self, frame: Any) -> bool:
        """A parameter's `.data` after a step-ending backward(), at `frame`'s line: watched and timed
        from now, unless a window opened there before saw no write. The machine's next event closes it."""
        place = (frame.f_code, frame.f_lineno)
        known = self.bare_places.get(place)
        if known is False or (known is None and len(self.bare_places) >= MAX_PLACES):
            return False
        if known is None and is_dlscope_code(frame.f_code.co_filename):
            self.bare_places[place] = False  # dlscope's own `.data`: never the script's update
            return False
        if known:  # an update's place: its `.data` views time their own writes (no mode)
            if self.view_class is None:
                self.view_class = view_class(self)
            writes, watcher = Writes(), None
        else:
            if self.watcher_class is None:
                self.watcher_class = watcher_class()
            writes = watcher = self.watcher_class(self.clock)
        start = self.clock()
        if watcher is not None:
            watcher.__enter__()
        attributes = self.machine.__dict__
        replaced = {name: attributes.get(name) for name in WINDOW_CLOSERS}
        attributes.update(self.closers)
        self.window = (start, writes, watcher, self._state(), place, replaced)
        return True

    def view_wrote(self) -> None:
        """A DataView of the open window was written in place: the update lasts at least until now."""
        if self.window is not None:
            writes = self.window[1]
            writes.wrote, writes.last = True, self.clock()

    def _closing(self, name: str) -> Callable[..., Any]:
        def closes_then(now: float, *args: Any, **kwargs: Any) -> Any:
            self.close_window()
            # its work starts after the update was fed: stamped again
            return getattr(self.machine, name)(self.clock(), *args, **kwargs)

        return closes_then

    def close_window(self, feed: bool = True) -> None:
        """The open window ends (`feed`: its writes, if any, fed to the machine as the update)."""
        if self.window is None:
            return
        start, writes, watcher, state, place, replaced = self.window
        self.window = None
        attributes, closers = self.machine.__dict__, self.closers
        for name, before in replaced.items():
            if attributes.get(name) is closers[name]:  # (not replaced since)
                if before is None:
                    del attributes[name]
                else:
                    attributes[name] = before
        if watcher is not None:
            self._stop(watcher)
        if not feed:
            return
        self.bare_places[place] = self.bare_places.get(place) or writes.wrote
        machine = self.machine
        if writes.wrote and self._state() == state and not machine.optimizer_depth:
            machine.ended_late = True
            try:
                machine.optimizer_begin(start)
                machine.optimizer_end(writes.last)
            finally:
                machine.ended_late = False
            self.counted[place] = self.counted.get(place, 0) + 1
            self.after = machine.backwards

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
        from torch.overrides import _get_current_function_mode_stack  # (imported by then: a lookup)

        self.watchers.append(watcher)
        while self.watchers:
            stack = _get_current_function_mode_stack()
            if not stack or stack[-1] is not self.watchers[-1]:
                return  # another mode on top: popped at a later block's end
            self.watchers.pop().__exit__(None, None, None)

    def records(self) -> list[dict[str, Any]]:
        """The places whose updates were counted as steps: file, line, function, steps, and how
        the update was found ("no_grad": a block's `with` or decorated call; "data": the first
        `.data` of an update outside no_grad)."""
        return [
            {
                "file": code.co_filename,
                "line": line,
                "function": code.co_name,
                "steps": steps,
                "kind": "data" if (code, line) in self.bare_places else "no_grad",
            }
            for (code, line), steps in self.counted.items()
        ]


class Writes:
    """A window's writes at an update's place: whether any, and when the last one returned."""

    __slots__ = ("last", "wrote")

    def __init__(self) -> None:
        self.wrote, self.last = False, 0.0


def view_class(updates: Updates) -> type:
    """The tensor type a parameter's `.data` is at an update's place, in its window: a torch call
    on one is seen by its `__torch_function__` (and no other call is: a mode would see them all),
    which tells `updates` of each write to it; its results are plain tensors, and it pickles as
    one (built at first use: torch is imported by then, never by dlscope)."""
    import torch

    plain = torch._C._disabled_torch_function_impl  # the call as on a plain tensor, its results plain

    class DataView(torch.Tensor):
        @classmethod
        def __torch_function__(cls, func: Any, types: Any, args: tuple = (), kwargs: Any = None) -> Any:
            result = plain(func, types, args, kwargs or {})
            name = getattr(func, "__name__", "")
            if args and ((name.endswith("_") and not name.endswith("__")) or name in INPLACE_OPERATORS):
                first = args[0]
                if any(isinstance(t, cls) for t in (first if isinstance(first, list | tuple) else (first,))):
                    updates.view_wrote()
            return result

        def __reduce_ex__(self, protocol: Any) -> Any:
            return self.as_subclass(torch.Tensor).__reduce_ex__(protocol)

    return DataView


class DataProperty(property):
    """`Tensor.data` while no torch optimizer exists. Named as torch's own descriptor: torch hands a
    mode the attribute's `__get__`/`__set__`, and the mode tells `.data` from `.grad` by that name."""

    __name__ = "data"


def watcher_class() -> type:
    """A TorchFunctionMode that notes whether the torch calls it sees write a parameter in place:
    a leaf tensor that requires grad, or its `.data` or `.detach()` (built at first use: torch is
    imported by then, never by dlscope). `.data` while it is ours (DataProperty) it reads and
    writes through torch's own descriptor: ours is never entered from inside the mode."""
    import torch
    from torch.overrides import TorchFunctionMode

    descriptor = torch._C.TensorBase.__dict__["data"]

    class ParameterWrites(TorchFunctionMode):
        """`clock` given: every write timed (`last`: when the last one returned), not only the first seen."""

        def __init__(self, clock: Callable[[], float] | None = None) -> None:
            super().__init__()
            self.wrote, self.clock, self.last, self.calls = False, clock, 0.0, 0
            self.views: list[Any] = []  # `.data` and `.detach()` of parameters taken in the block
            self.view_ids: set[int] = set()  # (of tensors `views` keeps alive)

        def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: Any = None) -> Any:
            if isinstance(getattr(func, "__self__", None), DataProperty):
                result = getattr(descriptor, func.__name__)(*args)  # torch's `.data`, not ours again
            else:
                result = func(*args, **(kwargs or {}))
            self.calls += 1
            if (self.wrote and self.clock is None) or not args or self.calls > WATCHED_CALLS:
                return result
            name = getattr(func, "__name__", "")
            wrote = False
            if (name.endswith("_") and not name.endswith("__")) or name in INPLACE_OPERATORS:
                first = args[0]
                wrote = any(self.parameter(t) for t in (first if isinstance(first, list | tuple) else (first,)))
            elif name in ("__get__", "__set__", "detach") and self.parameter(args[0]):
                field = getattr(getattr(func, "__self__", None), "__name__", "")
                if name == "__set__" and field == "data":  # p.data = ...
                    wrote = True
                elif name == "detach" or field == "data":
                    self.seen(result)
            if wrote:
                self.wrote = True
                if self.clock is not None:
                    self.last = self.clock()
            return result

        def seen(self, view: Any) -> None:
            """A view of a parameter's storage: a write to it is a write to the parameter."""
            self.views.append(view)
            self.view_ids.add(id(view))

        def parameter(self, t: Any) -> bool:
            if not isinstance(t, torch.Tensor):
                return False
            return (t.requires_grad and t.is_leaf) or id(t) in self.view_ids

    return ParameterWrites
