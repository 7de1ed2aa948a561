"""Dormant schedules cost nothing: a cycle with 10,000 schedules none of which is due
against one with 10 (docs/DESIGN.md, "Schedules").

    python -m bench.schedules [--pg URL] [--cycles N] [--schedules N] [--held]

`--held` measures held schedules too: every-minute crons with overlap `queue` whose
first Run is still running, so every one is due by its cursor and held by its
overlap; the cycle must read none of them (docs/DESIGN.md, "Schedules", overlap).

Each store gets packages of 100 schedules each (yearly crons, so none is due), is
armed by cycles, then measured over `--cycles` idle cycles at an instant when no
schedule is due. Figures per cycle: median and p95 wall ms; on SQLite the SQL
statements the cycle ran and the virtual-machine instructions SQLite executed for
them (work done, whatever the table sizes); on PostgreSQL the rows of the
`schedules` table the cycle read (sequential and index fetches, from
pg_stat_user_tables). Writes a table to stdout and JSON to bench/results/.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson

import qlflow
from actors.supervisor import Cycle
from bench.output import results_dir

RESULTS = results_dir()
MINUTE = 60_000
PUBLISHED_AT = 1_714_521_600_000  # 2024-05-01T00:00Z; every cron below fires on 1 January
PER_PACKAGE = 100
SEED_PAGE = 2_000  # schedules armed per seeding page (the profile's pages are for serving)


def manifest(package: int, count: int, held: bool = False) -> dict[str, Any]:
    if held:  # due every minute, each told apart by its params
        entries = [
            {"cron": "* * * * *", "timezone": "UTC", "overlap": "queue", "params": {"n": m}}
            for m in range(count)
        ]
    else:  # yearly: never due while measured
        crons = [f"{m % 60} {3 + m // 60} 1 1 *" for m in range(count)]
        entries = [{"cron": cron, "timezone": "UTC"} for cron in crons]
    flow: dict[str, Any] = {"steps": [{"key": "job", "task": "job"}], "schedules": entries}
    if held:
        flow["params"] = {"n": {"type": "integer", "default": 0}}
    return {
        "package": {"name": f"p{package:04d}", "publisher": "bench"},
        "tasks": {"job": {"command": ["true"]}},
        "workflows": {"flow": flow},
    }


def seed(rt: qlflow.Runtime, schedules: int, held: bool = False) -> None:
    for package in range((schedules + PER_PACKAGE - 1) // PER_PACKAGE):
        count = min(PER_PACKAGE, schedules - package * PER_PACKAGE)
        rt.publish(manifest(package, count, held), now_ms=PUBLISHED_AT)
    arming = Cycle(rt._authority, rt.profile.page_size, 1, SEED_PAGE, 300_000)
    while arming.run(PUBLISHED_AT + MINUTE).schedule.changed:
        pass
    armed = [view for view in rt.schedules() if view.status == "active"]
    assert len(armed) == schedules, (len(armed), schedules)
    if held:  # the first occurrence fires; its Run, never leased, keeps running
        while arming.run(PUBLISHED_AT + 2 * MINUTE).schedule.changed:
            pass
        fired = [view for view in rt.schedules() if view.last_run_id is not None]
        assert len(fired) == schedules, (len(fired), schedules)


@contextmanager
def sqlite_counters(rt: qlflow.Runtime) -> Iterator[dict[str, int]]:
    """Count the statements and VM instructions (in tens) on the store's connection."""
    counts = {"statements": 0, "vm_steps": 0}
    conn = rt.store._conn  # type: ignore[attr-defined]

    def traced(_sql: str) -> None:
        counts["statements"] += 1

    def stepped() -> int:
        counts["vm_steps"] += 10
        return 0

    conn.set_trace_callback(traced)
    conn.set_progress_handler(stepped, 10)
    try:
        yield counts
    finally:
        conn.set_trace_callback(None)
        conn.set_progress_handler(None, 10)


def pg_rows_read(rt: qlflow.Runtime) -> int:
    rows = rt.store.query(
        """SELECT coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0)
           FROM pg_stat_user_tables WHERE relname = 'schedules'
             AND schemaname = current_schema()"""
    )
    return int(rows[0][0]) if rows else 0


def measure(url: str, schedules: int, cycles: int, held: bool = False) -> dict[str, Any]:
    rt = qlflow.open(url)
    try:
        started = time.perf_counter()
        seed(rt, schedules, held)
        seeded_s = time.perf_counter() - started
        now = PUBLISHED_AT + 3 * MINUTE
        rt.cycle(now_ms=now)  # warm
        times = []
        work: list[int] = []
        statements: list[int] = []
        for index in range(cycles):
            at = now + (index + 1) * MINUTE
            if rt.store.dialect == "sqlite":
                with sqlite_counters(rt) as counts:
                    began = time.perf_counter()
                    result = rt.cycle(now_ms=at)
                    times.append((time.perf_counter() - began) * 1000)
                work.append(counts["vm_steps"])
                statements.append(counts["statements"])
            else:
                rt.store.query("SELECT pg_stat_force_next_flush()")
                before = pg_rows_read(rt)
                began = time.perf_counter()
                result = rt.cycle(now_ms=at)
                times.append((time.perf_counter() - began) * 1000)
                rt.store.query("SELECT pg_stat_force_next_flush()")
                rt.store.query("SELECT pg_stat_clear_snapshot()")
                work.append(pg_rows_read(rt) - before)
            assert result.schedule.scanned == 0 and result.changed == 0
        times.sort()
        return {
            "store": rt.store.dialect,
            "schedules": schedules,
            "held": held,
            "cycles": cycles,
            "seed_s": round(seeded_s, 1),
            "median_ms": round(statistics.median(times), 3),
            "p95_ms": round(times[int(0.95 * (len(times) - 1))], 3),
            "statements_per_cycle": statistics.median(statements) if statements else None,
            "work_per_cycle": statistics.median(work),
            "work_unit": "vm instructions" if statements else "schedules rows read",
        }
    finally:
        rt.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--pg",
        default=os.environ.get("QLFLOW_TEST_PG_URL"),
        help="also measure on this PostgreSQL server URL",
    )
    parser.add_argument("--cycles", type=int, default=50)
    parser.add_argument("--schedules", type=int, default=10_000)
    parser.add_argument(
        "--held", action="store_true", help="also schedules due but held by overlap queue"
    )
    parser.add_argument(
        "--smoke", action="store_true", help="20 schedules, 2 cycles: does it still run"
    )
    args = parser.parse_args(argv)
    if args.smoke:
        args.schedules, args.cycles = 20, 2
    kinds = [(count, False) for count in (10, args.schedules)]
    if args.held:
        kinds += [(count, True) for count in (10, args.schedules)]
    results = []
    with tempfile.TemporaryDirectory() as folder:
        for count, held in kinds:
            url = f"sqlite:///{Path(folder) / f'schedules-{count}-{held}.db'}"
            results.append(measure(url, count, args.cycles, held))
    if args.pg:
        import psycopg

        from eventstore.url import with_search_path

        for count, held in kinds:
            schema = f"bench_{uuid.uuid4().hex[:12]}"
            with psycopg.connect(args.pg, autocommit=True) as conn:
                conn.execute(f"CREATE SCHEMA {schema}")
            try:
                url = with_search_path(args.pg, schema)
                results.append(measure(url, count, args.cycles, held))
            finally:
                with psycopg.connect(args.pg, autocommit=True) as conn:
                    conn.execute(f"DROP SCHEMA {schema} CASCADE")
    header = ("store", "schedules", "held", "median ms", "p95 ms", "statements", "work", "unit")
    print(" | ".join(header))
    for row in results:
        print(
            " | ".join(
                str(value)
                for value in (
                    row["store"],
                    row["schedules"],
                    "yes" if row["held"] else "no",
                    row["median_ms"],
                    row["p95_ms"],
                    row["statements_per_cycle"] if row["statements_per_cycle"] else "-",
                    row["work_per_cycle"],
                    row["work_unit"],
                )
            )
        )
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / "schedules.json"
    out.write_bytes(orjson.dumps({"results": results}, option=orjson.OPT_INDENT_2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
