"""Inside a process `dlscope run` observes: its training steps, their anatomy, its phases and a
late profiler, all from torch's own extension points — the user's script is not changed.

Installed by the bootstrap (observe/bootstrap) before the script runs; nothing touches torch
until the script imports it (a finder on sys.meta_path calls `attach_torch` right after).

Steps. A step ends when an optimizer steps (the global `register_optimizer_step_post_hook`:
torch.optim, GradScaler.step, LBFGS alike; with gradient accumulation one step spans several
micro-batches). A loop with no torch optimizer (Keras 3 on torch, hand-written SGD) ends a step
at each `backward()` instead, until an optimizer step is seen. Both streams are recorded; the
parent keeps the optimizer's when there is one.

Anatomy of a step, measured between the end of the previous step and the end of this one:
data (time inside DataLoader `__next__`; with no DataLoader, the gap until the first forward),
forward (outermost module calls), backward, optimizer; the rest is "other".

Phases, emitted as dlscope phase markers so --trace-io backends see them: startup (until the
first batch), first_batch (until the first step ends), train_steps, and inside them eval
(model.eval() until model.train(), or forwards without grad or in eval mode) and
checkpoint_save / checkpoint_load around torch.save / torch.load / safetensors.torch.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import importlib.abc
import importlib.util
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from dlscope import phases
from dlscope.observe.hang import agent as hang  # hang: the live status file
from dlscope.observe.script.records import RecordFile, clocks

PROFILE_ENV = "DLSCOPE_RUN_PROFILE"  # "start_after:wait:warmup:active"; active 0 turns the profiler off


class Step:
    """The step being accumulated: its start and the seconds spent in each part so far."""

    __slots__ = ("backward", "first_forward", "forward", "fresh", "loader", "optimizer", "start", "used_loader")

    def __init__(self, start: float) -> None:
        self.start = start
        self.loader = self.forward = self.backward = self.optimizer = 0.0
        self.first_forward: float | None = None
        self.used_loader = False
        self.fresh = True  # no training work yet: an eval or checkpoint before it moves its start


class LateProfiler:
    """torch.profiler over real steps: started after `start_after` steps (start-up is not
    profiled), then `wait`, `warmup` and `active` steps on torch's schedule, driven by step ends."""

    def __init__(self, records: RecordFile, start_after: int, wait: int, warmup: int, active: int) -> None:
        self.records = records
        self.start_after, self.wait, self.warmup, self.active = start_after, wait, warmup, active
        self.prof: Any = None
        self.started_after: int | None = None  # index of the step after which it started
        self.done = active == 0

    def state_of(self, index: int) -> str | None:
        if self.started_after is None or index <= self.started_after:
            return None
        j = index - self.started_after - 1
        if j < self.wait:
            return "wait"
        if j < self.wait + self.warmup:
            return "warmup"
        return "active" if j < self.wait + self.warmup + self.active else None

    def after_step(self, index: int) -> None:
        if self.done:
            return
        if self.prof is None:
            if index + 1 >= self.start_after:
                self._start(index)
            return
        with _quiet():
            self.prof.step()
            if self.done:
                self.prof.stop()

    def _start(self, index: int) -> None:
        import torch
        from torch.profiler import ProfilerActivity, profile, schedule

        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            activities.append(ProfilerActivity.CUDA)
        self.prof = profile(
            activities=activities,
            schedule=schedule(wait=self.wait, warmup=self.warmup, active=self.active, repeat=1),
            on_trace_ready=self._ready,
            record_shapes=True,
            profile_memory=False,  # True makes the allocator warn on the script's stderr
            with_flops=True,
        )
        self.started_after = index
        with _quiet():
            self.prof.start()

    def stop(self) -> None:
        """At exit: a profile cut short by the script's end still delivers its active steps."""
        if self.prof is not None and not self.done:
            with _quiet():
                self.prof.stop()
            self.done = True

    def _ready(self, prof: Any) -> None:
        from torch.autograd import DeviceType

        start = time.perf_counter()
        directory, pid = self.records.directory, self.records.pid
        trace = os.path.join(directory, f"profile-{pid}.json")
        prof.export_chrome_trace(trace)
        ops = [
            {
                "key": e.key,
                "count": int(e.count),
                "self_cpu_time_total": float(e.self_cpu_time_total),
                "cpu_time_total": float(e.cpu_time_total),
                "self_device_time_total": float(getattr(e, "self_device_time_total", 0.0) or 0.0),
                "device_time_total": float(getattr(e, "device_time_total", 0.0) or 0.0),
                "self_cpu_memory_usage": int(e.self_cpu_memory_usage or 0),
                "flops": int(e.flops or 0),
            }
            for e in prof.key_averages()
            if getattr(e, "device_type", DeviceType.CPU) == DeviceType.CPU
        ]
        self.records.write(
            {
                "k": "profile",
                "trace": trace,
                "ops": ops,
                "export_seconds": round(time.perf_counter() - start, 4),
            }
        )
        self.done = True


class Observer:
    """One per process: turns hook calls into step, phase and profile records."""

    def __init__(self, records: RecordFile, profile: tuple[int, int, int, int]) -> None:
        self.records = records
        self.profile_settings = profile
        self.torch: Any = None
        self.reset()

    def reset(self) -> None:
        self.steps: dict[str, Step | None] = {"optimizer": None, "backward": None}
        self.counts = {"optimizer": 0, "backward": 0}
        self.mode: str | None = None  # "optimizer" once an optimizer step has been seen
        self.stack: list[str] = []
        self.in_eval = False
        self.forward_depth = self.train_depth = 0
        self.forward_start = 0.0
        self.optimizer_start: float | None = None
        self.profiler = LateProfiler(self.records, *self.profile_settings)
        self.memory_fds = _open_memory_files()

    # process ---------------------------------------------------------------------------------
    def begin_process(self, first: bool) -> None:
        self.records.write(
            {
                "k": "process",
                "pid": os.getpid(),
                "ppid": os.getppid(),
                "argv": list(sys.argv) or [sys.executable],
                "rank": _env_int("RANK"),
                "world_size": _env_int("WORLD_SIZE"),
                "clocks": clocks(),
                "forked": not first,
            }
        )
        if first:
            self.begin("startup")

    def after_fork(self) -> None:
        """A forked child (a DataLoader worker): its own records, no steps, no profiler."""
        self.records.reopen()
        self.reset()
        self.profiler.done = True
        self.begin_process(first=False)

    def finish(self) -> None:
        try:
            self.profiler.stop()
        finally:
            while self.stack:
                self.end(self.stack[-1])
            self.records.write({"k": "end", "clocks": clocks()})

    # phases ----------------------------------------------------------------------------------
    def begin(self, name: str, file: str | None = None) -> None:
        record = {"k": "B", "name": name, "ts": time.time(), "tid": threading.get_native_id()}
        if file is not None:
            record["file"] = file
        self.records.write(record)
        phases.mark_begin(name)  # after the timestamp: the marker's syscall falls inside the slice
        self.stack.append(name)
        hang.phase(name)  # hang

    def end(self, name: str) -> None:
        while self.stack:
            top = self.stack.pop()
            phases.mark_end(top)
            self.records.write({"k": "E", "name": top, "ts": time.time(), "tid": threading.get_native_id()})
            hang.phase(self.stack[-1] if self.stack else "")  # hang
            if top == name:
                return

    def _switch(self, old: str, new: str) -> None:
        if old in self.stack:
            self.end(old)
            self.begin(new)

    def eval_begin(self) -> None:
        if not self.in_eval:
            self.begin("eval")
            self.in_eval = True

    def eval_end(self) -> None:
        if not self.in_eval:
            return
        self.end("eval")
        self.in_eval = False
        self._restart_fresh(time.time())

    def _restart_fresh(self, now: float) -> None:
        """Time spent in eval or a checkpoint between two steps belongs to neither."""
        for src, step in self.steps.items():
            if step is not None and step.fresh:
                self.steps[src] = Step(now)

    # training activity -----------------------------------------------------------------------
    def activity(self, now: float) -> None:
        """Training work starts (a batch is fetched, a forward runs in train mode, a backward)."""
        if self.steps["optimizer"] is None:
            self.steps = {"optimizer": Step(now), "backward": Step(now)}
            self._switch("startup", "first_batch")

    def loader_next(self, next_: Callable, iterator: Any) -> Any:
        if self.in_eval:
            return next_(iterator)
        start = time.time()
        try:
            return next_(iterator)
        finally:
            end = time.time()
            self.activity(start)
            for step in self.steps.values():
                step.loader += end - start
                step.used_loader = True
                step.fresh = False

    def forward_pre(self, module: Any, args: Any) -> None:
        if self.torch.compiler.is_compiling():
            return
        self.forward_depth += 1
        if self.forward_depth > 1:
            return
        now = time.time()
        if not module.training or not self.torch.is_grad_enabled():
            self.eval_begin()
            return
        self.eval_end()
        self.activity(now)
        self.forward_start = now
        for step in self.steps.values():
            if step.first_forward is None:
                step.first_forward = now
            step.fresh = False

    def forward_post(self, module: Any, args: Any, output: Any) -> None:
        if self.torch.compiler.is_compiling():
            return
        self.forward_depth -= 1
        if self.forward_depth or self.in_eval:
            return
        spent = time.time() - self.forward_start
        for step in self.steps.values():
            step.forward += spent

    def backward(self, backward_: Callable, *args: Any, **kwargs: Any) -> Any:
        self.eval_end()
        start = time.time()
        self.activity(start)
        result = backward_(*args, **kwargs)
        end = time.time()
        for step in self.steps.values():
            step.backward += end - start
            step.fresh = False
        if self.mode != "optimizer":
            self.end_step("backward", end)
        return result

    def optimizer_pre(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self.optimizer_start is None:  # LBFGS-style closures may nest steps: time the outer one
            self.eval_end()
            self.optimizer_start = time.time()
            self.activity(self.optimizer_start)

    def optimizer_post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self.optimizer_start is None:
            return
        end = time.time()
        for step in self.steps.values():
            step.optimizer += end - self.optimizer_start
        self.optimizer_start = None
        self.mode = "optimizer"
        self.end_step("optimizer", end)

    def end_step(self, src: str, now: float) -> None:
        step = self.steps[src]
        if step is None:
            return
        primary = src == "optimizer" or self.mode != "optimizer"
        index = self.counts[src]
        self.counts[src] += 1
        peak_rss, peak_cuda = self._peak_memory() if primary else (None, None)
        gap = (step.first_forward if step.first_forward is not None else now) - step.start
        profiled = self.profiler.state_of(index) if primary else None
        if primary:
            hang.step_ended(index + 1, now)  # hang
            if index == 0:
                self._switch("first_batch", "train_steps")
            self.profiler.after_step(index)  # prof.step(), and the trace export after the last active step
        resumed = time.time()
        self.records.write_step(
            src=src,
            i=index,
            start=step.start,
            end=now,
            data=step.loader if step.used_loader else max(gap, 0.0),
            data_source="loader" if step.used_loader else "gap",
            forward=step.forward,
            backward=step.backward,
            optimizer=step.optimizer,
            peak_rss=peak_rss,
            peak_cuda=peak_cuda,
            profiled=profiled,
            profiler_seconds=resumed - now,  # spent by dlscope between this step and the next
            tid=threading.get_native_id(),
        )
        self.steps[src] = Step(resumed)

    def _peak_memory(self) -> tuple[int | None, int | None]:
        """The peak since the previous step: RSS high-water mark (then reset), CUDA allocator peak."""
        rss = None
        status, clear = self.memory_fds
        if status is not None:
            for line in os.pread(status, 4096, 0).decode().splitlines():
                if line.startswith("VmHWM:"):
                    rss = int(line.split()[1]) * 1024
            if clear is not None:
                os.pwrite(clear, b"5", 0)  # resets VmHWM to the current RSS
        cuda = None
        if self.torch.cuda.is_available() and self.torch.cuda.is_initialized():
            cuda = int(self.torch.cuda.max_memory_allocated())
            self.torch.cuda.reset_peak_memory_stats()
        return rss, cuda

    # checkpoints -----------------------------------------------------------------------------
    def checkpoint(self, name: str, file: Any, call: Callable, *args: Any, **kwargs: Any) -> Any:
        self.eval_end()
        self.begin(name, _file_name(file))
        try:
            return call(*args, **kwargs)
        finally:
            self.end(name)
            self._restart_fresh(time.time())

    def module_train(self, train_: Callable, module: Any, mode: bool = True) -> Any:
        self.train_depth += 1
        try:
            if self.train_depth == 1 and not self.torch.compiler.is_compiling():
                if mode:
                    self.eval_end()
                else:
                    self.eval_begin()
            return train_(module, mode)
        finally:
            self.train_depth -= 1

    # attaching -------------------------------------------------------------------------------
    def attach_torch(self, torch: Any) -> None:
        from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
        from torch.utils.data import dataloader

        self.torch = torch
        register_optimizer_step_pre_hook(self.optimizer_pre)
        register_optimizer_step_post_hook(self.optimizer_post)
        register_module_forward_pre_hook(self.forward_pre)
        register_module_forward_hook(self.forward_post, always_call=True)
        torch.autograd.backward = _wrap(torch.autograd.backward, self.backward)
        iterator = dataloader._BaseDataLoaderIter
        iterator.__next__ = _wrap(iterator.__next__, self.loader_next)
        torch.nn.Module.train = _wrap(torch.nn.Module.train, self.module_train)
        torch.save = _wrap(torch.save, functools.partial(self._save, 1))
        torch.load = _wrap(torch.load, functools.partial(self._load, 0))
        from dlscope.observe.script import calibrate  # dlscope's own cost per step, in this process

        calibrate.record(self, torch)

    def attach_safetensors(self, module: Any) -> None:
        module.save_file = _wrap(module.save_file, functools.partial(self._save, 1))
        module.load_file = _wrap(module.load_file, functools.partial(self._load, 0))

    def _save(self, position: int, call: Callable, *args: Any, **kwargs: Any) -> Any:
        file = args[position] if len(args) > position else kwargs.get("f", kwargs.get("filename"))
        return self.checkpoint("checkpoint_save", file, call, *args, **kwargs)

    def _load(self, position: int, call: Callable, *args: Any, **kwargs: Any) -> Any:
        file = args[position] if len(args) > position else kwargs.get("f", kwargs.get("filename"))
        return self.checkpoint("checkpoint_load", file, call, *args, **kwargs)


def _quiet() -> contextlib.AbstractContextManager:
    """The profiler's C++ chatter (USDT lines, allocator notes) kept out of the script's stderr;
    the script's own lines written meanwhile pass on."""
    from dlscope.observe.profiler import quiet_native_stderr  # imports torch: only once profiling

    return quiet_native_stderr()


def _wrap(original: Callable, around: Callable) -> Callable:
    """`original` called through `around(original, *args)`, looking like the original."""

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return around(original, *args, **kwargs)

    return wrapper


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


def _env_int(name: str) -> int | None:
    value = os.environ.get(name, "")
    return int(value) if value.isdigit() else None


class AfterImport(importlib.abc.MetaPathFinder):
    """Calls `callback(module)` right after a module is first imported (a post-import hook)."""

    def __init__(self, callbacks: dict[str, Callable[[Any], None]], on_error: Callable[[str, Exception], None]):
        self.callbacks = callbacks
        self.on_error = on_error
        self.busy: set[str] = set()

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname not in self.callbacks or fullname in self.busy:
            return None
        self.busy.add(fullname)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self.busy.discard(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        callback = self.callbacks.pop(fullname)
        exec_module = spec.loader.exec_module

        def exec_then_attach(module: Any) -> None:
            exec_module(module)
            try:
                callback(module)
            except Exception as e:  # never break the user's program: the report says what failed
                self.on_error(fullname, e)

        spec.loader.exec_module = exec_then_attach
        return spec


def install(directory: str) -> None:
    records = RecordFile(directory)
    values = [int(v) for v in os.environ.get(PROFILE_ENV, "1:1:2:5").split(":")]
    observer = Observer(records, (values[0], values[1], values[2], values[3]))
    observer.begin_process(first=True)

    def on_error(where: str, error: Exception) -> None:
        records.write({"k": "error", "where": where, "error": f"{type(error).__name__}: {error}"})

    sys.meta_path.insert(
        0, AfterImport({"torch": observer.attach_torch, "safetensors.torch": observer.attach_safetensors}, on_error)
    )
    atexit.register(observer.finish)
    os.register_at_fork(after_in_child=observer.after_fork)
