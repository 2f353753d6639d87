"""A post-import hook on sys.meta_path, shared by the script hooks and the hang agent (both attach
to torch modules only once the user's program imports them)."""

from __future__ import annotations

import importlib.abc
import importlib.util
from collections.abc import Callable
from typing import Any


class AfterImport(importlib.abc.MetaPathFinder):
    """Calls `callback(module)` right after a module is first executed (a post-import hook).

    The callback is spent when the module runs, not when its spec is found: a bare
    `importlib.util.find_spec("torch")` (the `datasets` package asks before importing) finds a
    spec whose loader never runs, and the real import that follows is hooked all the same."""

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
        exec_module = spec.loader.exec_module

        def exec_then_attach(module: Any) -> None:
            exec_module(module)
            callback = self.callbacks.pop(fullname, None)
            if callback is None:
                return
            try:
                callback(module)
            except Exception as e:  # never break the user's program: the report says what failed
                self.on_error(fullname, e)

        spec.loader.exec_module = exec_then_attach
        return spec
