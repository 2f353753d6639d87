"""The run directories of one job on several machines, read and checked before anything is written:
each launcher's `dlscope run` (one node's ranks), a job directory holding several of them
(<out>/hosts/, launchers that shared one --out), or an earlier `dlscope merge` (its Parquet
dataset). Which job a rank belongs to is what torchrun gave it (its run id, the rendezvous's
master address, the world size; contract/records' `launcher`); directories of two jobs, a rank in
two directories, a directory that is no run are refused in one line. Ranks no directory holds are
listed, not guessed.

    job = read_job([Path("node0"), Path("node1")])
    job.ranks, job.missing
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dlscope.analysis.observed import Observed, process_info
from dlscope.analysis.stepfile import CollectiveFile, StepFile, collective_files
from dlscope.errors import RunDirError
from dlscope.rundir import load_results, node_parts, node_parts_dir, parquet_dir, processes_dir


@dataclass(frozen=True)
class JobId:
    """What tells one job from another: torchrun's run id (--rdzv-id; a fresh one with --standalone),
    the master its rendezvous chose, the number of ranks. None where a rank had no torchrun."""

    run_id: str | None
    master: str | None
    world_size: int | None

    def describe(self) -> str:
        said = [f"run id {self.run_id!r}"] if self.run_id is not None else []
        said += [f"master {self.master}"] if self.master else []
        said += [f"{self.world_size} ranks"] if self.world_size else []
        return ", ".join(said) or "no launcher"


@dataclass
class Rank:
    """One rank's records, wherever they are."""

    rank: int
    pid: int
    hostname: str
    node: int | None
    local_rank: int | None
    world_size: int | None
    job: JobId
    source: Path  # the run directory (node part) that holds its records
    steps: StepFile | None = None
    collectives: CollectiveFile | None = None
    trace: Path | None = None  # its profiler trace, when it was profiled
    merged: dict[str, Any] | None = None  # from an earlier merge: its ranks.parquet row and files
    host: str = ""  # the partition's name (hosts_named)


@dataclass
class Part:
    """One input directory as read: where, its results, its ranks, its hang captures."""

    path: Path
    results: dict[str, Any]
    ranks: list[Rank]
    kind: str  # "run" (a launcher's dlscope run) or "merge" (an earlier dlscope merge)

    @property
    def hang(self) -> dict[str, Any] | None:
        return self.results["sections"].get("hang")


@dataclass
class Job:
    parts: list[Part]
    ranks: list[Rank]  # by rank
    world_size: int | None
    job: JobId
    missing: list[int] = field(default_factory=list)  # ranks of the world no directory holds


def read_job(paths: list[Path]) -> Job:
    """Every input read and checked (one line and no output when one is wrong)."""
    if not paths:
        raise RunDirError("no run directory to merge")
    parts = [part for path in paths for part in read_input(Path(path))]
    first = parts[0]
    ids = {part.path: _job_of(part) for part in parts}
    for part in parts[1:]:
        if not same_job(ids[part.path], ids[first.path]):
            theirs, ours = ids[part.path].describe(), ids[first.path].describe()
            raise RunDirError(f"ranks of another job ({theirs}) than {first.path}'s ({ours})", part.path)
    seen: dict[int, Part] = {}
    for part in parts:
        for r in part.ranks:
            if r.rank in seen:
                other = seen[r.rank].path
                raise RunDirError(f"rank {r.rank} is in {other} too: two runs of one node, or of two jobs", part.path)
            seen[r.rank] = part
    ranks = sorted((r for part in parts for r in part.ranks), key=lambda r: r.rank)
    world = max((r.world_size for r in ranks if r.world_size), default=None)
    hosts_named(ranks)
    missing = sorted(set(range(world)) - {r.rank for r in ranks}) if world else []
    return Job(parts, ranks, world, ids[first.path], missing)


def same_job(a: JobId, b: JobId) -> bool:
    """Two directories' ranks are of one job when what both know agrees."""
    return all(x is None or y is None or x == y for x, y in zip(vars(a).values(), vars(b).values(), strict=True))


def _job_of(part: Part) -> JobId:
    ids = {r.job for r in part.ranks}
    if len(ids) > 1:
        described = "; ".join(sorted(i.describe() for i in ids))
        raise RunDirError(f"holds ranks of more than one job ({described})", part.path)
    return ids.pop()


def read_input(path: Path) -> list[Part]:
    """The parts an input stands for: a job directory (<out>/hosts/) stands for its node parts."""
    if node_parts_dir(path).is_dir():
        parts = node_parts(path)
        if not parts:
            raise RunDirError("a job directory whose hosts/ holds no run yet", path)
        return [read_part(p) for p in parts]
    return [read_part(path)]


def read_part(path: Path) -> Part:
    results = load_results(path)  # not a run: one line (RunDirError)
    command = results["run"].get("command")
    if command == "merge":
        return Part(path, results, merged_ranks(path, results), "merge")
    if command != "run":
        raise RunDirError(f"a run of `dlscope {command}`: merge takes runs of `dlscope run` and `dlscope merge`", path)
    ranks = run_ranks(path)
    if not ranks:
        raise RunDirError("no rank of a distributed job recorded here (processes/ holds no rank's records)", path)
    return Part(path, results, ranks, "run")


def run_ranks(run: Path) -> list[Rank]:
    """The ranks whose records a `dlscope run` directory holds (a rank torchrun restarted: its
    last process)."""
    directory = processes_dir(run)
    if not directory.is_dir():
        return []
    observed = Observed.read(directory)
    collectives = collective_files(directory)
    found: dict[int, Rank] = {}
    started_at: dict[int, tuple[int, int]] = {}
    for pid, records in observed.records.items():
        info = process_info(pid, records)
        if info["rank"] is None or info["forked"] or info["loader_worker"] is not None:
            continue
        head = next((r for r in records if r.get("k") == "process"), {})
        launcher = head.get("launcher") or {}
        started = (launcher.get("restart") or 0, (head.get("clocks") or {}).get("realtime", 0))
        rank = Rank(
            rank=int(info["rank"]),
            pid=pid,
            hostname=str(head.get("host") or "unknown"),
            node=launcher.get("node"),
            local_rank=launcher.get("local_rank"),
            world_size=info["world_size"],
            job=JobId(launcher.get("run_id"), launcher.get("master"), info["world_size"]),
            source=run,
            steps=observed.steps.get(pid),
            collectives=collectives.get(pid),
            trace=_trace(records, directory),
        )
        if rank.rank not in found or started > started_at[rank.rank]:
            found[rank.rank], started_at[rank.rank] = rank, started
    return list(found.values())


def _trace(records: list[dict[str, Any]], directory: Path) -> Path | None:
    """The rank's profiler trace: where it was written, or by its name beside the records (a run
    directory copied from its machine)."""
    recorded = next((Path(r["trace"]) for r in records if r.get("k") == "profile" and r.get("trace")), None)
    if recorded is None:
        return None
    for candidate in (recorded, directory / recorded.name):
        if candidate.is_file():
            return candidate
    return None


def merged_ranks(path: Path, results: dict[str, Any]) -> list[Rank]:
    """The ranks of an earlier merge, from its ranks.parquet; every file of its dataset checked
    (whole, dlscope's, a schema version this dlscope reads) before any is used."""
    from dlscope.analysis import columnar

    root = parquet_dir(path)
    section = results["sections"].get("merge") or {}
    job = section.get("job") or {}
    job_id = JobId(job.get("run_id"), job.get("master"), job.get("world_size"))
    files = {
        table: {(host, rank): file for host, rank, file in columnar.dataset_files(root, table)}
        for table in (columnar.STEPS, columnar.COLLECTIVES)
    }
    for table, found in files.items():
        for file in found.values():
            columnar.check_file(file, table)
    ranks = []
    for row in columnar.read_ranks(root):
        ranks.append(
            Rank(
                rank=row["rank"],
                pid=row["pid"],
                hostname=row["hostname"],
                node=row["node"],
                local_rank=row["local_rank"],
                world_size=row["world_size"],
                job=job_id,
                source=path,
                merged={
                    "row": row,
                    **{table: found.get((row["host"], row["rank"])) for table, found in files.items()},
                },
            )
        )
    return ranks


def hosts_named(ranks: list[Rank]) -> None:
    """Each rank's host: its machine's name, with "-node<N>" where several nodes share the name
    (launchers on one machine), so that each node is a host of its own (its own clock offset)."""
    nodes: dict[str, set[Any]] = {}
    for r in ranks:
        nodes.setdefault(r.hostname, set()).add(r.node)
    for r in ranks:
        shared = len(nodes[r.hostname]) > 1
        r.host = f"{r.hostname}-node{r.node}" if shared else r.hostname
