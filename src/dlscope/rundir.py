"""The run directory every command writes, and its results.json (the report's single source).

runs/<name>/
    .dlscope-lock      flock'd by the one process writing this run; holds its pid
    results.json       versioned; rewritten atomically after every step
    tensorboard/       event files
    profile/           Chrome/Perfetto trace, operator tables (CSV, JSON)
    checkpoints/       last.pt (every epoch end), final.pt (the checkpoint step), reloaded.pt (its
                       load → save round trip, checkpoint anatomy)
    sweep/, graph/, ops/, pipeline/, iotrace/, keras/   what those steps wrote
    figures/           PNGs and SVGs that report.md links to (report.html embeds them)
    report.html        one self-contained file
    report.md
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import json
import math
import os
import shutil
import sys
import time
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from dlscope import __version__
from dlscope.errors import RunDirError, from_os_error, interrupt_signal
from dlscope.fsutil import atomic_write_bytes, clean_stale_temps, json_text, make_dirs

SCHEMA = "dlscope.results"
SCHEMA_VERSION = 3  # 2: sections rendered by report/sections (dlscope 0.2); 3: findings as facts (dlscope.findings)
LOCK_NAME = ".dlscope-lock"
RESULTS = "results.json"
# "<pid>:<run dir>": set for a child that writes into the run its parent holds (lab --trace-io)
LOCK_HELD_FOR_CHILD = "DLSCOPE_RUN_LOCK_HELD_BY"


def lock_run_dir(path: Path) -> int | None:
    """Take the run directory's advisory lock; the descriptor to close, or None when the parent
    process holds it for us. A second writer gets one line naming the holder's pid; a crashed
    holder's lock is released by the kernel with its descriptors."""
    lock = path / LOCK_NAME
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as e:
        raise from_os_error(e, "lock the run directory", lock) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
        os.close(fd)
        if os.environ.get(LOCK_HELD_FOR_CHILD) == f"{holder}:{path.resolve()}":
            return None
        raise RunDirError(f"in use by another dlscope run (pid {holder}); use another --out", path) from None
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    except OSError as e:
        os.close(fd)
        raise from_os_error(e, "lock the run directory", lock) from None
    return fd


def to_jsonable(value: Any) -> Any:
    """Plain JSON values: NaN/Inf become null, tuples lists, paths and other objects strings."""
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_jsonable(v) for v in value]
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if hasattr(value, "item") and callable(value.item):  # numpy / torch scalars
        return to_jsonable(value.item())
    return str(value)


class RunDir:
    def __init__(self, path: str | Path, command: str, argv: list[str] | None = None) -> None:
        self.path = make_dirs(path)
        lock = lock_run_dir(self.path)
        # closing the descriptor releases the lock: at release(), or when this object goes away
        self._unlock = weakref.finalize(self, os.close, lock) if lock is not None else None
        for directory in (self.path, *(d for d in self.path.iterdir() if d.is_dir())):
            clean_stale_temps(directory)  # left by a run that was killed: their pid is gone
        self.started = time.time()
        self.results: dict[str, Any] = {
            "schema": SCHEMA,
            "schema_version": SCHEMA_VERSION,
            "dlscope_version": __version__,
            "run": {
                "name": self.path.name,
                "command": command,
                "argv": list(sys.argv[1:] if argv is None else argv),
                "started": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                "status": "running",
            },
            "steps": [],
            "sections": {},
        }
        try:
            self.save()
        except KeyboardInterrupt as e:  # the file may be there already: it must not say "running"
            self.results["run"]["signal"] = interrupt_signal(e).name
            self.finish("interrupted")
            raise

    @classmethod
    def create(
        cls, out: str | Path | None, command: str, root: str | Path = "runs", argv: list[str] | None = None
    ) -> RunDir:
        """`out` as given, else runs/<command>-<timestamp> (never reusing an existing one)."""
        return cls(out if out is not None else cls.fresh_path(command, root), command, argv)

    @staticmethod
    def fresh_path(command: str, root: str | Path = "runs") -> Path:
        """runs/<command>-<timestamp>, a name no directory has yet."""
        stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
        path = Path(root) / f"{command}-{stamp}"
        n = 1
        while path.exists():
            n += 1
            path = Path(root) / f"{command}-{stamp}-{n}"
        return path

    def sub(self, name: str) -> Path:
        return make_dirs(self.path / name)

    def fresh_sub(self, name: str) -> Path:
        """`name` emptied first: what a run left there before (an --out given again) must not be
        read as this run's (its processes, its traces)."""
        shutil.rmtree(self.path / name, ignore_errors=True)
        return self.sub(name)

    def release(self) -> None:
        """Let another process write this run directory."""
        if self._unlock is not None:
            self._unlock()

    @contextlib.contextmanager
    def lent_to_children(self) -> Iterator[None]:
        """While inside, child processes may write this run although we hold its lock (the lab
        that `lab --trace-io` traces)."""
        os.environ[LOCK_HELD_FOR_CHILD] = f"{os.getpid()}:{self.path.resolve()}"
        try:
            yield
        finally:
            os.environ.pop(LOCK_HELD_FOR_CHILD, None)

    def rel(self, path: str | Path) -> str:
        """A path relative to the run directory, as results.json stores artifact paths."""
        try:
            return str(Path(path).resolve().relative_to(self.path.resolve()))
        except ValueError:
            return str(path)

    def record(self, step: str, section: dict[str, Any], at: int | None = None) -> None:
        """Keep `section` under `step`; `at`: its place among the sections (a step's own section goes
        before those it recorded itself while it ran), else after the others."""
        sections = self.results["sections"]
        sections[step] = to_jsonable(section)
        order = self.results["steps"]
        if step in order and at is not None:
            order.remove(step)
        if step not in order:
            order.insert(len(order) if at is None else at, step)
        self.save()

    def finish(self, status: str) -> None:
        run = self.results["run"]
        run["status"] = status
        run["finished"] = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
        run["wall_seconds"] = round(time.time() - self.started, 3)
        self.save()

    def reload(self) -> None:
        """Take results.json as another process left it (a lab run traced from outside)."""
        self.results = load_results(self.path)

    def save(self) -> None:
        text = json_text(self.results, indent=2, allow_nan=False)
        atomic_write_bytes(results_path(self.path), text.encode())


def load_results(run: str | Path) -> dict[str, Any]:
    """results.json of a run directory (or the file itself), checked against the schema."""
    path = Path(run)
    if path.is_dir():
        if not results_path(path).is_file():
            raise RunDirError(f"no {RESULTS} here: not a dlscope run directory", run)
        path = results_path(path)
    if not path.is_file():
        raise RunDirError(f"no such run directory or {RESULTS}", run)
    try:
        results = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise RunDirError(f"results.json is not valid JSON ({e})", path) from None
    if not isinstance(results, dict) or results.get("schema") != SCHEMA:
        raise RunDirError(f"not a dlscope results file (schema should be {SCHEMA!r})", path)
    version = results.get("schema_version")
    if not isinstance(version, int) or version > SCHEMA_VERSION:
        raise RunDirError(
            f"results schema version {version!r} is newer than this dlscope reads ({SCHEMA_VERSION})",
            path,
        )
    if not isinstance(results.get("sections"), dict):
        raise RunDirError("results.json has no 'sections' object", path)
    return results


def results_path(run: Path) -> Path:
    return run / RESULTS


# processes/: what the observed processes of a run keep as they run (dlscope run's records, and the
# live status and stack files of the hang agent): each file's name and layout, dlscope.contract

PROCESSES = "processes"


def processes_dir(run: Path) -> Path:
    return run / PROCESSES


# --- the layout of a run directory's multi-rank part: the one place that spells it -----------------
# ranks/launch.log (torchrun's output), ranks/train.json (rank 0's train section), and one folder per
# rank: rank.json (its record), trace.json (its profiler trace), pid (its processes, one a restart)

RANKS = "ranks"


def ranks_dir(run: Path) -> Path:
    return run / RANKS


def rank_dir(run: Path, rank: int) -> Path:
    return run / RANKS / f"rank{rank}"


def ranks_section(run: Path) -> Path:
    """The train section rank 0 writes for the launcher."""
    return run / RANKS / "train.json"


def rank_files(run: Path, name: str) -> dict[int, Path]:
    """rank → its file `name`, for every rank folder that holds one."""
    return {int(p.parent.name.removeprefix("rank")): p for p in sorted((run / RANKS).glob(f"rank*/{name}"))}


def last_checkpoint(run: Path, ckpt_format: str) -> Path:
    """Where the ranks' per-epoch checkpoint is: the one a failed job keeps and a restart resumes."""
    return run / "checkpoints" / ("last.dcp" if ckpt_format == "dcp" else "last.pt")


# --- a job on several machines: `dlscope run` of one node's launcher, `dlscope merge` of them -----
# A launcher of a several-node job (torchrun --nnodes N, N > 1) writes its run under
# <out>/hosts/<hostname>-<pid>/ (a whole run directory), so that launchers sharing one --out
# (network storage) never write into each other's; <out> itself is the job's: the merged
# results.json and report once every node's part is in, and its columnar records under parquet/.

NODE_PARTS = "hosts"
PARQUET = "parquet"
MERGE_LOCK = ".dlscope-merging"  # flock'd by the launcher that checks whether the job is whole


def node_parts_dir(job: Path) -> Path:
    return job / NODE_PARTS


def node_part(job: Path, hostname: str, pid: int) -> Path:
    return job / NODE_PARTS / f"{hostname}-{pid}"


def node_parts(job: Path) -> list[Path]:
    """The node parts under a job directory, each a run directory."""
    return sorted(p for p in (job / NODE_PARTS).glob("*") if (p / RESULTS).is_file())


def parquet_dir(run: Path) -> Path:
    return run / PARQUET
