"""Inside a process of a `dlscope doctor` trial: the one change under trial applied to the
unchanged script, the facts the doctor predicts from, and the trial's clean end. Installed by
hooks.install when DLSCOPE_DOCTOR holds the trial's settings (JSON); nothing here runs otherwise.

    {"stop_after": 23, "stop_seconds": 4.0, "warmup": 3,   the trial ends after 23 steps, or 4 s
     "losses": 5,                                           of steps past the warm-up ones
     "loader": {"num_workers": 2},                          DataLoader.__init__ arguments forced
     "replay": 8,                                           the first 8 batches, then replayed from memory
     "threads": 2,                                          torch.set_num_threads, the script's own calls ignored
     "set_to_none": true,                                   zero_grad(set_to_none=True) forced
     "autocast": "bf16", "autocast_device": "cuda",         each outermost forward under bf16 autocast
                                                            (on the CPU unless a device is given)
     "non_blocking": true,                                  each copy from the CPU to a GPU non-blocking
     "scratch": "/…/cwd", "keep": ["/…/processes"]}         where the trial may write

Recorded (`k` in the process's records): "site" (where a DataLoader, an optimizer or a
zero_grad call is in the user's code, with the arguments it was given), "loss",
"zero_grad" (its mean seconds), "batch_layout" (the first batch's tensors: shapes and dtypes),
"loader" (the counted steps' fetching and thread times, this process's CPU, the machine's idle
share), "copies" (where CUDA is available: the counted steps' copies from the CPU to a GPU by
`Tensor.to`/`.cuda` — calls, bytes, from pinned memory, blocking, the host's seconds in them),
"refused" (a write outside the scratch directory), "trial_stop". (Its threads are the hooks'
"torch_threads" records, as in every run.)

Writes: a trial runs in a scratch working directory that reads as the one the doctor was started
in (a symlink to each of its entries: the script's relative inputs, a config it execs, its data
directory). A write through the scratch directory is made the trial's own first: a symlinked
directory on the way becomes a real one of symlinks (one level), a symlinked file is replaced by
the trial's own (a copy when it is opened to append or update), so `out/ckpt.pt` of the user's
last run is never overwritten. A write anywhere else (an absolute output path) is refused
(PermissionError in the script) and recorded. In the system's temporary directory and ~/.cache
a trial may create files and write those it created, but not overwrite one that was there.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from typing import Any

from dlscope.contract.env import TRIAL_ENV
from dlscope.contract.owncode import is_dlscope_code

WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
SYSTEM_ROOTS = ("/dev/", "/proc/", "/sys/")
LOADER_ARGUMENTS = ("batch_size", "num_workers", "pin_memory", "persistent_workers", "prefetch_factor")


def _is_directory(path: Any) -> bool:
    return isinstance(path, str | bytes | os.PathLike) and os.path.isdir(path)


def settings() -> dict[str, Any] | None:
    text = os.environ.get(TRIAL_ENV)
    return json.loads(text) if text else None


def call_sites() -> tuple[tuple[str, int] | None, tuple[str, int] | None]:
    """(the innermost caller in the script's own directory, the innermost caller outside torch,
    dlscope and the standard library): the same line when the script builds the object itself; a
    library's line (a trainer's) as the second when the library does, called from the first."""
    script_dir = os.path.dirname(os.path.abspath(sys.argv[0])) if sys.argv and sys.argv[0] else None
    stdlib = os.path.dirname(os.__file__)
    direct = None
    frame = sys._getframe(2)
    while frame is not None:
        name = os.path.abspath(frame.f_code.co_filename)
        ours = is_dlscope_code(name)
        # code compiled from a string ("<string>") is no file: made absolute, it would pass for one
        # in the working directory, the script's own when the script is `python -c`
        generated = frame.f_code.co_filename.startswith("<")
        library = ours or generated or "/torch/" in name or name.startswith(stdlib)
        if direct is None and not library:
            direct = (name, frame.f_lineno)
        if script_dir and name.startswith(script_dir + os.sep) and not (ours or generated):
            return (name, frame.f_lineno), direct
        frame = frame.f_back
    return None, direct


TENSORS_KEPT = 64  # a batch's tensors described, at most (the hand-over calibration rebuilds them)


def copy_target(torch: Any, args: tuple, kwargs: dict[str, Any]) -> Any:
    """The device a `Tensor.to(*args, **kwargs)` call moves to, or None (a dtype alone): a device,
    a device's name or index, or another tensor's device, positional or by keyword."""
    target = kwargs.get("device")
    if target is None and args:
        target = args[0]
    if isinstance(target, torch.Tensor):
        return target.device
    if isinstance(target, str | int):
        try:
            return torch.device(target if isinstance(target, str) else f"cuda:{target}")
        except RuntimeError:  # not a device's name
            return None
    return target if isinstance(target, torch.device) else None


# what is counted of the copies from the CPU to a GPU, in this order (`copying`'s list, the record's fields)
COPY_FIELDS = ("calls", "bytes", "pinned", "blocking", "seconds")


def copying(torch: Any, move: Any, by_to: bool, force: bool, copies: list[Any]) -> Any:
    """`Tensor.to` (`by_to`) or `Tensor.cuda`, where a copy from the CPU to a GPU is counted and
    timed into `copies` (COPY_FIELDS: calls, bytes, from pinned memory, blocking, seconds — the
    host waits in a blocking one for the GPU's queue, then the copy) and, with `force`, made
    non-blocking; any other call as it was."""

    @functools.wraps(move)
    def moved(tensor: Any, *args: Any, **kwargs: Any) -> Any:
        if tensor.device.type != "cpu":
            return move(tensor, *args, **kwargs)
        target = copy_target(torch, args, kwargs) if by_to else torch.device("cuda")
        if target is None or target.type != "cuda":
            return move(tensor, *args, **kwargs)
        # where non_blocking stands among the positional arguments: to(device, dtype, non_blocking),
        # to(other_tensor, non_blocking), cuda(device, non_blocking)
        at = 2 if by_to and not (args and isinstance(args[0], torch.Tensor)) else 1
        if force and len(args) <= at:
            kwargs["non_blocking"] = True
        blocking = not (args[at] if len(args) > at else kwargs.get("non_blocking", False))
        start = time.perf_counter()
        try:
            return move(tensor, *args, **kwargs)
        finally:
            copies[4] += time.perf_counter() - start
            copies[0] += 1
            copies[1] += tensor.nbytes
            copies[2] += tensor.is_pinned()
            copies[3] += blocking

    return moved


def tensor_layout(torch: Any, batch: Any) -> list[list[Any]]:
    """[shape, dtype name] of each tensor in a batch (tuples, lists, dicts, nested): what a
    DataLoader worker would hand to the training process."""
    found: list[list[Any]] = []
    stack = [batch]
    while stack and len(found) < TENSORS_KEPT:
        item = stack.pop()
        if isinstance(item, torch.Tensor):
            found.append([list(item.shape), str(item.dtype).removeprefix("torch.")])
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return found


def own_in_scratch(scratch: str, name: str, whole: bool, keep_content: bool) -> None:
    """Make `name` (absolute, inside `scratch`) the trial's own before a write reaches it: each
    directory on the way that is a symlink (into the user's tree) becomes a real directory of
    symlinks to its entries. With `whole`, `name` itself too: a symlinked directory the same way, a
    symlinked file removed (an open for writing then creates the trial's own), its target's bytes
    copied first with `keep_content`."""
    parts = os.path.relpath(name, scratch).split(os.sep)
    current = scratch
    for i, part in enumerate(parts if whole else parts[:-1]):
        current = os.path.join(current, part)
        if not os.path.islink(current):
            if not os.path.isdir(current):
                return  # not there yet: the script creates it, inside the scratch directory
            continue
        target = os.path.realpath(current)
        os.unlink(current)
        if os.path.isdir(target):
            os.mkdir(current)
            for entry in os.listdir(target):
                os.symlink(os.path.join(target, entry), os.path.join(current, entry))
        elif i == len(parts) - 1 and keep_content and os.path.isfile(target):
            shutil.copyfile(target, current)


def cpu_jiffies() -> tuple[int, int] | None:
    """(idle, total) clock ticks of all the machine's CPUs so far (/proc/stat); None: not Linux."""
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    return fields[3] + fields[4], sum(fields)  # idle + iowait, of user nice system idle iowait irq softirq steal


def machine_use(process_cpu: float, jiffies: tuple[int, int] | None) -> dict[str, Any]:
    """Since the counted steps began: this process's CPU seconds, and the machine's idle share of
    its CPUs (what other jobs left free)."""
    now = cpu_jiffies()
    use: dict[str, Any] = {"process_cpu_s": time.process_time() - process_cpu}
    if jiffies is not None and now is not None and now[1] > jiffies[1]:
        use["machine_idle_frac"] = (now[0] - jiffies[0]) / (now[1] - jiffies[1])
    return use


class Trial:
    """One per process of a trial (a forked DataLoader worker inherits it and stays quiet)."""

    def __init__(self, hooks: Any, config: dict[str, Any]) -> None:
        self.hooks, self.config = hooks, config
        self.records = hooks.records
        self.losses = 0
        self.warm_at: float | None = None
        self.zero_grad_seconds, self.zero_grads = 0.0, 0
        self.replayed: dict[int, list[Any]] = {}
        self.loader_cpu_s = self.loader_wall_s = 0.0
        self.batch_seen = False
        self.counted_from: tuple[float, float, float, float] | None = None
        self.machine_from: tuple[float, tuple[int, int] | None] | None = None
        self.autocast: Any = None  # the open bf16 autocast context of an outermost forward
        self.copies = [0, 0, 0, 0, 0.0]  # copies from the CPU to a GPU: COPY_FIELDS
        # as the counted steps began: the steps ended, and the copies' counts then
        self.copies_from: tuple[int, list[Any]] | None = None
        self.scratch = os.path.abspath(config["scratch"])
        self.allowed = [self.scratch, *map(os.path.abspath, config.get("keep", []))]
        self.owning = threading.local()  # making a path the trial's own: its own calls are not checked
        self.main_pid = os.getpid()
        self.world_size = int(os.environ.get("WORLD_SIZE", "1") or 1)
        # before the hook: gettempdir() opens files to probe the directory (inside the hook: a deadlock)
        self.caches = (tempfile.gettempdir(), os.path.expanduser("~/.cache"))
        self.created: set[str] = set()  # files this process created there
        sys.addaudithook(self._audit)

    # writes ----------------------------------------------------------------------------------
    def may_write(self, path: Any, opening: bool) -> bool:
        """Inside the scratch directory or the trial's records: yes. In the temporary directory or
        ~/.cache: a file this process created (it may open it again: Lightning does), a new one,
        a removal; never opening for writing a file that was there before. Elsewhere: no."""
        if isinstance(path, int) or path is None:
            return True
        name = os.path.abspath(os.fsdecode(path))
        if opening and os.path.isdir(name):
            return True  # O_TMPFILE (tempfile.TemporaryFile): an unnamed file, nothing overwritten
        if name.startswith(SYSTEM_ROOTS) or any(name == a or name.startswith(a + os.sep) for a in self.allowed):
            return True
        if not any(name.startswith(c + os.sep) for c in self.caches):
            return False
        if not opening or name in self.created:
            return True
        if os.path.exists(name):
            return False
        self.created.add(name)
        return True

    def check_write(self, path: Any, opening: bool = True, whole: bool = True, keep_content: bool = False) -> None:
        """Refuse a write `may_write` forbids; first, a path through the scratch directory is made
        the trial's own (own_in_scratch: `whole` for an open, or a directory removed whole)."""
        if not isinstance(path, int) and path is not None:
            name = os.path.abspath(os.fsdecode(path))
            if name.startswith(self.scratch + os.sep):
                self.owning.on = True
                try:
                    own_in_scratch(self.scratch, name, whole, keep_content)
                finally:
                    self.owning.on = False
        if not self.may_write(path, opening):
            name = os.path.abspath(os.fsdecode(path))
            self.records.write({"k": "refused", "path": name, "ts": time.time()})
            raise PermissionError(13, "dlscope doctor: a trial writes only inside its scratch directory", name)

    def _audit(self, event: str, args: tuple) -> None:
        if getattr(self.owning, "on", False):
            return
        if event == "open":
            path, mode, flags = args
            writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                mode is None and isinstance(flags, int) and flags & WRITE_FLAGS
            )
            if writing:  # what the file held is kept unless the open truncates it
                truncates = "w" in mode if isinstance(mode, str) else bool(flags & os.O_TRUNC)
                self.check_write(path, keep_content=not truncates)
        elif event in ("os.rmdir", "shutil.rmtree"):  # a mirrored directory: its real copy, of symlinks
            self.check_write(args[0], opening=False)
        elif event == "os.mkdir" and _is_directory(args[0]):
            return  # fails with EEXIST and changes nothing: os.makedirs(exist_ok=True) of a library's config
        elif event in ("os.remove", "os.mkdir"):  # a symlink removed is the link alone
            self.check_write(args[0], opening=False, whole=False)
        elif event in ("os.rename", "os.replace"):  # so is one renamed, or renamed over
            self.check_write(args[0], opening=False, whole=False)
            self.check_write(args[1], opening=False, whole=False)

    def attach_h5py(self, h5py: Any) -> None:
        """h5py writes from C, past the audit hook: a file is checked as it is opened to write."""
        init = h5py.File.__init__

        @functools.wraps(init)
        def checked(file: Any, name: Any, mode: str = "r", *args: Any, **kwargs: Any) -> None:
            if isinstance(name, str | bytes | os.PathLike) and mode != "r":
                self.check_write(name, keep_content=mode in ("r+", "a"))
            init(file, name, mode, *args, **kwargs)

        h5py.File.__init__ = checked

    # torch -----------------------------------------------------------------------------------
    def attach(self, torch: Any) -> None:
        from torch.utils.data import dataloader

        loader_init = dataloader.DataLoader.__init__
        signature = inspect.signature(loader_init)
        forced = dict(self.config.get("loader") or {})
        if self.config.get("replay"):
            forced["num_workers"] = 0  # batches replayed in the process: input made free

        @functools.wraps(loader_init)
        def init(loader: Any, *args: Any, **kwargs: Any) -> None:
            bound = signature.bind(loader, *args, **kwargs)
            given = {k: v for k, v in bound.arguments.items() if k in LOADER_ARGUMENTS}
            if "batch_size" in given and not isinstance(given["batch_size"], int | None):
                del given["batch_size"]
            self._site("DataLoader", given)
            arguments = {k: v for k, v in bound.arguments.items() if k != "self"}
            arguments.update(forced)
            if not arguments.get("num_workers", 0):
                arguments.pop("persistent_workers", None)  # only valid with workers: a forced 0 drops them
                arguments.pop("prefetch_factor", None)
            loader_init(loader, **arguments)

        dataloader.DataLoader.__init__ = init
        jit_save = torch.jit.save

        @functools.wraps(jit_save)
        def checked_jit_save(module: Any, f: Any, *args: Any, **kwargs: Any) -> Any:
            if isinstance(f, str | bytes | os.PathLike):  # written from C++, past the audit hook
                self.check_write(f)
            return jit_save(module, f, *args, **kwargs)

        torch.jit.save = checked_jit_save
        if self.config.get("replay"):
            single = dataloader._SingleProcessDataLoaderIter
            single._next_data = self._replaying(single._next_data, int(self.config["replay"]))
        threads = self.config.get("threads")
        if threads:
            torch.set_num_threads(int(threads))
            torch.set_num_threads = lambda n: None  # the trial's count stays
        for owner in (torch.optim.Optimizer, torch.nn.Module):
            owner.zero_grad = self._zero_grad(owner.zero_grad, owner.__name__)
        if torch.cuda.is_available():
            force = bool(self.config.get("non_blocking"))
            torch.Tensor.to = copying(torch, torch.Tensor.to, True, force, self.copies)
            torch.Tensor.cuda = copying(torch, torch.Tensor.cuda, False, force, self.copies)

    def _site(self, what: str, arguments: dict[str, Any]) -> None:
        user, direct = call_sites()
        record: dict[str, Any] = {"k": "site", "what": what, "arguments": arguments}
        if user is not None:
            record.update(file=user[0], line=user[1])
        if direct is not None and direct != user:
            record["built_by"] = f"{direct[0]}:{direct[1]}"  # a library built it, called from the user's line
        self.records.write(record)

    def _replaying(self, next_data: Any, first: int) -> Any:
        """The first `first` batches of each dataset drawn for real, then replayed in turn; the
        sampler still advances, so an epoch ends where it would."""

        @functools.wraps(next_data)
        def replayed(iterator: Any) -> Any:
            kept = self.replayed.setdefault(id(iterator._dataset), [])
            if len(kept) < first:
                batch = next_data(iterator)
                kept.append(batch)
                return batch
            iterator._next_index()  # StopIteration at the epoch's end, as the real fetch would
            return kept[iterator._num_yielded % first]

        return replayed

    def _zero_grad(self, zero_grad: Any, owner: str) -> Any:
        force = bool(self.config.get("set_to_none"))
        seen: set[str] = set()

        @functools.wraps(zero_grad)
        def timed(obj: Any, set_to_none: bool = True) -> Any:
            if owner not in seen:
                seen.add(owner)
                self._site(f"{owner}.zero_grad", {"set_to_none": bool(set_to_none)})
            start = time.perf_counter()
            try:
                return zero_grad(obj, True if force else set_to_none)
            finally:
                self.zero_grad_seconds += time.perf_counter() - start
                self.zero_grads += 1

        return timed

    def loader_next(self, timed: Any, next_: Any, iterator: Any) -> Any:
        """A batch drawn: its wall time (the step machine's) and this thread's CPU time in it —
        decoding in the process, or a wait (a read, a worker's batch) that more workers overlap."""
        start_cpu, start = time.thread_time(), time.perf_counter()
        try:
            batch = timed(next_, iterator)
        finally:
            self.loader_cpu_s += time.thread_time() - start_cpu
            self.loader_wall_s += time.perf_counter() - start
        if not self.batch_seen:
            self.batch_seen = True
            self.records.write({"k": "batch_layout", "tensors": tensor_layout(self.hooks.torch, batch)})
        return batch

    def forward_begin(self) -> None:
        """The outermost forward starts: under bf16 autocast when the trial says so."""
        if self.config.get("autocast") and self.autocast is None:
            device = self.config.get("autocast_device", "cpu")
            self.autocast = self.hooks.torch.autocast(device, dtype=self.hooks.torch.bfloat16)
            self.autocast.__enter__()

    def forward_end(self, output: Any) -> Any:
        """The outermost forward ends: autocast left, its bf16 output handed on as float32 (the loss
        is computed outside the forward, as without autocast). None: the output as it is."""
        if self.autocast is None:
            return None
        self.autocast.__exit__(None, None, None)
        self.autocast = None
        torch = self.hooks.torch

        def widened(value: Any) -> Any:
            return value.float() if isinstance(value, torch.Tensor) and value.dtype == torch.bfloat16 else value

        if isinstance(output, tuple | list) and type(output) in (tuple, list):
            return type(output)(widened(v) for v in output)
        return widened(output)

    # events ----------------------------------------------------------------------------------
    def backward(self, tensor: Any) -> None:
        """The loss a step's backward starts from, the first `losses` of them (a float: cheap on CPU)."""
        if self.losses >= self.config.get("losses", 0) or os.getpid() != self.main_pid:
            return
        if getattr(tensor, "numel", lambda: 0)() == 1:
            self.records.write({"k": "loss", "i": self.losses, "v": float(tensor.detach().float())})
            self.losses += 1

    def step_ended(self, steps: int, now: float) -> None:
        """After each counted step: past the warm-up the clock runs; at `stop_after` steps (or
        `stop_seconds` past the warm-up) the trial ends."""
        warmup = self.config.get("warmup", 0)
        if steps >= warmup and self.warm_at is None:
            self.warm_at = now
            # from here on: the thread's CPU and wall time, and the loader's share of each
            self.counted_from = (time.thread_time(), time.perf_counter(), self.loader_cpu_s, self.loader_wall_s)
            self.copies_from = (steps, self.copies[:])
            self.machine_from = (time.process_time(), cpu_jiffies())
        # the ranks of a distributed job end at the same step, never on their own clocks (the others
        # would wait in a collective for the one that left)
        limit = self.config.get("stop_seconds", float("inf")) if self.world_size <= 1 else float("inf")
        late = self.warm_at is not None and now - self.warm_at >= limit
        if steps > self.config.get("stop_after", sys.maxsize) or late:
            self.stop(steps - 1)

    def stop(self, steps: int) -> None:
        """A clean end, not a crash: records finished, DataLoader workers ended, exit status 0. The
        step whose end called this is not recorded (its row is written after this hook)."""
        import multiprocessing

        mean = self.zero_grad_seconds / self.zero_grads if self.zero_grads else None
        self.records.write({"k": "zero_grad", "mean_s": mean, "calls": self.zero_grads})
        if self.counted_from is not None:
            cpu, wall, loader_cpu, loader_wall = self.counted_from
            self.records.write(
                {
                    "k": "loader",
                    "cpu_s": self.loader_cpu_s - loader_cpu,
                    "wall_s": self.loader_wall_s - loader_wall,
                    "thread_cpu_s": time.thread_time() - cpu,
                    "thread_wall_s": time.perf_counter() - wall,
                    **machine_use(*self.machine_from),
                }
            )
        if self.copies_from is not None and self.copies[0]:
            steps_then, then = self.copies_from
            counts = {field: now - before for field, now, before in zip(COPY_FIELDS, self.copies, then, strict=True)}
            # (the step whose end stops the trial copied too)
            self.records.write({"k": "copies", "steps": steps + 1 - steps_then, **counts})
        self.records.write({"k": "trial_stop", "steps": steps, "ts": time.time()})
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        try:
            self.hooks.finish()
        finally:
            for child in multiprocessing.active_children():
                child.terminate()
            os._exit(0)
