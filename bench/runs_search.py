"""The runs search (`Runtime.runs`, `qlflow runs`) over many Runs, with and without its
indexes (projections.runs, schema step 2), on SQLite and PostgreSQL.

    python -m bench.runs_search [--runs 100000] [--rounds 25] [--pg URL] [--quick]

Seeding (not measured): `--runs` rows inserted straight into the `runs` read model
(the search reads only that table): three packages, two workflows each, admitted 600
ms apart, 70% succeeded, 12% failed, 8% cancelled, 10% running. Then each search
variant — the newest page, by status, by package and workflow, a one-hour window, an
id prefix, a deep page (keyset cursor 90% down), a count of a filter — is run
`--rounds` times after two warm-ups through `Runtime.runs` / `count_runs`, and its
plan is read with EXPLAIN; then the indexes are dropped and the same is measured
again. The figure is the median in ms. Prints a table per store and writes
bench/results/runs_search.json.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from typing import Any

import orjson
from rich.console import Console
from rich.table import Table

import qlflow
from bench.output import results_path
from projections.run_search import RunCursor, RunFilter, list_sql
from projections.runs import WINDOW_COLUMNS
from projections.views import _RUN_COLUMNS

RESULTS = results_path("runs_search")
T0 = 1_700_000_000_000
SPACING_MS = 600
PACKAGES = ("backup", "etl", "reports")
WORKFLOWS = ("nightly", "hourly")
FATES = (("succeeded", 70), ("failed", 12), ("cancelled", 8), ("running", 10))
INDEXES = ("runs_newest", "runs_status_newest", "runs_package_newest", "runs_workflow_newest")
COLUMNS = (
    "run_id, package, workflow_key, publication_id, plan_digest, admission_key, status, "
    "version, steps_version, step_count, open_steps, admitted_at_ms, timeout_ms, deadline_ms, "
    "cancel_requested_at_ms, cancel_reason, result_code, error_code, terminal_at_ms, "
    + ", ".join(WINDOW_COLUMNS)
)


def _fate(number: int) -> str:
    slot = number % 100
    for status, share in FATES:
        if slot < share:
            return status
        slot -= share
    return "succeeded"


def _rows(count: int) -> list[tuple[Any, ...]]:
    rows = []
    for number in range(count):
        run_id = "run:" + hashlib.sha256(b"bench-%d" % number).hexdigest()[:32]
        status = _fate(number)
        admitted = T0 + number * SPACING_MS
        ended = None if status == "running" else admitted + 900
        code = {"failed": "workflow_step_failed", "cancelled": "workflow_cancelled"}.get(status)
        rows.append(
            (
                run_id,
                PACKAGES[number % 3],
                WORKFLOWS[(number // 3) % 2],
                f"pub-{number % 3}",
                "sha256:0",
                None,
                status,
                5,
                4,
                2,
                0 if ended else 1,
                admitted,
                None,
                None,
                admitted + 500 if status == "cancelled" else None,
                "user" if status == "cancelled" else None,
                code,
                code,
                ended,
                *(None,) * len(WINDOW_COLUMNS),  # the bench's Runs have no cycle work
            )
        )
    return rows


def _seed(rt: qlflow.Runtime, count: int) -> None:
    rows = _rows(count)
    marks = ", ".join("?" * len(rows[0]))
    for start in range(0, len(rows), 5000):
        with rt.store.transaction() as tx:
            tx.executemany(
                f"INSERT INTO runs ({COLUMNS}) VALUES ({marks})", rows[start : start + 5000]
            )


def _variants(count: int) -> dict[str, tuple[RunFilter, RunCursor | None, bool]]:
    """name -> (filter, before cursor, count instead of list)."""
    deep = int(count * 0.9)
    deep_id = "run:" + hashlib.sha256(b"bench-%d" % (count - 1 - deep)).hexdigest()[:32]
    window = T0 + (count // 2) * SPACING_MS
    prefix = hashlib.sha256(b"bench-7").hexdigest()[:6]
    return {
        "newest 50": (RunFilter(), None, False),
        "status failed": (RunFilter(status="failed"), None, False),
        "package + workflow": (RunFilter(package="etl", workflow="hourly"), None, False),
        "one-hour window": (RunFilter(since_ms=window, until_ms=window + 3_600_000), None, False),
        "id prefix (6 hex)": (RunFilter(id_prefix=prefix), None, False),
        "deep page (90%)": (
            RunFilter(),
            RunCursor(T0 + (count - 1 - deep) * SPACING_MS, deep_id),
            False,
        ),
        "count status running": (RunFilter(status="running"), None, True),
    }


def _call(
    rt: qlflow.Runtime, run_filter: RunFilter, before: RunCursor | None, count: bool
) -> Callable[[], object]:
    filters = {
        "package": run_filter.package,
        "workflow": run_filter.workflow,
        "status": run_filter.status,
        "since_ms": run_filter.since_ms,
        "until_ms": run_filter.until_ms,
        "id_prefix": run_filter.id_prefix,
    }
    if count:
        return lambda: rt.count_runs(**filters)
    return lambda: rt.runs(limit=50, before=before, **filters)


def _median_ms(call: Callable[[], object], rounds: int) -> float:
    call()
    call()
    samples = []
    for _ in range(rounds):
        started = time.perf_counter()
        call()
        samples.append((time.perf_counter() - started) * 1000)
    return statistics.median(samples)


def _plan(rt: qlflow.Runtime, run_filter: RunFilter, before: RunCursor | None, count: bool) -> str:
    sql, params = list_sql(_RUN_COLUMNS, run_filter, before=before, limit=50)
    if count:
        where, params = run_filter.where()
        clause = f"WHERE {' AND '.join(where)}" if where else ""
        sql = f"SELECT COUNT(*) FROM (SELECT 1 FROM runs {clause} LIMIT ?) AS m"
        params = [*params, 10_001]
    if rt.store.dialect == "sqlite":
        rows = rt.store.query("EXPLAIN QUERY PLAN " + sql, params)
        return "; ".join(str(row[-1]) for row in rows)
    rows = rt.store.query("EXPLAIN (COSTS OFF) " + sql, params)
    nodes = [str(row[0]).strip().removeprefix("->  ") for row in rows]
    details = ("Filter", "Index Cond", "Recheck", "Sort Key")
    return "; ".join(node for node in nodes if not node.startswith(details))


def _measure(rt: qlflow.Runtime, count: int, rounds: int) -> list[dict[str, Any]]:
    found = []
    for name, (run_filter, before, counting) in _variants(count).items():
        call = _call(rt, run_filter, before, counting)
        found.append(
            {
                "variant": name,
                "ms": round(_median_ms(call, rounds), 3),
                "plan": _plan(rt, run_filter, before, counting),
            }
        )
    return found


def _bench(url: str, count: int, rounds: int) -> dict[str, Any]:
    with qlflow.open(url) as rt:
        _seed(rt, count)
        with rt.store.transaction() as tx:
            tx.execute("ANALYZE")
        indexed = _measure(rt, count, rounds)
        with rt.store.transaction() as tx:
            for index in INDEXES:
                tx.execute(f"DROP INDEX {index}")
        bare = _measure(rt, count, rounds)
        return {"store": rt.store.dialect, "runs": count, "indexed": indexed, "without": bare}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=25)
    parser.add_argument("--pg", default=os.environ.get("QLFLOW_TEST_PG_URL"))
    parser.add_argument("--quick", action="store_true", help="10,000 Runs, 5 rounds")
    parser.add_argument(
        "--smoke", action="store_true", help="50 Runs, one round: does it still run"
    )
    args = parser.parse_args()
    count, rounds = (10_000, 5) if args.quick else (args.runs, args.rounds)
    if args.smoke:
        count, rounds = 50, 1
    results = []
    with tempfile.TemporaryDirectory() as folder:
        results.append(_bench(f"sqlite:///{folder}/bench.db", count, rounds))
    if args.pg:
        results.append(_bench_pg(args.pg, count, rounds))
    console = Console()
    for result in results:
        table = Table(title=f"runs search, {result['store']}, {result['runs']:,} Runs (median ms)")
        for column in ("variant", "indexed", "without index", "plan (indexed)"):
            table.add_column(column, overflow="fold")
        for with_index, without in zip(result["indexed"], result["without"], strict=True):
            table.add_row(
                with_index["variant"],
                f"{with_index['ms']:.2f}",
                f"{without['ms']:.2f}",
                with_index["plan"],
            )
        console.print(table)
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_bytes(orjson.dumps(results, option=orjson.OPT_INDENT_2))


def _bench_pg(server_url: str, count: int, rounds: int) -> dict[str, Any]:
    import psycopg

    from eventstore.url import with_search_path

    schema = f"bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    try:
        return _bench(with_search_path(server_url, schema), count, rounds)
    finally:
        with psycopg.connect(server_url, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")


if __name__ == "__main__":
    main()
