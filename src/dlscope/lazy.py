"""Packages that export names imported on first use, so `import dlscope` and `dlscope --help`
never pay for torch: `__getattr__ = lazy_exports(__name__, {"name": "module.path", ...})`."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_exports(package: str, api: dict[str, str]) -> Callable[[str], Any]:
    """A module `__getattr__` that imports `api[name]`'s module when `name` is first used."""

    def __getattr__(name: str) -> Any:
        if name in api:
            return getattr(importlib.import_module(api[name]), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
