"""Errors a user can act on. The CLI prints them as one line and exits with status 2."""

from __future__ import annotations

from pathlib import Path


class DlscopeError(Exception):
    """A fault in the user's input or environment, described in one line."""

    def __init__(self, message: str, path: str | Path | None = None):
        self.path = str(path) if path is not None else None
        self.message = message
        super().__init__(f"{self.path}: {message}" if self.path else message)


class DatasetError(DlscopeError):
    """A dataset file is missing, corrupt or not what it claims to be."""


class CheckpointError(DlscopeError):
    """A checkpoint cannot be written, read or verified."""


class ConfigError(DlscopeError):
    """A configuration value is out of range or inconsistent."""


class RunDirError(DlscopeError):
    """A run directory or its results.json is missing or unreadable."""
