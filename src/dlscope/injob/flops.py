"""The FLOPs of one training step by dtype, and model-FLOPs utilisation against measured peaks.

What is counted: the FLOPs torch's own `torch.utils.flop_counter.FlopCounterMode` counts (matrix
products, convolutions, attention kernels: the ops in its `flop_registry`, 2 FLOPs per
multiply-add), for every op dispatched in this thread between `StepFlops.start()` and `.stop()`,
backward included (the autograd engine carries the mode to its threads). Each op's FLOPs are
tallied under the dtype of its first floating-point tensor input, in argument order: the operands
the kernel multiplies, after autocast has cast them (a bfloat16 autocast region counts under
"bfloat16"), and for a scaled float8 product its float8 inputs rather than its wider output, since
the inputs decide which tensor-core rate applies. A float32 op on a CUDA tensor is counted under
"tf32" when torch allowed TF32 for it at that moment (matrix products: cuBLAS's setting;
convolutions: cuDNN's, on by default). The names are those `dlscope.measure.peaks.matmul_peaks`
keys its peaks by.

Not counted: ops outside the registry (elementwise, reductions, optimizer updates), kernels a
torch.compile'd or CUDA-graph-replayed region runs without dispatching aten ops, and ops run in
other Python threads.

torch is imported only when counting starts. Model-FLOPs utilisation from these counts is
dlscope.analysis.gpu's `mfu`.
"""

from __future__ import annotations

import functools
from typing import Any

CONV_OPS = frozenset(
    {
        "convolution",
        "_convolution",
        "convolution_backward",
        "convolution_overrideable",
        "cudnn_convolution",
        "_slow_conv2d_forward",
    }
)
TF32_OPS = frozenset({"mm", "addmm", "bmm", "baddbmm"}) | CONV_OPS  # TF32 applies to these on CUDA


class StepFlops:
    """FLOPs by dtype between `start()` and `stop()`, called at two points of the program in one
    thread. Nothing is installed before `start()`; no method raises: an error is in the result of
    `stop()`. Where the script entered a dispatch mode of its own after `start()` and is still in
    it at `stop()`, the counting mode cannot be taken off from under it: it stays, counting
    nothing anyone reads, until `release()` finds it on top again (the script's mode exited)."""

    def __init__(self) -> None:
        self._counter: Any = None
        self._error: str | None = None
        self._stuck: Any = None  # a counter whose mode stop() could not take off torch's stack

    def start(self) -> bool:
        """Start counting; False (and the reason in `stop()`'s result) if it could not."""
        if self._counter is not None:
            return True
        try:
            counter = _counter_class()()
            counter.begin()
        except Exception as error:  # e.g. a torch without FlopCounterMode's internals used here
            self._error = f"{type(error).__name__}: {error}"
            return False
        self._counter, self._error = counter, None
        return True

    def stop(self) -> dict[str, Any]:
        """Stop counting: {"by_dtype": {dtype name: FLOPs}, "flops": total} plus "error" (the first
        error, while starting, counting an op or stopping) when there was one. Without a `start()`:
        {"by_dtype": {}, "flops": 0} (with "error" if `start()` failed)."""
        counter, self._counter = self._counter, None
        if counter is None:
            result: dict[str, Any] = {"by_dtype": {}, "flops": 0}
            if self._error:
                result["error"] = self._error
            return result
        try:
            counter.end()
        except Exception as error:
            counter.error = counter.error or f"{type(error).__name__}: {error}"
            if counter.mode is not None:  # still on the stack, under another mode
                self._stuck = counter
        by_dtype = dict(counter.by_dtype)
        result = {"by_dtype": by_dtype, "flops": sum(by_dtype.values())}
        if counter.error:
            result["error"] = counter.error
        return result

    @property
    def stuck(self) -> bool:
        """The counting mode is still on torch's stack after `stop()`."""
        return self._stuck is not None

    def release(self) -> bool:
        """Take a stuck counting mode off torch's stack where it is on top again: True once it is
        off (or was never stuck)."""
        counter = self._stuck
        if counter is None:
            return True
        try:
            counter.end()
        except Exception:  # the script's mode is still above it
            return False
        self._stuck = None
        return True


@functools.cache
def _counter_class() -> type:
    """FlopCounterMode with a per-dtype tally, defined on first use so that importing this module
    does not import torch."""
    import torch
    from torch.utils import flop_counter
    from torch.utils._pytree import tree_flatten

    from dlscope.measure.peaks import tf32_enabled

    # torch ≥ 2.4: FlopCounterMode is a plain object whose inner TorchDispatchMode
    # (_FlopCounterMode) calls counter._count_flops(op packet, out, args, kwargs) for every op.
    # Entering that inner mode alone skips FlopCounterMode.__enter__'s ModuleTracker (module-level
    # attribution, unused here): it installs global hooks on every module call and warns when
    # counting starts or stops inside a module's forward. Without it all FLOPs go to "Global".
    inner_mode = getattr(flop_counter, "_FlopCounterMode", None)

    class DtypeFlopCounter(flop_counter.FlopCounterMode):
        def __init__(self) -> None:
            super().__init__(display=False)
            self.by_dtype: dict[str, int] = {}
            self.error: str | None = None
            self.entered: Any = None

        def begin(self) -> None:
            if inner_mode is None:  # a torch whose internals differ: the public way in
                self.entered = self
                self.__enter__()
                return
            self.flop_counts.clear()
            self.mode = inner_mode(self)
            self.mode.__enter__()
            self.entered = self.mode

        def end(self) -> None:
            from torch.utils._python_dispatch import _get_current_dispatch_mode

            mode = self.mode
            if mode is None:
                return
            if _get_current_dispatch_mode() is not mode:
                # exiting pops the top of torch's mode stack, whatever it is: leave a mode the
                # script pushed after start() in place (ours then stays below it, counting)
                raise RuntimeError("another torch dispatch mode was entered after counting started")
            if self.entered is self:
                self.__exit__(None, None, None)
            else:
                mode.__exit__(None, None, None)
                self.mode = None

        def _count_flops(self, func_packet: Any, out: Any, args: Any, kwargs: Any) -> Any:
            # the tally is the increase of FlopCounterMode's own count, so its formulas are not
            # re-run; an error is kept for the result, never raised into the script's op
            try:
                totals = self.flop_counts["Global"]
                before = totals.get(func_packet, 0)
                out = super()._count_flops(func_packet, out, args, kwargs)
                added = totals.get(func_packet, 0) - before
                if added:
                    key = dtype_key(func_packet, out, args, kwargs)
                    self.by_dtype[key] = self.by_dtype.get(key, 0) + int(added)
            except Exception as error:
                self.error = self.error or f"{type(error).__name__} counting {func_packet}: {error}"
            return out

    def dtype_key(func_packet: Any, out: Any, args: Any, kwargs: Any) -> str:
        tensors = [t for t in tree_flatten((args, kwargs, out))[0] if isinstance(t, torch.Tensor)]
        tensor = next((t for t in tensors if t.is_floating_point()), tensors[0] if tensors else None)
        if tensor is None:
            return "unknown"
        name = str(tensor.dtype).removeprefix("torch.")
        if tensor.dtype == torch.float32 and tensor.is_cuda:
            op = getattr(func_packet, "__name__", "")
            if op in TF32_OPS and tf32_enabled("conv" if op in CONV_OPS else "matmul"):
                return "tf32"
        return name

    return DtypeFlopCounter
