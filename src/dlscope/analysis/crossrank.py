"""A job's ranks compared, as SQL queries of DuckDB (embedded, out-of-core, multi-threaded) over the
Parquet dataset `columnar` writes — no Python loop over the rows, and memory bounded by DuckDB's
limit at any number of ranks:

    per rank   its steps' time and anatomy (the steady ones: not the first, not profiled)
    per host   the same over its ranks, and its clock offset
    slowest    the slowest steady steps of the whole job
    offsets    each host's clock against the host of the lowest rank, from the job itself: a
               collective every rank waits for (all-reduce, all-gather, reduce-scatter, barrier,
               all-to-all) completes on every rank at one instant, give or take the last hop, so
               the median gap between two hosts' completions of the same collectives is the gap
               between their clocks — not NTP's word
    straggler  the k-th collective of a step is one collective on every rank; on clocks set
               right, the rank that launches it last made the others wait. The rank last at most
               of them is the straggler; what it costs each other rank a step is its lateness
               at the step's last collective (the others wait there for it), against the median
               of the others' launches

    section = analyse(Path("run/parquet"), ranks=4)
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import duckdb

from dlscope.analysis import columnar
from dlscope.analysis.ranks import STRAGGLER_MIN_MS, STRAGGLER_SHARE, STRAGGLER_STEP_PCT

MEMORY_LIMIT = "1GB"  # DuckDB spills past it (to the run directory): the merge's peak RSS stays near it
SLOWEST = 5
# the collectives every rank waits for: they end together (a broadcast's root, a send, do not wait)
ALL_WAIT = (
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "barrier",
    "monitored_barrier",
    "all_to_all",
    "all_to_all_single",
)
PARTS = columnar._PARTS


def connect(root: Path, spill: Path, threads: int | None = None) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB with a view per table of the dataset under `root` (steps, collectives;
    a table with no file is an empty one)."""
    con = duckdb.connect(config={"threads": threads or os.cpu_count() or 1, "memory_limit": MEMORY_LIMIT})
    con.execute(f"SET temp_directory = {_quoted(spill)}")
    con.execute("SET preserve_insertion_order = false")
    for table, schema in ((columnar.STEPS, columnar.STEPS_SCHEMA), (columnar.COLLECTIVES, columnar.COLLECTIVES_SCHEMA)):
        if columnar.dataset_files(root, table):
            pattern = columnar.table_dir(root, table) / "host=*" / "rank=*" / columnar.PART
            con.execute(
                f"CREATE VIEW {table} AS SELECT * FROM read_parquet({_quoted(pattern)}, hive_partitioning = true, "
                "hive_types = {'host': VARCHAR, 'rank': INTEGER})"
            )
        else:
            columns = ", ".join(f'"{name}" {_duck_type(schema.field(name).type)}' for name in schema.names)
            con.execute(f'CREATE TABLE {table} ({columns}, host VARCHAR, "rank" INTEGER)')
    return con


def _quoted(path: Path) -> str:
    """A path as an SQL string literal (a view's definition takes no parameter)."""
    return "'" + str(path).replace("'", "''") + "'"


def _duck_type(arrow: Any) -> str:
    import pyarrow as pa

    if pa.types.is_floating(arrow):
        return "DOUBLE"
    if pa.types.is_boolean(arrow):
        return "BOOLEAN"
    if pa.types.is_integer(arrow):
        return "BIGINT"
    return "VARCHAR"


def rows(con: duckdb.DuckDBPyConnection, query: str, params: list[Any] | None = None) -> list[dict[str, Any]]:
    cursor = con.execute(query, params or [])
    names = [d[0] for d in cursor.description]
    return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


def per_rank(con: duckdb.DuckDBPyConnection) -> list[dict[str, Any]]:
    """Each rank's steps: count, and over its steady steps (all of them where none is steady: a
    run too short) the mean step, its median, 95th percentile and anatomy, ms."""
    found = {r["rank"]: r for r in _rank_steps(con, "steady")}
    short = [rank for rank, r in found.items() if not r["steady"]]
    if short:  # one holistic aggregate a rank at a time is what memory allows: only where needed
        found.update({r["rank"]: r for r in _rank_steps(con, "true", short)})
    out = []
    for rank in sorted(found):
        r = found[rank]
        row = {key: r[key] for key in ("rank", "host", "steps", "steady")}
        for key in ("step_ms", "p50_ms", "p95_ms", "max_ms", *(f"{p}_ms" for p in PARTS)):
            row[key] = _ms(r[key])
        row["data_pct"] = round(100.0 * row["data_ms"] / row["step_ms"], 1) if row["step_ms"] else None
        out.append(row)
    return out


def _rank_steps(con: duckdb.DuckDBPyConnection, counted: str, only: list[int] | None = None) -> list[dict[str, Any]]:
    parts = ", ".join(f"1e3 * avg({p}) FILTER ({counted}) AS {p}_ms" for p in PARTS)
    where = f'WHERE "rank" IN ({", ".join(str(int(r)) for r in only)})' if only else ""
    found = rows(
        con,
        f"""SELECT "rank", host, count(*) AS steps, count(*) FILTER (steady) AS steady,
               1e3 * avg(seconds) FILTER ({counted}) AS step_ms,
               quantile_cont(seconds, [0.5, 0.95]) FILTER ({counted}) AS q, 1e3 * max(seconds) AS max_ms, {parts}
            FROM steps {where} GROUP BY "rank", host""",
    )
    for r in found:
        q = r.pop("q") or [None, None]
        r["p50_ms"], r["p95_ms"] = (None if v is None else 1e3 * v for v in q)
    return found


def _ms(value: float | None) -> float | None:
    return None if value is None else round(float(value), 3)


def per_host(ranks: list[dict[str, Any]], offsets: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Each host's ranks together (from the per-rank rows: one row per rank, few)."""
    hosts: dict[str, list[dict[str, Any]]] = {}
    for r in ranks:
        hosts.setdefault(r["host"], []).append(r)
    out = []
    for host, mine in hosts.items():
        timed = [r for r in mine if r["step_ms"] is not None]
        slowest = max(timed, key=lambda r: r["step_ms"], default=None)
        out.append(
            {
                "host": host,
                "ranks": [r["rank"] for r in mine],
                "steps": sum(r["steps"] for r in mine),
                "step_ms": _mean(timed, "step_ms"),
                "data_ms": _mean(timed, "data_ms"),
                "slowest_rank": slowest["rank"] if slowest else None,
                "slowest_rank_ms": slowest["step_ms"] if slowest else None,
                "offset": offsets.get(host),
            }
        )
    return sorted(out, key=lambda h: min(h["ranks"]))


def _mean(rows: list[dict[str, Any]], key: str) -> float | None:
    return round(sum(r[key] for r in rows) / len(rows), 3) if rows else None


def slowest_steps(con: duckdb.DuckDBPyConnection, limit: int = SLOWEST) -> list[dict[str, Any]]:
    columns = ", ".join(f"round(1e3*{p}, 3) AS {p}_ms" for p in ("seconds", *PARTS))
    found = rows(
        con, f"SELECT rank, host, step, {columns} FROM steps WHERE steady ORDER BY seconds DESC LIMIT {limit:d}"
    )
    return [{**r, "ms": r.pop("seconds_ms")} for r in found]


def clock_offsets(con: duckdb.DuckDBPyConnection, reference: str) -> dict[str, dict[str, Any]]:
    """Each host's clock minus the reference host's (ms), with the quartiles of the per-collective
    gaps (their spread is the estimate's noise) and how many collectives it rests on. A host's time
    for a collective is its first rank's completion: what delays a completion (a descheduled
    thread, a later hop) only ever adds, so the earliest is the least delayed."""
    ops = ", ".join(f"'{op}'" for op in ALL_WAIT)
    found = rows(
        con,
        f"""WITH ends AS (
                SELECT host, step, "index", min(done) AS done FROM collectives
                WHERE done IS NOT NULL AND CAST(op AS VARCHAR) IN ({ops}) GROUP BY host, step, "index"),
            ref AS (SELECT step, "index", done AS ref FROM ends WHERE host = ?)
            SELECT host, count(*) AS collectives, quantile_cont(done - ref, [0.5, 0.25, 0.75]) AS q
            FROM ends JOIN ref USING (step, "index") GROUP BY host""",
        [reference],
    )
    return {
        r["host"]: {
            "ms": round(1e3 * r["q"][0], 3),
            "q1_ms": round(1e3 * r["q"][1], 3),
            "q3_ms": round(1e3 * r["q"][2], 3),
            "collectives": r["collectives"],
        }
        for r in found
    }


def _corrected(con: duckdb.DuckDBPyConnection, offsets: dict[str, dict[str, Any]]) -> None:
    """A view of the collectives' launches on the reference host's clock."""
    con.execute("CREATE OR REPLACE TEMP TABLE host_offset (host VARCHAR, offset_s DOUBLE)")
    if offsets:
        con.executemany("INSERT INTO host_offset VALUES (?, ?)", [(h, o["ms"] / 1e3) for h, o in offsets.items()])
    con.execute(
        """CREATE OR REPLACE TEMP VIEW launches AS
           SELECT c."rank", c.host, c.step, c."index", c.launch - coalesce(o.offset_s, 0) AS t
           FROM collectives c LEFT JOIN host_offset o USING (host)"""
    )


def straggler(
    con: duckdb.DuckDBPyConnection, offsets: dict[str, dict[str, Any]], by_rank: list[dict[str, Any]]
) -> dict[str, Any]:
    """Who launches each collective last, on clocks set right; the straggler and its cost a step.
    Medians of the others are taken by position in a sorted window (row_number), which DuckDB
    spills to disk, not by a holistic aggregate per collective, which it keeps in memory."""
    _corrected(con, offsets)
    ranks = con.execute('SELECT count(DISTINCT "rank") FROM collectives').fetchone()[0]
    if ranks < 2:
        return {"ranks": ranks, "matched": 0, "last_by_rank": [], "straggler": None}
    # each collective's launches in order: the last rank's, against the median of the others'
    con.execute(
        f"""CREATE OR REPLACE TEMP TABLE matched AS
            WITH o AS (SELECT step, "index", "rank", t,
                              row_number() OVER (PARTITION BY step, "index" ORDER BY t) - 1 AS pos,
                              count(*) OVER (PARTITION BY step, "index") AS n
                       FROM launches)
            SELECT step, "index", arg_max("rank", t) AS last_rank,
                   max(t) - avg(t) FILTER ({_MEDIAN_OF_OTHERS}) AS late
            FROM o WHERE n = {int(ranks)} GROUP BY ALL"""
    )
    matched = con.execute("SELECT count(*) FROM matched").fetchone()[0]
    last = rows(
        con,
        """SELECT last_rank AS "rank", count(*) AS last, 1e3 * median(late) AS median_late_ms
           FROM matched GROUP BY last_rank ORDER BY last DESC, last_rank""",
    )
    section: dict[str, Any] = {
        "ranks": ranks,
        "matched": matched,
        "last_by_rank": [{**r, "median_late_ms": round(r["median_late_ms"], 3)} for r in last],
        "straggler": None,
    }
    if not last or not matched:
        return section
    top = last[0]
    # its cost a step: at each step's last collective, its launch against the median of the others'
    cost = con.execute(
        f"""WITH final AS (SELECT step, max("index") AS "index" FROM launches GROUP BY step),
            o AS (SELECT step, "rank", t,
                         row_number() OVER (PARTITION BY step ORDER BY ("rank" = $1), t) - 1 AS pos,
                         count(*) OVER (PARTITION BY step) AS n
                  FROM launches JOIN final USING (step, "index")),
            g AS (SELECT step, max(t) FILTER ("rank" = $1) - avg(t) FILTER ({_MEDIAN_OF_OTHERS}) AS late
                  FROM o WHERE n = $2 GROUP BY step)
            SELECT 1e3 * median(late), count(late) FROM g""",
        [top["rank"], ranks],
    ).fetchone()
    others = [r["step_ms"] for r in by_rank if r["rank"] != top["rank"] and r["step_ms"] is not None]
    step_ms = sum(others) / len(others) if others else None
    cost_ms = round(cost[0], 3) if cost[0] is not None else None
    host = next((r["host"] for r in by_rank if r["rank"] == top["rank"]), None)
    candidate = {
        "rank": top["rank"],
        "host": host,
        "last": top["last"],
        "of": matched,
        "share": round(top["last"] / matched, 3),
        "cost_ms": cost_ms,
        "steps": cost[1],
        "others_step_ms": round(step_ms, 3) if step_ms else None,
        "step_pct": round(100.0 * cost_ms / step_ms, 1) if cost_ms is not None and step_ms else None,
        "others": ranks - 1,
    }
    section["candidate"] = candidate
    late_enough = cost_ms is not None and cost_ms >= STRAGGLER_MIN_MS
    if candidate["share"] >= STRAGGLER_SHARE and late_enough and (candidate["step_pct"] or 0) >= STRAGGLER_STEP_PCT:
        section["straggler"] = candidate
    return section


# the others are positions 0 … n-2 of the sorted launches (the one left out sorts last): their median
# is the row at (n-2)//2, averaged with the row at (n-1)//2 when there are evenly many
_MEDIAN_OF_OTHERS = "pos = (n - 2) // 2 OR pos = (n - 1) // 2"


def analyse(root: Path, spill: Path, threads: int | None = None) -> dict[str, Any]:
    """Every cross-rank table of the dataset under `root` (DuckDB spills to `spill`)."""
    con = connect(root, spill, threads)
    try:
        by_rank = per_rank(con)
        reference = by_rank[0]["host"] if by_rank else None
        present = con.execute("SELECT count(*) FROM collectives WHERE done IS NOT NULL").fetchone()[0]
        offsets = clock_offsets(con, reference) if reference is not None and present else {}
        return {
            "ranks": by_rank,
            "hosts": per_host(by_rank, offsets),
            "reference_host": reference,
            "offsets": offsets,
            "slowest": slowest_steps(con),
            "collectives": straggler(con, offsets, by_rank),
        }
    finally:
        con.close()
