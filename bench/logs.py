"""What a step log costs the store: one flush (`Runtime.append_log`) as a log grows
past its cap, and a burst of output, on SQLite and PostgreSQL.

    python -m bench.logs [--flushes 3000] [--pg URL]

For each store and cap (edge 64 KiB, standalone/cluster 1 MiB): `--flushes` appends
of one 80-byte line each (what a step printing a line a second sends) to a fresh
log, within its head, timed one by one; then a second log gets twice its cap in
256 KiB appends (a chatty step: the time per MiB) and the same flushes again, each
now also dropping from the tail — medians, so a flush that grew with the log would
show. Reading the last lines of the capped log is timed last. Prints a table,
writes bench/results/logs.json.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import uuid
from typing import Any

import orjson
from rich.console import Console
from rich.table import Table

import qlflow
from bench.runs_search import RESULTS as SEARCH_RESULTS

RESULTS = SEARCH_RESULTS.parent / "logs.json"
LINE = b"2024-05-01 22:00:00 step output line that is about eighty bytes long .........\n"


def _timed_flushes(rt: qlflow.Runtime, attempt: str, flushes: int) -> list[float]:
    samples = []
    for number in range(flushes):
        started = time.perf_counter()
        rt.append_log(attempt, [("stdout", number, LINE)])
        samples.append((time.perf_counter() - started) * 1000)
    return samples


def _bench(url: str, profile: str, flushes: int) -> dict[str, Any]:
    with qlflow.open(url, profile) as rt:
        cap = rt.log_cap_bytes
        fresh = f"wta:{uuid.uuid4().hex}"
        under = _timed_flushes(rt, fresh, flushes)  # stays within the head
        full = f"wta:{uuid.uuid4().hex}"
        chunk = LINE * (256 * 1024 // len(LINE))
        started = time.perf_counter()
        appends = max(2, 2 * cap // len(chunk) + 1)  # well past the cap
        for number in range(appends):
            rt.append_log(full, [("stdout", number, chunk)])
        written = appends * len(chunk)
        per_mib = (time.perf_counter() - started) * 1000 / (written / 2**20)
        past = _timed_flushes(rt, full, flushes)  # each one drops from the tail too
        started = time.perf_counter()
        lines = rt.last_log_lines(full, 10)
        tail_ms = (time.perf_counter() - started) * 1000
        return {
            "store": rt.store.dialect,
            "profile": profile,
            "cap_bytes": cap,
            "flushes": flushes,
            "under_cap_ms": statistics.median(under),
            "past_cap_ms": statistics.median(past),
            "burst_ms_per_mib": per_mib,
            "last_lines_ms": tail_ms,
            "lines": len(lines),
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--flushes", type=int, default=300)
    parser.add_argument("--pg", default=os.environ.get("QLFLOW_TEST_PG_URL"))
    parser.add_argument("--smoke", action="store_true", help="5 flushes: does it still run")
    args = parser.parse_args()
    if args.smoke:
        args.flushes = 5
    results = []
    with tempfile.TemporaryDirectory() as folder:
        for profile in ("edge", "standalone"):
            results.append(_bench(f"sqlite:///{folder}/{profile}.db", profile, args.flushes))
    if args.pg:
        results.append(_bench_pg(args.pg, args.flushes))
    table = Table(title="step logs in the store (median ms)")
    columns = ("store", "profile", "cap", "flush <cap", "flush >cap", "ms/MiB burst", "last lines")
    for column in columns:
        table.add_column(column, justify="right")
    for r in results:
        table.add_row(
            r["store"],
            r["profile"],
            f"{r['cap_bytes'] // 1024} KiB",
            f"{r['under_cap_ms']:.2f}",
            f"{r['past_cap_ms']:.2f}",
            f"{r['burst_ms_per_mib']:.1f}",
            f"{r['last_lines_ms']:.2f}",
        )
    Console().print(table)
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_bytes(orjson.dumps(results, option=orjson.OPT_INDENT_2))


def _bench_pg(server_url: str, flushes: int) -> dict[str, Any]:
    import psycopg

    from eventstore.url import with_search_path

    schema = f"bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    try:
        return _bench(with_search_path(server_url, schema), "cluster", flushes)
    finally:
        with psycopg.connect(server_url, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")


if __name__ == "__main__":
    main()
