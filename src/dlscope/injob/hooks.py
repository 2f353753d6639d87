"""Inside a process `dlscope run` observes: torch's own extension points turned into the events of
the step machine (stepmachine.py, where every rule about steps, parts and phases lives) — the
user's script is not changed.

Installed by the bootstrap (injob/bootstrap) before the script runs; nothing touches torch
until the script imports it (a finder on sys.meta_path calls `attach_torch` right after the
module is executed — not when something merely asks `importlib.util.find_spec("torch")`).

What feeds the machine: the `step` of every torch optimizer's class, timed from its call to its
return (torch.optim, GradScaler.step, LBFGS, an optimizer wrapped by accelerate or Lightning
alike: each calls a torch optimizer's `step`), the forward of the modules called at top level
(found by torch's global module forward hooks until a step ends, then timed by their class's own
`__call__`, `root_call`: no module call, submodules included, takes `Module._call_impl`'s slow path),
`torch.autograd.backward`, DataLoader iterators' `__next__`, `Module.train`, and the checkpoint
writers and readers (`torch.save`/`torch.load`, `safetensors.torch`, Lightning's TorchCheckpointIO,
the HF Trainer's `_save_checkpoint`).

A forward is an evaluation forward when grad is off, or when the module run is in eval mode —
a wrapper (DistributedDataParallel) left in eval mode around a module in train mode runs a
training forward (Lightning restores only the inner module after its sanity check).
"""

from __future__ import annotations

import atexit
import bisect
import contextlib
import functools
import inspect
import os
import socket
import sys
import time
import warnings
import weakref
from collections.abc import Callable, Iterator
from typing import Any

from dlscope import phases
from dlscope.contract.env import PROFILE_ENV
from dlscope.contract.records import clocks, profile_trace_path
from dlscope.contract.requests import REQUEST_EVERY_S, take_request
from dlscope.injob import batches, calibrate, gpuclock, subnormals, tracebacks
from dlscope.injob import change as trial
from dlscope.injob import hangagent as hang
from dlscope.injob.after_import import AfterImport
from dlscope.injob.recorder import RecordFile
from dlscope.injob.stepmachine import StepMachine, _fastpath, native_thread_id
from dlscope.injob.updates import Updates

PROFILE_BUDGET_S = 5.0  # active recording stops at the first step end past this (an LBFGS step can be huge)
LIGHTNING_CHECKPOINT_IO = ("lightning.fabric.plugins.io.torch_io", "lightning_fabric.plugins.io.torch_io")
# torch.autograd.backward's parameters, in order (torch 2.x): its timed wrapper spells them out
BACKWARD_PARAMETERS = ("tensors", "grad_tensors", "retain_graph", "create_graph", "grad_variables", "inputs")
FILE_KEYWORDS = ("f", "filename", "path", "filepath")  # how the wrapped writers and readers name their file
SKIPPED_KEPT = 100  # the step numbers of the first GradScaler steps skipped


class LateProfiler:
    """torch.profiler over real steps, one window at a time, driven by step ends. The scheduled
    window: started after `start_after` steps (start-up is not profiled), then `wait`, `warmup`
    and `active` steps on torch's schedule. Windows on demand (`dlscope attach`, attach.py): a
    request taken at a step end starts one warm-up step and then the requested active steps; it is
    looked for only while no window records, at most once every REQUEST_EVERY_S. Steps are labelled
    from the profiler's own state and step number (ProfilerStep#N).

    The recorded steps are the training steps as the step machine has them, each from its start to
    its end (`recorded`): torch's ProfilerStep#N runs from one `prof.step()` to the next, so the
    one of a step after an evaluation or a checkpoint holds them too (and a DataLoader's `iter()`).
    The top-10's operators are those that started inside a recorded step; the window's others are
    written apart (`between_ops`). A window cut by PROFILE_BUDGET_S stops at the step end past it,
    with no `prof.step()` first: that would open a ProfilerStep mark that no step fills.

    No `with_flops`, and `record_shapes` only in a rank of a distributed job (the all-reduce bytes
    are read from the collectives' Input Dims): together on a 4-layer GPT-2 step they took peak
    memory from 1.45 GB (plain profiler) to 4 GB, never released. Lost: FLOP counts in the top-10,
    and input shapes outside distributed jobs."""

    def __init__(self, records: RecordFile, start_after: int, wait: int, warmup: int, active: int) -> None:
        self.records = records
        self.start_after, self.wait, self.warmup, self.active = start_after, wait, warmup, active
        self.scheduled = active > 0  # the scheduled window is still to come
        self.prof: Any = None  # the window recording now
        # its facts: trigger, request id, and `recorded`: [index, N of its ProfilerStep#N, start, end]
        # of each training step it recorded whole
        self.window: dict[str, Any] = {}
        self.window_start: float | None = None  # when its first active step started
        self.delivered = 0  # windows written so far (names their trace files)
        self.next_check = 0.0  # when to look for a request next
        self.done = False  # True: no window will start any more (a forked child)
        self.memory_history = False  # torch's CUDA memory history records during the window
        self.idle_until = float("-inf")  # the step machine asks again from then on (StepProfiler)

    def after_step(self, index: int, start: float, now: float) -> tuple[str | None, int | None]:
        if self.prof is None:
            if self.done:
                self.idle_until = float("inf")
                return None, None
            if self.scheduled and index + 1 >= self.start_after:
                self.scheduled = False
                self._start({"trigger": "schedule"}, self.wait, self.warmup, self.active)
            elif now >= self.next_check:
                self.next_check = now + REQUEST_EVERY_S
                request = take_request(self.records.directory, self.records.pid)
                if request is None:
                    if not self.scheduled:  # nothing to do before the next look for a request
                        self.idle_until = self.next_check
                    return None, None
                self.records.write({"k": "profile_taken", "request": request.get("id"), "step": index, "ts": now})
                self._start({"trigger": "attach", "request": request.get("id")}, 0, 1, request["steps"])
            else:
                return None, None
        else:
            recording = self._recording()
            if recording:
                self.window["recorded"].append([index, int(self.prof.step_num), start, now])
            # (window_start is set once a step records: at the step end before it, by _label)
            over = recording and now - self.window_start > PROFILE_BUDGET_S
            if over:
                self.window["cut"] = PROFILE_BUDGET_S
            with _quiet():
                if not over:
                    self.prof.step()
                if over or self.window.get("delivered"):
                    self.prof.stop()  # over budget: delivers the steps recorded so far
                    self.prof = None
                    self.idle_until = self.next_check
                    return None, None
        return self._label()

    def _label(self) -> tuple[str | None, int | None]:
        """How the step that starts now is profiled, and the N of its ProfilerStep#N."""
        from torch.profiler import ProfilerAction

        action = self.prof.current_action
        if self.window_start is None and self._recording():
            self.window_start = time.time()
        label = {ProfilerAction.NONE: "wait", ProfilerAction.WARMUP: "warmup"}.get(action, "active")
        return label, int(self.prof.step_num)

    def _recording(self) -> bool:
        from torch.profiler import ProfilerAction

        return self.prof.current_action in (ProfilerAction.RECORD, ProfilerAction.RECORD_AND_SAVE)

    def _start(self, window: dict[str, Any], wait: int, warmup: int, active: int) -> None:
        import torch
        from torch.profiler import ProfilerActivity, profile, schedule

        self.window, self.window_start, self.idle_until = {**window, "recorded": []}, None, float("-inf")
        activities = [ProfilerActivity.CPU]
        self.memory_history = False
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            activities.append(ProfilerActivity.CUDA)
            self.memory_history = gpuclock.memory_history_start(torch)
        self.prof = profile(
            activities=activities,
            schedule=schedule(wait=wait, warmup=warmup, active=active, repeat=1),
            on_trace_ready=self._ready,
            record_shapes=_distributed(torch),
            profile_memory=False,  # True makes the allocator warn on the script's stderr
            with_flops=False,
        )
        with _quiet():
            self.prof.start()

    def stop(self) -> None:
        """At exit: a window cut short by the script's end still delivers the steps it recorded
        (the step the script ended in is none: its operators are the window's others)."""
        if self.prof is not None:
            with _quiet():
                self.prof.stop()
            self.prof = None
        self.done, self.idle_until = True, float("inf")

    def _ready(self, prof: Any) -> None:
        import torch
        from torch.autograd import DeviceType

        stopped, start = time.time(), time.perf_counter()  # (the window has stopped recording)
        directory, pid = self.records.directory, self.records.pid
        trace = profile_trace_path(directory, pid, self.delivered)
        prof.export_chrome_trace(trace)
        recorded = self.window["recorded"]
        # the profiler's times are µs since its trace's start, CLOCK_REALTIME as the steps' are
        origin_us = prof.profiler.kineto_results.trace_start_ns() / 1e3
        cpu = [e for e in prof.events() if getattr(e, "device_type", DeviceType.CPU) == DeviceType.CPU]
        inside, between = _split_by_steps(cpu, [(s * 1e6 - origin_us, e * 1e6 - origin_us) for _, _, s, e in recorded])
        self.records.write(
            {
                "k": "profile",
                "trace": trace,
                "ops": _operators(inside),
                # what else ran while it recorded (an evaluation, a checkpoint), less torch's step marks
                "between_ops": [op for op in _operators(between) if not op["key"].startswith("ProfilerStep")],
                "export_seconds": round(time.perf_counter() - start, 4),
                "trigger": self.window.get("trigger"),
                "request": self.window.get("request"),
                "steps": [recorded[0][0], recorded[-1][0]] if recorded else None,
                "recorded": recorded,
                "cut": self.window.get("cut"),  # the budget in seconds, when past it the window stopped
                "stopped": stopped,
                "ts": time.time(),
            }
        )
        if self.memory_history:  # the window's allocations: a snapshot file and its top sites
            self.memory_history = False
            snapshot = os.path.join(directory, f"memory-{pid}-{self.delivered + 1}.pickle")
            self.records.write({"k": "gpu_memory", **gpuclock.memory_history_stop(torch, snapshot)})
        self.delivered += 1
        self.window["delivered"] = True


class TorchHooks:
    """One per process: patches torch and hands what it sees to the step machine."""

    def __init__(self, records: RecordFile, profile: tuple[int, int, int, int]) -> None:
        self.records = records
        self.profile_settings = profile
        self.torch: Any = None
        self.is_compiling: Callable[[], bool] = lambda: False
        self.memory_files = _open_memory_files()
        self.machine = StepMachine(
            records,
            self.new_profiler(),
            self._peak_memory,
            (self._mark_begin, self._mark_end),
        )
        # the update a script writes itself under no_grad, while no torch optimizer exists (updates.py)
        self.updates = Updates(self.machine, native_thread_id, backward_events=self.backward_through_python)
        self.forward_depth = self.train_depth = 0
        # the classes of the modules called at top level, timed by `root_call`: their own `__call__` (or None)
        self.timed_classes: dict[type, Callable | None] = {}
        # the classes whose `forward` a script calls directly (`_time_forward`): their own `forward` (or None)
        self.timed_forwards: dict[type, Callable | None] = {}
        self.discovery: list[Any] = []  # torch's global forward hooks' handles, while `discover` runs
        self.on_step: Callable[[int, float], None] | None = None  # the machine's, while discovering
        self.untimed_roots = False  # a top-level module with a call of its own: discovery never ends
        self.batches: batches.BatchRecorder | None = None  # the batch x-ray, once torch is attached
        self.trial: Any = None  # a `dlscope doctor` trial's change and stop (injob/change.py)
        self.untimed_backward: Callable | None = None  # torch's own, once the step hooks are in
        self.gpu: gpuclock.GpuClock | None = None  # the steps on the GPU's clock, where CUDA is available
        # the optimizer classes whose `step` is timed (`time_optimizer`), and GradScaler
        # (`time_scaler`): their own `step` (or None)
        self.timed_optimizers: dict[type, Callable | None] = {}
        # the optimizer instance stepping at top level, since which step count; each instance's
        # class and steps (by id: none is kept alive); how often one stepped again after another
        self._forget_optimizers()

    def _mark_begin(self, name: str) -> None:
        phases.mark_begin(name)  # the I/O tracers' phase marker
        hang.phase(name)  # the live status file the watchdog reads

    def _mark_end(self, name: str) -> None:
        phases.mark_end(name)
        stack = self.machine.stack  # `name` is already popped: the phase now open, if any
        hang.phase(stack[-1] if stack else "")

    def _step_ended(self, steps: int, now: float) -> None:
        """A doctor trial's step end: the live status file's, then the trial's (it stops after K)."""
        hang.step_ended(steps, now)
        self.trial.step_ended(steps, now)

    def new_profiler(self) -> LateProfiler:
        return LateProfiler(self.records, *self.profile_settings)

    # process ---------------------------------------------------------------------------------
    def begin_process(self, forked: bool) -> None:
        # a forked child or a multiprocessing worker (DataLoader workers) inherits RANK but is no rank
        worker = forked or "--multiprocessing-fork" in sys.argv
        self.records.write(
            {
                "k": "process",
                "pid": os.getpid(),
                "ppid": os.getppid(),
                "argv": list(sys.argv) or [sys.executable],
                "rank": None if worker else _env_int("RANK"),
                "world_size": None if worker else _env_int("WORLD_SIZE"),
                "clocks": clocks(),
                "host": socket.gethostname(),
                "launcher": None if worker else launcher_env(),
                "forked": forked,
                "profile": list(self.profile_settings),  # start_after, wait, warmup, active
            }
        )
        if not forked:
            self.machine.begin("startup", time.time())

    def after_fork(self) -> None:
        """A forked child (a DataLoader worker, or a process training too: hogwild, A3C): its own
        records, its own steps, no profiler."""
        self.records.reopen()
        if self.gpu is not None:
            self.gpu.after_fork()
        watch = self.machine.watch
        self.machine.reset(self.new_profiler())
        self.machine.profiler.done = True
        if watch is not None:  # a process that trains too (hogwild) has steps of its own to watch
            self.machine.watch = watch.forked()
        self.forward_depth = self.train_depth = 0
        self._forget_optimizers()
        self.updates.forked()
        self.memory_files = _open_memory_files()
        self.begin_process(forked=True)

    def set_num_threads(self, set_: Callable, threads: int) -> None:
        set_(threads)
        self.torch_threads(self.torch.get_num_threads())

    def torch_threads(self, threads: int) -> None:
        """The process's intra-op threads as torch now has them, against the cores it may run on
        (sharing.py reads the last: a forked child that sets none has its parent's)."""
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        self.records.write({"k": "torch_threads", "threads": threads, "cores": cores})

    def _loader_worker(self, worker_id: int) -> None:
        """This forked child is a DataLoader worker: its records say so (its live file is marked by
        the hang agent's own wrapper of the worker loop), and its step machine starts nothing."""
        self.records.write({"k": "loader_worker", "worker_id": worker_id})
        self.machine.data_worker()

    def finish(self) -> None:
        try:
            self.updates.close_window()  # the last step's update outside no_grad, if its window is open
            if self.gpu is not None:
                self.gpu.finish()
            self._stepping_ends()
            if self.optimizers_stepped:
                stepped, returns = self.optimizers_stepped, self.optimizers_returned
                skipped = {"scaler_skipped": self.scaler_skipped, "scaler_skipped_steps": self.scaler_skipped_steps}
                self.records.write({"k": "optimizers", "stepped": stepped, "returns": returns, **skipped})
            if self.eval_mode_steps:
                self.records.write({"k": "eval_mode_steps", **self.eval_mode_steps})
            if self.eval_grad_forwards:
                self.records.write({"k": "eval_grad", "forwards": self.eval_grad_forwards})
            if self.updates.counted:
                self.records.write({"k": "updates", "places": self.updates.records()})
            self.machine.finish(time.time(), torch_attached=self.torch is not None)
        finally:
            self.records.close_steps()
            self.records.write({"k": "end", "clocks": clocks()})

    # torch events ----------------------------------------------------------------------------
    def loader_next(self, next_: Callable, iterator: Any) -> Any:
        if self.trial is not None:  # a doctor trial also counts the CPU this thread spends fetching
            return self.trial.loader_next(self._loader_next, next_, iterator)
        return self._loader_next(next_, iterator)

    def _loader_next(self, next_: Callable, iterator: Any) -> Any:
        drawn = False
        if self.updates.window is not None:  # the update outside no_grad before it ends here
            self.updates.close_window()
        if self.gpu is not None:
            self.gpu.mark_start()
        start = time.time()
        try:
            batch = next_(iterator)
            drawn = True
            return batch
        finally:
            end = time.time()
            if drawn:
                self.machine.loader_next(start, end, getattr(iterator, "_dataset", None))
            else:  # the iterator ended (or failed): no batch, though its time is the loop's wait
                self.machine.loader_waited(start, end, getattr(iterator, "_dataset", None))
            if self.batches is not None:
                self.batches.delivered(iterator, start, end)

    def loader_iter(self, iter_: Callable, loader: Any) -> Any:
        """`DataLoader.__iter__`: a new pass, its workers started (or a persistent worker's reset)."""
        if self.updates.window is not None:
            self.updates.close_window()
        if self.gpu is not None:
            self.gpu.mark_start()
        start = time.time()
        try:
            return iter_(loader)
        finally:
            self.machine.loader_waited(start, time.time(), getattr(loader, "dataset", None))

    def timed_loader_next(self, next_: Callable) -> Callable:
        """A DataLoader iterator's `__next__`, its time the step's data."""
        return _wrap(next_, self.loader_next)

    def forward_pre(self, module: Any, args: Any) -> None:
        """torch's global forward pre-hook, while discovering: an outermost call starts (its
        module's class gets a timed `__call__` of its own, `root_call`, from its next call on)."""
        if self.forward_depth:  # a submodule: one compare, nothing else
            self.forward_depth += 1
            return
        if self.is_compiling():
            return
        self.forward_depth = 1
        self.machine.forward_begin(time.time(), self._training(module))
        if self.trial is not None:
            self.trial.forward_begin()
        self._time_root(module)

    def forward_post(self, module: Any, args: Any, output: Any) -> Any:
        if self.forward_depth > 1:
            self.forward_depth -= 1
            return None
        if not self.forward_depth:
            return None
        self.forward_depth = 0
        self.machine.forward_end(time.time())
        return self.trial.forward_end(output) if self.trial is not None else None

    def _training(self, module: Any) -> bool:
        return self.torch.is_grad_enabled() and (module.training or self._runs_training(module))

    def _time_root(self, module: Any) -> None:
        """`module`, called at top level: its class's calls timed from now on by `root_call`, set
        as the class's `__call__` (a class attribute: never pickled nor deep-copied with a
        module, and a DataParallel replica or a copy calls it as itself). Any other instance of the
        class called at top level is timed alike (a loss module built anew at each step). When the
        call is made inside a module's `forward` run directly (`self.forward(x)`), that module's
        class gets a timed `forward` too (`_time_forward`)."""
        outer = _direct_forward_caller(self.torch.nn.Module, module)
        if outer is not None:
            self._time_forward(type(outer))
        cls = type(module)
        if cls in self.timed_classes or isinstance(module, self.torch.jit.ScriptModule):
            # timed already, yet this call went past `root_call` (a call of its own): the global hooks stay on
            self.untimed_roots = True
            return
        own = cls.__dict__.get("__call__")  # the class's own `__call__` (OptimizedModule's); None: inherited
        self.timed_classes[cls] = own
        cls.__call__ = self.root_call(cls, own)

    def root_call(self, cls: type, own: Callable | None) -> Callable:
        """A top-level module's call, timed as the step's forward (or an evaluation forward): one
        frame in place of torch's global hooks, which send every module call, submodules
        included, through `Module._call_impl`'s slow path (~20,000 instructions a call).

        The frame does the work of torch's `Module.__call__` (`_wrapped_call_impl`) in its place,
        rather than calling it: one layer of `*args, **kwargs` less, ~2,000 instructions a call.
        Only for a module of this very class whose classes up to `Module` had no `__call__` of
        their own (one timed since is a call that would pass on: skipped alike), while torch.fx
        has not patched `Module.__call__`; any other call goes through the call it replaces."""
        hooks, machine, trial, clock = self, self.machine, self.trial, time.time
        # torch.compile's tracing sees this call (the class's `__call__` is not torch's): it reads
        # True there, and the call passes on untouched (one Python frame; `is_compiling` is two)
        is_tracing, grad_enabled = self.torch.compiler.is_dynamo_compiling, self.torch.is_grad_enabled
        module_class = self.torch.nn.Module
        torch_call = getattr(module_class, "_wrapped_call_impl", None)
        bases = cls.__mro__[1 : cls.__mro__.index(module_class)]
        # (whether torch.fx has patched `Module.__call__` is asked at each call)
        direct = own is None and torch_call is not None and not any("__call__" in base.__dict__ for base in bases)

        def call(module: Any, *args: Any, **kwargs: Any) -> Any:
            if direct and type(module) is cls and module_class.__call__ is torch_call:
                compiled = module._compiled_call_impl
                inner = module._call_impl if compiled is None else compiled
            else:  # the call it replaces, looked up now (torch.fx patches `Module.__call__` while it traces)
                inner = super(cls, module).__call__ if own is None else own.__get__(module)
            if hooks.forward_depth or is_tracing():  # inside another timed call, or traced
                return inner(*args, **kwargs)
            if trial is not None:
                return hooks.forward_timed(module, inner, args, kwargs)
            # (forward_timed's work inline: one frame less on every step's forward)
            hooks.forward_depth = 1
            machine.forward_begin(clock(), grad_enabled() and (module.training or hooks._runs_training(module)))
            try:
                return inner(*args, **kwargs)
            finally:
                hooks.forward_depth = 0
                machine.forward_end(clock())

        call.__qualname__ = f"{cls.__qualname__}.__call__"
        return call

    def forward_timed(self, module: Any, inner: Callable, args: tuple, kwargs: dict[str, Any]) -> Any:
        """`inner(*args, **kwargs)`, `module`'s outermost forward, timed as the step's forward (or an
        evaluation's), with a doctor trial's change around it."""
        machine, trial = self.machine, self.trial
        self.forward_depth = 1
        machine.forward_begin(time.time(), self._training(module))
        if trial is None:
            try:
                return inner(*args, **kwargs)
            finally:
                self.forward_depth = 0
                machine.forward_end(time.time())
        trial.forward_begin()
        output = None
        try:
            output = inner(*args, **kwargs)
        finally:
            self.forward_depth = 0
            machine.forward_end(time.time())
            replaced = trial.forward_end(output)  # autocast left even when the forward raised
        return output if replaced is None else replaced

    def _time_forward(self, cls: type) -> None:
        """`cls.forward` timed as an outermost forward: a script runs it directly (`self.forward(x)`,
        as pytorch/examples' forward-forward MNIST does), past `__call__` and so past `root_call`;
        before, only the module calls inside it were timed (a ReLU's), and its own work was the
        step's gap or "other". Called through `__call__` it is inside the timed call and passes on."""
        if cls in self.timed_forwards:
            return
        forward = cls.forward
        hooks, is_tracing = self, self.torch.compiler.is_dynamo_compiling

        @functools.wraps(forward)  # (its signature read through: the HF Trainer drops columns by it)
        def timed_forward(module: Any, *args: Any, **kwargs: Any) -> Any:
            if hooks.forward_depth or is_tracing():
                return forward(module, *args, **kwargs)
            return hooks.forward_timed(module, functools.partial(forward, module), args, kwargs)

        self.timed_forwards[cls] = cls.__dict__.get("forward")
        cls.forward = timed_forward  # type: ignore[attr-defined]

    def _runs_training(self, module: Any) -> bool:
        """A module in eval mode called with grad: whether it runs a training forward (a DDP-style
        wrapper left in eval mode around a module in train mode does); if not, noted
        (`eval_mode_forward`)."""
        inner = getattr(module, "module", None)
        if isinstance(inner, self.torch.nn.Module) and inner.training:
            return True
        self.eval_mode_forward(module)
        return False

    def eval_mode_forward(self, module: Any) -> None:
        """A forward with grad of a module in eval mode: at the next step's end (`_eval_mode_step`)
        it was a training step in eval mode if the module is still in eval mode, the optimizer
        stepping updates its parameters and it has layers that behave otherwise in train mode
        (dropout, batch norm) — a `model.train()` missing after an evaluation. An evaluation's
        forwards with grad are followed by `train()` before the next step ends, as an adversarial
        attack's are; a frozen teacher's or a GAN discriminator's parameters are not the stepping
        optimizer's."""
        if self.machine.in_eval:  # an evaluation without no_grad(): autograd keeps its graph
            self.eval_grad_forwards += 1
        if self.eval_moded is module:
            return
        self.eval_moded = module
        self.machine.eval_mode_check = self._eval_mode_step

    def _eval_mode_step(self, index: int) -> None:
        module, self.eval_moded = self.eval_moded, None
        optimizer = self.stepping
        if module is None or module.training or optimizer is None:
            return
        key = (id(module), id(optimizer))
        layers = self.mode_layers.get(key)
        if layers is None:
            if len(self.mode_layers) > 256:  # modules and optimizers made anew: ids reused
                self.mode_layers.clear()
            layers = self.mode_layers[key] = _mode_layers(self.torch, module, optimizer)
        if not layers:
            return
        seen = self.eval_mode_steps
        if not seen:
            seen.update(steps=0, first=index, module=type(module).__name__, layers=layers)
        seen["steps"] += 1
        seen["last"] = index

    def backward_through_python(self) -> None:
        """`torch.autograd.backward` timed by a Python frame from now on, which looks the machine's
        events up at each call (so an update window's closer sees it: updates.py), not by the C
        callable, which holds the events it was made with."""
        if self.torch is not None and self.untimed_backward is not None:
            self.torch.autograd.backward = self.timed_backward(self.untimed_backward, in_c=False)

    def timed_backward(self, backward_: Callable, in_c: bool = True) -> Callable:
        """`torch.autograd.backward` timed as the step's backward (one frame around it). Its
        parameters spelled out when they are torch's known ones: passed on through `*args,
        **kwargs`, the keyword `Tensor.backward` gives (`inputs=`) cost ~1,500 instructions a step.
        With the C fast path built (and no doctor trial), a C callable in place of the frame."""
        machine, clock, trial = self.machine, time.time, self.trial
        if in_c and trial is None and machine.fast:  # its frame in C: the arguments passed on as they come
            timed = _fastpath.Timed(backward_, machine.backward_begin, machine.backward_end, _fastpath.TIMED_CALL)
            return functools.update_wrapper(timed, backward_)
        if list(inspect.signature(backward_).parameters) != list(BACKWARD_PARAMETERS):

            @functools.wraps(backward_)
            def any_backward(*args: Any, **kwargs: Any) -> Any:
                if trial is not None:  # a doctor trial reads the loss
                    trial.backward(args[0] if args else kwargs.get("tensors"))
                machine.backward_begin(clock())
                try:
                    return backward_(*args, **kwargs)
                finally:
                    machine.backward_end(clock())

            return any_backward

        @functools.wraps(backward_)
        def backward(
            tensors: Any,
            grad_tensors: Any = None,
            retain_graph: Any = None,
            create_graph: bool = False,
            grad_variables: Any = None,
            inputs: Any = None,
        ) -> Any:
            if trial is not None:
                trial.backward(tensors)
            machine.backward_begin(clock())
            try:
                return backward_(tensors, grad_tensors, retain_graph, create_graph, grad_variables, inputs)
            finally:
                machine.backward_end(clock())

        return backward

    def timed_grad(self, grad_: Callable) -> Callable:
        """`torch.autograd.grad` timed as backward: a loop that takes its gradients this way (a
        functional update, no optimizer) has its steps end there as at a `backward()`; one kept
        differentiable (`create_graph=True`: a gradient penalty, a meta-learning inner loop) is
        backward time inside the step, not a step."""
        machine, clock, trial = self.machine, time.time, self.trial
        names = list(inspect.signature(grad_).parameters)
        at = names.index("create_graph") if "create_graph" in names else len(names)  # passed by position

        @functools.wraps(grad_)
        def grad(*args: Any, **kwargs: Any) -> Any:
            create_graph = bool(args[at] if len(args) > at else kwargs.get("create_graph", False))
            if trial is not None and not create_graph:
                trial.backward(args[0] if args else kwargs.get("outputs"))
            machine.backward_begin(clock())
            try:
                return grad_(*args, **kwargs)
            finally:
                machine.backward_end(clock(), not create_graph)

        return grad

    def _closure_timed(self, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]]:
        """`step`'s arguments with its closure (LBFGS, Lightning) timed, so the time inside it is
        forward and backward, not optimizer; `args` holds the optimizer first."""
        if callable(kwargs.get("closure")):
            return args, {**kwargs, "closure": self._timed_closure(kwargs["closure"])}
        if len(args) > 1 and callable(args[1]):
            return (args[0], self._timed_closure(args[1]), *args[2:]), kwargs
        return args, kwargs

    def _timed_closure(self, closure: Callable) -> Callable:
        machine = self.machine

        @functools.wraps(closure)
        def timed(*a: Any, **k: Any) -> Any:
            machine.closure_begin(time.time())
            try:
                return closure(*a, **k)
            finally:
                machine.closure_end(time.time())

        return timed

    def optimizer_init(self, init_: Callable, *args: Any, **kwargs: Any) -> Any:
        self.machine.optimizer_created()
        self.updates.detach()
        self.discover()  # the model it trains may not have been called yet
        created = init_(*args, **kwargs)
        self.time_optimizer(type(args[0]))  # after torch has wrapped its `step` (Optimizer.__init__)
        return created

    def optimizer_unpickled(self, setstate_: Callable, optimizer: Any, state: dict[str, Any]) -> None:
        """An optimizer unpickled (`torch.load` of a whole optimizer, the copy a spawned process
        receives) never ran `__init__` here: its class is timed as at creation."""
        setstate_(optimizer, state)
        self.updates.detach()
        self.time_optimizer(type(optimizer))

    def time_optimizer(self, optimizer_class: type) -> None:
        """The class's `step` timed as the step's optimizer part, from its call to its return (once
        per class; a subclass inheriting it is covered; torch's own `hooked` mark is kept, so torch
        does not wrap it again). In place of torch's global optimizer hooks: torch enters a
        record_function before its hooks run (~0.2 ms after an idle moment, which was the loop's
        "other"), and their dispatch cost ~2,500 instructions a step more than this one frame. A
        step that raises still closes the part (a hook after it would never have run)."""
        step = optimizer_class.step
        if getattr(step, "dlscope_timed", False):
            return
        hooks, machine, clock = self, self.machine, time.time

        @functools.wraps(step)
        def timed_step(*args: Any, **kwargs: Any) -> Any:
            if args and args[0] is not hooks.stepping and not machine.optimizer_depth:
                hooks.optimizer_switched(args[0])
            machine.optimizer_begin(clock())
            if kwargs or len(args) > 1:  # a closure, maybe
                args, kwargs = self._closure_timed(args, kwargs)
            try:
                return step(*args, **kwargs)
            finally:
                machine.optimizer_end(clock())

        timed: Any = timed_step
        if machine.fast:  # its frame in C; a call with more than the optimizer goes to timed_step
            steps = machine.optimizer_begin, machine.optimizer_end
            timed = _fastpath.Timed(step, *steps, _fastpath.TIMED_STEP, hooks, machine, timed_step)
            functools.update_wrapper(timed, step)
        timed.dlscope_timed = True
        self.timed_optimizers[optimizer_class] = optimizer_class.__dict__.get("step")
        optimizer_class.step = timed  # type: ignore[method-assign]

    def time_scaler(self, scaler_class: type) -> None:
        """`GradScaler.step(optimizer)` timed as that optimizer's step: its unscale and inf/NaN
        check are the step's optimizer part, and an iteration whose gradients it finds inf or NaN,
        where it never calls the optimizer's `step`, still ends a step (before, it was lumped into
        the next one: mixed precision's first iterations, while the scale comes down). Those are
        counted (SKIPPED_KEPT of their step numbers kept). An optimizer that takes the scaler's
        check into its own `step` (`_step_supports_amp_scaling`: fused Adam) is called every time,
        and a skip inside it is not seen."""
        step = scaler_class.step
        if getattr(step, "dlscope_timed", False):
            return
        hooks, machine, clock = self, self.machine, time.time

        @functools.wraps(step)
        def timed_step(scaler: Any, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
            if optimizer is not hooks.stepping and not machine.optimizer_depth:
                hooks.optimizer_switched(optimizer)
            index, inner = machine.counts["optimizer"], machine.inner_steps
            machine.optimizer_begin(clock())
            try:
                returned = step(scaler, optimizer, *args, **kwargs)
            finally:
                machine.optimizer_end(clock())
            if machine.inner_steps == inner and getattr(scaler, "_enabled", True):  # (one that raised: no skip)
                hooks.scaler_skipped += 1
                if len(hooks.scaler_skipped_steps) < SKIPPED_KEPT:
                    hooks.scaler_skipped_steps.append(index)
            return returned

        timed_step.dlscope_timed = True  # type: ignore[attr-defined]
        self.timed_optimizers[scaler_class] = scaler_class.__dict__.get("step")
        scaler_class.step = timed_step  # type: ignore[method-assign]

    def optimizer_switched(self, optimizer: Any) -> None:
        """Another optimizer instance steps than the one before (at top level): the steps of the
        one before are its own. Several stepping in turn (a GAN's discriminator and generator)
        make each loop iteration several steps; several one after another (a sweep, k-fold: a
        new model each time) each start at a step of their own. The report says which."""
        self._stepping_ends()
        counts = self.machine.counts["optimizer"]
        try:  # known by a weak reference: a new optimizer may take the address of one freed
            entry = self.optimizer_entry.get(optimizer)
        except TypeError:  # not weakly referable, or not hashable: one entry per switch to it
            entry = None
        if entry is not None:
            self.optimizers_returned += 1
        else:
            entry = {"class": type(optimizer).__name__, "steps": 0, "first": counts}
            self.optimizers_stepped.append(entry)
            with contextlib.suppress(TypeError):
                self.optimizer_entry[optimizer] = entry
        self.stepping, self.stepping_entry, self.stepping_since = optimizer, entry, counts

    def _stepping_ends(self) -> None:
        if self.stepping_entry is not None:
            self.stepping_entry["steps"] += self.machine.counts["optimizer"] - self.stepping_since
            self.stepping = self.stepping_entry = None

    def _forget_optimizers(self) -> None:
        """No optimizer has stepped yet (in a new process: a fork's are its parent's)."""
        self.stepping: Any = None  # the optimizer stepping now (the timed step's one compare)
        self.stepping_entry: dict[str, Any] | None = None  # and its entry in optimizers_stepped
        self.stepping_since = self.optimizers_returned = 0
        # {"class", "steps", "first": its first step's index}, in the order they first stepped
        self.optimizers_stepped: list[dict[str, Any]] = []
        self.optimizer_entry: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()
        self.scaler_skipped = 0  # GradScaler steps that did not call the optimizer's (time_scaler)
        self.scaler_skipped_steps: list[int] = []
        # training steps in eval mode (eval_mode_forward): the module noted in this step, the
        # mode-dependent layers of (module, optimizer) pairs, {steps, first, last, module, layers}
        self.eval_moded: Any = None
        self.mode_layers: dict[tuple[int, int], list[str]] = {}
        self.eval_mode_steps: dict[str, Any] = {}
        self.eval_grad_forwards = 0  # forwards with grad of modules in eval mode, in an evaluation

    def module_train(self, train_: Callable, module: Any, mode: bool = True) -> Any:
        self.train_depth += 1
        try:
            if self.train_depth == 1 and not self.is_compiling():
                self.machine.train_mode(time.time(), bool(mode))
                if module.training != bool(mode):  # not at every step's train() (the HF Trainer's)
                    self.discover()  # an epoch or an evaluation starts: a module first called there is found
            return train_(module, mode)
        finally:
            self.train_depth -= 1

    def checkpoint(self, name: str, position: int, call: Callable, *args: Any, **kwargs: Any) -> Any:
        file = args[position] if len(args) > position else next((kwargs[k] for k in FILE_KEYWORDS if k in kwargs), None)
        if self.trial is not None and name == "checkpoint_save" and isinstance(file, str | bytes | os.PathLike):
            self.trial.check_write(file)  # torch.save and safetensors write from C++, past the audit hook
        opened = self.machine.checkpoint_begin(time.time(), name, _file_name(file))
        try:
            with _warnings_at_caller():
                return call(*args, **kwargs)
        finally:
            if opened:
                self.machine.checkpoint_end(time.time(), name)

    def _peak_memory(self) -> tuple[int | None, int | None]:
        """The peak since the previous sample: RSS high-water mark (then reset), CUDA allocator peak."""
        rss = None
        status, clear = self.memory_files
        if status is not None:
            for line in os.pread(status, 4096, 0).decode().splitlines():
                if line.startswith("VmHWM:"):
                    rss = int(line.split()[1]) * 1024
            if clear is not None:
                os.pwrite(clear, b"5", 0)  # resets VmHWM to the current RSS
        cuda = None
        if self.torch is not None and self.torch.cuda.is_available() and self.torch.cuda.is_initialized():
            cuda = int(self.torch.cuda.max_memory_allocated())
            if self.gpu is not None:  # the reset below clears the reserved peak too
                self.gpu.reserved_peak = max(self.gpu.reserved_peak, int(self.torch.cuda.max_memory_reserved()))
            self.torch.cuda.reset_peak_memory_stats()
        return rss, cuda

    # attaching -------------------------------------------------------------------------------
    def step_hooks(self, torch: Any) -> Callable[[], None]:
        """Install what a training step runs through (the timed backward, the modules' forward
        found by `discover`; an optimizer class's timed `step` comes with its first instance,
        `optimizer_init`); returns the function that removes them (and the timed calls of the
        modules' and optimizers' classes)."""
        backward, grad = torch.autograd.backward, torch.autograd.grad
        self.untimed_backward = backward
        torch.autograd.backward = self.timed_backward(backward)
        torch.autograd.grad = self.timed_grad(grad)
        self.time_scaler(torch.amp.GradScaler)  # (its cuda and cpu subclasses inherit its `step`)
        self.discover()

        def remove() -> None:
            self._discovered_all()
            patched = {"__call__": self.timed_classes, "forward": self.timed_forwards, "step": self.timed_optimizers}
            for name, timed in patched.items():
                for cls, own in timed.items():
                    if own is None:
                        delattr(cls, name)
                    else:
                        setattr(cls, name, own)
                timed.clear()
            torch.autograd.backward, torch.autograd.grad = backward, grad

        return remove

    def discover(self) -> None:
        """Watch every module call (torch's global forward hooks, which time the outermost) until
        the next step ends; the class of each module called at top level meanwhile gets its own
        timed call.
        Called at attach, when an optimizer is created and when `Module.train()`/`eval()` changes a
        module's mode: a model, a loss module or an evaluation model first called later is found there."""
        if self.discovery:
            return
        from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

        self.discovery = [
            register_module_forward_pre_hook(self.forward_pre),
            register_module_forward_hook(self.forward_post, always_call=True),
        ]
        self.on_step, self.machine.on_step = self.machine.on_step, self._step_discovered

    def _step_discovered(self, steps: int, now: float) -> None:
        """The first step end since `discover`: the modules called at top level are timed on their own."""
        on_step = self.on_step
        if not self.untimed_roots:
            self._discovered_all()
        if on_step is not None:
            on_step(steps, now)

    def _discovered_all(self) -> None:
        if self.discovery:
            for handle in self.discovery:
                handle.remove()
            self.discovery = []
            self.machine.on_step = self.on_step

    def attach_torch(self, torch: Any) -> None:
        from torch.utils.data import dataloader

        calibrate.record(self, torch)  # dlscope's own cost per step, measured here, once, before any hook
        self.torch = torch
        self.is_compiling = torch.compiler.is_compiling
        # the live status file's step counter, bound now: the agent (installed before) has bound it
        self.machine.on_step = hang.step_ended if self.trial is None else self._step_ended
        if torch.cuda.is_available() and os.environ.get(gpuclock.GPU_ENV) != "0":
            # the GPU's clock needs every event in Python (the C fast path takes them in C)
            self.machine.python_only()
            self.gpu = gpuclock.GpuClock(torch, self.machine, self.records)
        self.step_hooks(torch)
        self.updates.attach(torch)
        self.machine.watch = subnormals.SlowdownWatch(torch, self.records.write)
        torch.optim.Optimizer.__init__ = _wrap(torch.optim.Optimizer.__init__, self.optimizer_init)
        torch.optim.Optimizer.__setstate__ = _wrap(torch.optim.Optimizer.__setstate__, self.optimizer_unpickled)
        iterator = dataloader._BaseDataLoaderIter
        iterator.__next__ = self.timed_loader_next(iterator.__next__)
        dataloader.DataLoader.__iter__ = _wrap(dataloader.DataLoader.__iter__, self.loader_iter)
        torch.nn.Module.train = _wrap(torch.nn.Module.train, self.module_train)
        self.torch_threads(torch.get_num_threads())
        torch.set_num_threads = _wrap(torch.set_num_threads, self.set_num_threads)
        torch.save = _wrap(torch.save, functools.partial(self.checkpoint, "checkpoint_save", 1))
        torch.load = _wrap(torch.load, functools.partial(self.checkpoint, "checkpoint_load", 0))
        self.batches = batches.attach(torch, self.records.directory, _wrap)
        self.batches.on_worker = self._loader_worker
        tracebacks.attach_torch(torch, _wrap)
        if self.trial is not None:
            self.trial.attach(torch)

    def attach_c10d(self, c10d: Any) -> None:
        """A process that joins a process group is a rank whatever its environment says:
        `torch.multiprocessing.spawn`'s processes (PyTorch's DDP tutorial) have no RANK, and
        pass their rank to `init_process_group` (wrapped before torch.distributed copies it)."""
        c10d.init_process_group = _wrap(c10d.init_process_group, functools.partial(self.process_group_joined, c10d))

    def process_group_joined(self, c10d: Any, init: Callable, *args: Any, **kwargs: Any) -> Any:
        joined = init(*args, **kwargs)
        self.records.write({"k": "rank", "rank": c10d.get_rank(), "world_size": c10d.get_world_size()})
        return joined

    def attach_safetensors(self, module: Any) -> None:
        module.save_file = _wrap(module.save_file, functools.partial(self.checkpoint, "checkpoint_save", 1))
        module.load_file = _wrap(module.load_file, functools.partial(self.checkpoint, "checkpoint_load", 0))

    def framework(self, name: str, module: Any) -> None:
        """A training framework the process imported: what a rank that never communicated needs
        to become data-parallel depends on it (analysis/ranks.py, ranks_apart)."""
        self.records.write({"k": "framework", "name": name})

    def attach_transformers(self, module: Any) -> None:
        """`Trainer._save_checkpoint`: one phase per checkpoint, listing the files written in it
        (model.safetensors, optimizer.pt, scheduler.pt, rng_state.pth, ...)."""
        self.framework("transformers", module)
        trainer = module.Trainer
        save = functools.partial(self.checkpoint, "checkpoint_save", len(("self", "model", "trial")))
        trainer._save_checkpoint = _wrap(trainer._save_checkpoint, save)

    def attach_lightning(self, module: Any) -> None:
        """Lightning's TorchCheckpointIO (called on the rank that writes): it pickles into memory,
        then writes the file itself; the phase spans both and names the file."""
        self.framework("lightning", module)
        io = module.TorchCheckpointIO
        io.save_checkpoint = _wrap(io.save_checkpoint, functools.partial(self.checkpoint, "checkpoint_save", 2))
        io.load_checkpoint = _wrap(io.load_checkpoint, functools.partial(self.checkpoint, "checkpoint_load", 1))


@contextlib.contextmanager
def _warnings_at_caller() -> Iterator[None]:
    """Warnings raised inside a wrapped call point at the user's line, not at this file: they are
    caught and issued again from the first frame outside it (filters then apply once, there)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename in (__file__, contextlib.__file__):
        frame = frame.f_back
    for w in caught:
        if w.filename != __file__ or frame is None:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno, source=w.source)
            continue
        registry = frame.f_globals.setdefault("__warningregistry__", {})
        module = frame.f_globals.get("__name__", "<unknown>")
        warnings.warn_explicit(
            w.message, w.category, frame.f_code.co_filename, frame.f_lineno, module, registry, frame.f_globals
        )


OPERATOR_TOTALS = ("self_cpu_time_total", "cpu_time_total", "self_device_time_total", "device_time_total")


def _split_by_steps(events: list[Any], steps: list[tuple[float, float]]) -> tuple[list[Any], list[Any]]:
    """The profiler's events (FunctionEvent) that started inside one of `steps` ((start, end) on
    their clock, in order), and the others."""
    starts = [start for start, _ in steps]
    inside, between = [], []
    for event in events:
        at = event.time_range.start
        k = bisect.bisect_right(starts, at) - 1
        (inside if k >= 0 and at <= steps[k][1] else between).append(event)
    return inside, between


def _operators(events: list[Any]) -> list[dict[str, Any]]:
    """`events` summed by operator, as torch's `key_averages()` sums them (its own needs the
    whole window's event tree)."""
    ops: dict[str, dict[str, Any]] = {}
    for e in events:
        op = ops.get(e.key)
        if op is None:
            op = ops[e.key] = {"key": e.key, "count": 0, **dict.fromkeys(OPERATOR_TOTALS, 0.0)}
            op.update(self_cpu_memory_usage=0, flops=0)
        op["count"] += 1
        for total in OPERATOR_TOTALS:
            op[total] += float(getattr(e, total, 0.0) or 0.0)
        op["self_cpu_memory_usage"] += int(e.self_cpu_memory_usage or 0)
        op["flops"] += int(e.flops or 0)
    return list(ops.values())


def _quiet() -> contextlib.AbstractContextManager:
    """The profiler's C++ chatter (USDT lines, allocator notes) kept out of the script's stderr;
    the script's own lines written meanwhile pass on."""
    from dlscope.measure.native_stderr import quiet_native_stderr

    return quiet_native_stderr()


def _wrap(original: Callable, around: Callable) -> Callable:
    """`original` called through `around(original, *args)`, looking like the original."""

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return around(original, *args, **kwargs)

    return wrapper


def _mode_layers(torch: Any, module: Any, optimizer: Any) -> list[str]:
    """The classes of `module`'s layers that behave otherwise in train and eval mode (dropout,
    batch norm), where `optimizer` updates some of its parameters; [] otherwise."""
    updated = {id(p) for group in getattr(optimizer, "param_groups", []) for p in group.get("params", [])}
    if not any(id(p) in updated for p in module.parameters()):
        return []
    moded = (torch.nn.modules.dropout._DropoutNd, torch.nn.modules.batchnorm._BatchNorm)
    return sorted({type(m).__name__ for m in module.modules() if isinstance(m, moded)})


def _direct_forward_caller(module_class: type, module: Any, frames: int = 16) -> Any:
    """The module whose `forward` runs around this outermost call of `module`, run directly (by
    `self.forward(x)`: through `__call__` it would have made this call an inner one), or None.
    Asked while discovering only: a frame's locals cost a dict each."""
    frame = sys._getframe(2)
    for _ in range(frames):
        if frame is None:
            return None
        if frame.f_code.co_name == "forward":
            owner = frame.f_locals.get("self")
            if isinstance(owner, module_class) and owner is not module:
                return owner
        frame = frame.f_back
    return None


def _file_name(file: Any) -> str | None:
    if isinstance(file, str | bytes | os.PathLike):
        return os.fsdecode(file)
    name = getattr(file, "name", None)  # an open file object
    return name if isinstance(name, str) else None


def _open_memory_files() -> tuple[int | None, int | None]:
    try:
        status = os.open("/proc/self/status", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None, None
    try:
        clear = os.open("/proc/self/clear_refs", os.O_WRONLY | os.O_CLOEXEC)
    except OSError:
        clear = None  # the peak is then the process's high-water mark so far
    return status, clear


def _distributed(torch: Any) -> bool:
    """In a rank of a distributed job: from torchrun's environment, or a process group joined
    without it (`torch.multiprocessing.spawn`'s processes)."""
    dist = torch.distributed
    joined = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
    return joined or (_env_int("WORLD_SIZE") or 1) > 1


def launcher_env() -> dict[str, Any] | None:
    """torchrun's view of this process (its environment), what tells one job's ranks on several
    machines from another job's: None outside torchrun."""
    run_id = os.environ.get("TORCHELASTIC_RUN_ID")
    if run_id is None:
        return None
    master = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    return {
        "run_id": run_id,
        "node": _env_int("GROUP_RANK"),
        "nodes": _env_int("GROUP_WORLD_SIZE"),
        "local_rank": _env_int("LOCAL_RANK"),
        "master": f"{master[0]}:{master[1]}" if all(master) else None,
        "restart": _env_int("TORCHELASTIC_RESTART_COUNT"),
    }


def _env_int(name: str) -> int | None:
    value = os.environ.get(name, "")
    return int(value) if value.isdigit() else None


def install(directory: str) -> None:
    records = RecordFile(directory)
    values = [int(v) for v in os.environ.get(PROFILE_ENV, "1:1:2:5").split(":")]
    hooks = TorchHooks(records, (values[0], values[1], values[2], values[3]))
    hooks.begin_process(forked=False)
    trial_settings = trial.settings()
    if trial_settings is not None:
        hooks.trial = trial.Trial(hooks, trial_settings)

    def on_error(where: str, error: Exception) -> None:
        records.write({"k": "error", "where": where, "error": f"{type(error).__name__}: {error}"})

    callbacks = {"torch": hooks.attach_torch, "safetensors.torch": hooks.attach_safetensors}
    callbacks.update(dict.fromkeys(LIGHTNING_CHECKPOINT_IO, hooks.attach_lightning))
    callbacks["transformers.trainer"] = hooks.attach_transformers
    callbacks["accelerate.accelerator"] = functools.partial(hooks.framework, "accelerate")
    callbacks["torch.distributed.distributed_c10d"] = hooks.attach_c10d
    if hooks.trial is not None:
        callbacks["h5py"] = hooks.trial.attach_h5py
    sys.meta_path.insert(0, AfterImport(callbacks, on_error))
    tracebacks.install(records.write)
    atexit.register(hooks.finish)
    os.register_at_fork(after_in_child=hooks.after_fork)
