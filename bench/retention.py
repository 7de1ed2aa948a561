"""Retention keeps a store small and its cycle flat: a simulated 90 days of a schedule
with a 2-step Workflow, with retention of 30 days (docs/DESIGN.md, "Retention").

    python -m bench.retention [--days 90] [--keep-days 30] [--every-minutes 1] [--pg URL]
                              [--smoke]

A virtual clock steps from one occurrence of `*/N * * * *` to the next (N is
`--every-minutes`; 1 is the issue's `* * * * *`, 1,440 Runs a day): each step is a
cycle (which fires the Run), its two steps leased, run and completed, a cycle that
ends it, then the host's retention policy (`qlflow.retention_policy`: at most one
bounded batch of Runs that finished more than `--keep-days` ago). Measured: the
store's size at the end of each day (SQLite: the database file after a TRUNCATE
checkpoint of its WAL; PostgreSQL: `pg_total_relation_size` of every table in the schema,
after the VACUUM autovacuum would run), the median time of a cycle with its
retention tick over the last simulated day at day `--keep-days` and at the end (wall
clock, and this process's CPU: on a shared machine the wall clock measures the
neighbours too; on SQLite the database's work is in this process), and the cost of
a retention batch per Run it removed (and the Runs a batch removed). Writes a table
to stdout and JSON to bench/results/retention.json. PostgreSQL runs when --pg (or
QLFLOW_TEST_PG_URL) is set.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from contextlib import closing
from pathlib import Path
from typing import Any

import orjson
import psycopg
from rich.console import Console
from rich.table import Table

import qlflow
from bench.output import results_path
from bench.rebuild import _pg_schema_url
from qlflow.retention_policy import RetentionPolicy

RESULTS = results_path("retention")
MINUTE = 60_000
DAY = 1440 * MINUTE
DAY0 = 1_714_521_600_000  # 2024-05-01T00:00Z


def manifest(every_minutes: int) -> dict[str, Any]:
    cron = "* * * * *" if every_minutes == 1 else f"*/{every_minutes} * * * *"
    return {
        "package": {"name": "ticker", "publisher": "acme"},
        "tasks": {"t": {"command": ["true"]}},
        "workflows": {
            "tick": {
                "steps": [
                    {"key": "fetch", "task": "t"},
                    {"key": "store", "task": "t", "needs": ["fetch"]},
                ],
                "schedules": [{"cron": cron, "timezone": "UTC"}],
            }
        },
    }


def _run_due(rt: qlflow.Runtime, now: int) -> None:
    """Lease, run and complete every ready step at `now` until none is left."""
    for _ in range(4):
        leases = rt.lease_attempts("bench", limit=8, now_ms=now)
        if not leases:
            return
        for lease in leases:
            lease = rt.mark_running(lease, now_ms=now)
            rt.complete(lease, "succeeded", output={"ok": True}, now_ms=now)
        rt.cycle(now_ms=now)


def bench_store(
    url: str,
    days: int,
    keep_days: int,
    every: int,
    size: Callable[[qlflow.Runtime], int],
    relations: Callable[[qlflow.Runtime], dict[str, int]],
    reclaim: bool = True,
) -> dict[str, Any]:
    removed_runs = 0
    batch_ms: list[float] = []
    batch_runs: list[int] = []
    reclaim_ms: list[float] = []  # ticks that reclaimed (VACUUM on PostgreSQL), whole
    sizes: list[int] = []
    by_relation: dict[int, dict[str, int]] = {}  # bytes per table and index, days keep and end
    tick_ms: dict[int, list[float]] = {}
    cpu_ms: dict[int, list[float]] = {}  # this process's CPU (SQLite's work is in it)
    with qlflow.open(url) as rt:
        rt.publish(manifest(every), now_ms=DAY0 - MINUTE)
        rt.cycle(now_ms=DAY0 - MINUTE)  # armed at the first occurrence
        policy = RetentionPolicy(finished_runs_ms=keep_days * DAY, batch=100)
        if not reclaim:  # as before the policy reclaimed: the daily VACUUM alone
            policy.reclaim_every_ms = None
        step = every * MINUTE
        now = DAY0
        for day in range(1, days + 1):
            times = tick_ms.setdefault(day, [])
            cpu = cpu_ms.setdefault(day, [])
            end = DAY0 + day * DAY
            while now < end:
                at = now + 1000  # a second after the occurrence
                started, cpu_started = time.perf_counter(), time.process_time()
                rt.cycle(now_ms=at)
                _run_due(rt, at)
                ticked, reclaimed = time.perf_counter(), policy.reclaimed_at
                report = policy.tick(rt, at)
                done = time.perf_counter()
                times.append((done - started) * 1000)
                cpu.append((time.process_time() - cpu_started) * 1000)
                if report is not None and report.runs:
                    removed_runs += report.runs
                    batch_runs.append(report.runs)
                if policy.reclaimed_at != reclaimed:
                    reclaim_ms.append((done - ticked) * 1000)
                elif report is not None and report.runs:
                    batch_ms.append((done - ticked) * 1000 / report.runs)
                now += step
            sizes.append(size(rt))
            print(  # a long run's progress: the day, its size and its cycle's median
                f"day {day}: {sizes[-1]} bytes, cycle median {statistics.median(times):.1f} ms, "
                f"{removed_runs} Runs removed",
                file=sys.stderr,
                flush=True,
            )
            if day in (keep_days, days):
                by_relation[day] = relations(rt)
        runs_left = rt.store.query("SELECT COUNT(*) FROM runs")[0][0]
        events_left = rt.store.query("SELECT COUNT(*) FROM events")[0][0]
        verified = rt.verify_projections().ok
    at_keep = statistics.median(tick_ms[keep_days])
    at_end = statistics.median(tick_ms[days])
    cpu_keep = statistics.median(cpu_ms[keep_days])
    cpu_end = statistics.median(cpu_ms[days])
    return {
        "runs_per_day": DAY // (every * MINUTE),
        "size_by_day": sizes,
        "size_at_keep_days": sizes[keep_days - 1],
        "size_at_end": sizes[-1],
        "size_ratio": round(sizes[-1] / sizes[keep_days - 1], 3),
        "cycle_ms_median_at_keep_days": round(at_keep, 2),
        "cycle_ms_median_at_end": round(at_end, 2),
        "cycle_ratio": round(at_end / at_keep, 3),
        "cycle_cpu_ms_median_at_keep_days": round(cpu_keep, 2),
        "cycle_cpu_ms_median_at_end": round(cpu_end, 2),
        "cycle_cpu_ratio": round(cpu_end / cpu_keep, 3) if cpu_keep else None,
        "cycle_ms_median_by_day": [
            round(statistics.median(tick_ms[d]), 2) for d in sorted(tick_ms)
        ],
        "batch_runs_median": statistics.median(batch_runs) if batch_runs else None,
        "runs_removed": removed_runs,
        "batch_ms_per_run_median": round(statistics.median(batch_ms), 3) if batch_ms else None,
        "reclaims": len(reclaim_ms),
        "reclaim_tick_ms_median": round(statistics.median(reclaim_ms), 1) if reclaim_ms else None,
        "reclaim_tick_ms_max": round(max(reclaim_ms), 1) if reclaim_ms else None,
        "runs_left": runs_left,
        "events_left": events_left,
        "verify_ok": verified,
        "relations": relation_growth(by_relation[keep_days], by_relation[days]),
    }


def relation_growth(keep: dict[str, int], end: dict[str, int]) -> list[dict[str, Any]]:
    """Each relation's bytes at day keep and at the end, the largest growth first."""
    rows = [
        {"relation": name, "keep": keep.get(name, 0), "end": end.get(name, 0)}
        for name in sorted(set(keep) | set(end))
    ]
    rows.sort(key=lambda row: row["end"] - row["keep"], reverse=True)
    return rows


def sqlite_size(path: Path) -> Callable[[qlflow.Runtime], int]:
    def size(rt: qlflow.Runtime) -> int:
        # the WAL copied into the file and truncated, as a checkpoint at rest leaves it
        with closing(sqlite3.connect(path)) as conn:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        wal = Path(f"{path}-wal")
        return path.stat().st_size + (wal.stat().st_size if wal.exists() else 0)

    return size


def sqlite_relations(path: Path) -> Callable[[qlflow.Runtime], dict[str, int]]:
    def relations(rt: qlflow.Runtime) -> dict[str, int]:
        with closing(sqlite3.connect(path)) as conn:
            try:
                rows = conn.execute("SELECT name, SUM(pgsize) FROM dbstat GROUP BY name").fetchall()
            except sqlite3.OperationalError:  # built without SQLITE_ENABLE_DBSTAT_VTAB
                rows = []
            page = conn.execute("PRAGMA page_size").fetchone()[0]
            free = conn.execute("PRAGMA freelist_count").fetchone()[0]
        return {**{str(name): int(total) for name, total in rows}, "(freelist)": free * page}

    return relations


def pg_relations(base: str, schema: str) -> Callable[[qlflow.Runtime], dict[str, int]]:
    def relations(rt: qlflow.Runtime) -> dict[str, int]:
        # every table, index and TOAST relation of the schema, after size()'s VACUUM
        with psycopg.connect(base, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT c.relname, pg_relation_size(c.oid) FROM pg_class c "
                "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s "
                "AND c.relkind IN ('r', 'i') UNION ALL "
                "SELECT 'toast:' || c.relname, pg_total_relation_size(c.reltoastrelid) "
                "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname = %s AND c.relkind = 'r' AND c.reltoastrelid <> 0",
                (schema, schema),
            ).fetchall()
        return {str(name): int(total) for name, total in rows}

    return relations


def pg_size(base: str, schema: str) -> Callable[[qlflow.Runtime], int]:
    def size(rt: qlflow.Runtime) -> int:
        with psycopg.connect(base, autocommit=True) as conn:
            tables = [
                row[0]
                for row in conn.execute(
                    "SELECT tablename FROM pg_tables WHERE schemaname = %s", (schema,)
                )
            ]
            for table in tables:  # what autovacuum does in the background
                conn.execute(f'VACUUM "{schema}"."{table}"')
            row = conn.execute(
                "SELECT COALESCE(SUM(pg_total_relation_size(format('%%I.%%I', schemaname, "
                "tablename))), 0) FROM pg_tables WHERE schemaname = %s",
                (schema,),
            ).fetchone()
            # rows VACUUM could not remove: another session's snapshot still sees them
            dead = conn.execute(
                "SELECT COALESCE(SUM(n_dead_tup), 0) FROM pg_stat_user_tables "
                "WHERE schemaname = %s",
                (schema,),
            ).fetchone()
        print(f"dead rows left by VACUUM: {dead[0] if dead else 0}", file=sys.stderr)
        return int(row[0]) if row else 0

    return size


def render(results: dict[str, Any], console: Console) -> None:
    keep, days = results["keep_days"], results["days"]
    table = Table(
        title=f"{days} simulated days of a 2-step schedule, retention {keep} days "
        f"({results['every_minutes']}-minute cadence)"
    )
    columns = (
        "store", "Runs/day", f"size day {keep}", f"size day {days}", "size ratio",
        f"cycle ms day {keep}", f"cycle ms day {days}", "cycle ratio", "CPU ratio",
        "Runs removed", "Runs/batch", "batch ms/Run", "verify",
    )  # fmt: skip
    for column in columns:
        table.add_column(column, justify="right")
    for dialect, row in results["dialects"].items():
        table.add_row(
            dialect, str(row["runs_per_day"]), f"{row['size_at_keep_days'] / 1e6:.2f} MB",
            f"{row['size_at_end'] / 1e6:.2f} MB", f"{row['size_ratio']:.2f}",
            f"{row['cycle_ms_median_at_keep_days']:.1f}", f"{row['cycle_ms_median_at_end']:.1f}",
            f"{row['cycle_ratio']:.2f}", f"{row['cycle_cpu_ratio'] or 0:.2f}",
            str(row["runs_removed"]), f"{row['batch_runs_median'] or 0:g}",
            "-" if row["batch_ms_per_run_median"] is None
            else f"{row['batch_ms_per_run_median']:.2f}",
            "ok" if row["verify_ok"] else "FAILED",
        )  # fmt: skip
    console.print(table)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m bench.retention", description=__doc__)
    parser.add_argument("--days", type=int, default=90)
    parser.add_argument("--keep-days", type=int, default=30)
    parser.add_argument("--every-minutes", type=int, default=1)
    parser.add_argument("--pg", default=os.environ.get("QLFLOW_TEST_PG_URL"))
    parser.add_argument("--no-sqlite", action="store_true")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where the JSON goes")
    parser.add_argument(
        "--no-reclaim", action="store_true", help="the policy never reclaims (VACUUM)"
    )
    parser.add_argument(
        "--pg-async-commit",
        action="store_true",
        help="PostgreSQL sessions commit without waiting for the WAL flush "
        "(synchronous_commit=off): the flush's wait does not grow with the store, so "
        "the sizes and the cycle's ratio measure the same, in a fraction of the time",
    )
    parser.add_argument("--smoke", action="store_true", help="3 days, keep 1, hourly")
    args = parser.parse_args(argv)
    if args.smoke:
        args.days, args.keep_days, args.every_minutes = 3, 1, 60
    results: dict[str, Any] = {
        "days": args.days,
        "keep_days": args.keep_days,
        "every_minutes": args.every_minutes,
        "pg_synchronous_commit": "off" if args.pg_async_commit else "on",
        "dialects": {},
    }
    shape = (args.days, args.keep_days, args.every_minutes)
    if not args.no_sqlite:
        with tempfile.TemporaryDirectory() as scratch:
            path = Path(scratch) / "retention.db"
            results["dialects"]["sqlite"] = bench_store(
                f"sqlite:///{path}",
                *shape,
                sqlite_size(path),
                sqlite_relations(path),
                not args.no_reclaim,
            )
    if args.pg:
        schema = f"bench_retention_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(args.pg, autocommit=True) as conn:
            conn.execute(f'CREATE SCHEMA "{schema}"')
        try:
            results["dialects"]["postgresql"] = bench_store(
                _pg_schema_url(args.pg, schema, async_commit=args.pg_async_commit),
                *shape,
                pg_size(args.pg, schema),
                pg_relations(args.pg, schema),
                not args.no_reclaim,
            )
        finally:
            with psycopg.connect(args.pg, autocommit=True) as conn:
                conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
    args.out.parent.mkdir(exist_ok=True)
    args.out.write_bytes(orjson.dumps(results, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS))
    render(results, Console())
    return results


if __name__ == "__main__":
    main()
