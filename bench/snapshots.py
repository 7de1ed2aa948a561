"""What a unit of a long Run costs with and without Run snapshots (issue 18).

    python -m bench.snapshots [--steps 128] [--pg URL] [--every 16 32 64]

Drives a `--steps`-step chain through the public API (lease with start=True,
complete) once per snapshot interval (`--every`; 0 = no snapshots), then, before
the last Step completes, times the read and fold of the Run as a worker's unit does
it (`actors.loading.read_run_streams`, best of 30) and counts the records it read.
Also the whole chain's wall time per interval. Prints a table and writes
bench/results/snapshots.json. PostgreSQL runs when --pg (or QLFLOW_TEST_PG_URL) is
given, in a fresh schema dropped afterwards.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import uuid
from collections.abc import Sequence

import orjson
import psycopg
from rich.console import Console
from rich.table import Table

import qlflow
from actors.loading import read_run_streams
from bench.output import results_path
from bench.rebuild import _pg_schema_url
from projections import snapshots

RESULTS = results_path("snapshots")
T0 = 1_700_000_000_000
NEVER = 10**12  # an interval no Run reaches: no snapshots


def chain_manifest(steps: int) -> dict:
    keys = [f"s{i:03d}" for i in range(steps)]
    table = {
        "steps": [{"key": k, "task": "t", "needs": keys[i - 1 : i]} for i, k in enumerate(keys)]
    }
    return {
        "package": {"name": "bench", "publisher": "acme"},
        "tasks": {"t": {"command": ["true"]}},
        "workflows": {"chain": table},
    }


def one_setting(url: str, steps: int, every: int) -> dict:
    snapshots.SNAPSHOT_EVERY = every or NEVER
    rt = qlflow.open(url)
    try:
        rt.publish(chain_manifest(steps), now_ms=T0)
        run_id = rt.start("bench", "chain", admission_key="k", now_ms=T0).run_id
        started = time.perf_counter()
        done, last = 0, None
        while done < steps:
            rt.cycle(now_ms=T0 + 1)
            for lease in rt.lease_attempts("w", ttl_ms=60_000, now_ms=T0 + 1, start=True):
                if done == steps - 1:
                    last = lease
                    break
                rt.complete(lease, "succeeded", now_ms=T0 + 1)
                done += 1
            if last is not None:
                break
        chain_s = time.perf_counter() - started
        timings = []
        with rt.store.session() as tx:
            for _ in range(30):
                began = time.perf_counter()
                read = read_run_streams(tx, run_id)
                aggregate = read.fold()
                timings.append(time.perf_counter() - began)
        assert last is not None
        started = time.perf_counter()
        rt.complete(last, "succeeded", now_ms=T0 + 1)
        rt.cycle(now_ms=T0 + 2)
        chain_s += time.perf_counter() - started
        return {
            "every": every,
            "events_in_run": aggregate.version
            + aggregate.steps_version
            + sum(aggregate.lease_versions.values()),
            "records_read": read.records_read(),
            "from_snapshot": read.base is not None,
            "load_ms": min(timings) * 1000,
            "chain_s": chain_s,
            "units_per_s": 0 if not chain_s else steps / chain_s,
        }
    finally:
        rt.close()
        snapshots.SNAPSHOT_EVERY = 32


def bench_store(url_for, steps: int, intervals: Sequence[int]) -> list[dict]:
    return [one_setting(url_for(every), steps, every) for every in intervals]


def render(results: dict, console: Console) -> None:
    table = Table(title=f"the last Step's unit of a {results['steps']}-step chain")
    columns = ("store", "snapshot every", "events in Run", "records read", "read+fold ms",
               "chain s")  # fmt: skip
    for column in columns:
        table.add_column(column, justify="right")
    for dialect, rows in results["dialects"].items():
        for r in rows:
            table.add_row(
                dialect,
                str(r["every"] or "never"),
                f"{r['events_in_run']:,}",
                f"{r['records_read']:,}",
                f"{r['load_ms']:.2f}",
                f"{r['chain_s']:.2f}",
            )
    console.print(table)


def main(argv: Sequence[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m bench.snapshots", description=__doc__)
    parser.add_argument("--steps", type=int, default=128)
    parser.add_argument("--every", type=int, nargs="+", default=[0, 16, 32, 64])
    parser.add_argument("--pg", default=os.environ.get("QLFLOW_TEST_PG_URL"))
    parser.add_argument(
        "--smoke", action="store_true", help="an 8-step chain, never and every 4: does it still run"
    )
    args = parser.parse_args(argv)
    if args.smoke:
        args.steps, args.every = 8, [0, 4]
    results: dict = {"steps": args.steps, "dialects": {}}
    with tempfile.TemporaryDirectory() as scratch:
        results["dialects"]["sqlite"] = bench_store(
            lambda every: f"sqlite:///{scratch}/every-{every}.db", args.steps, args.every
        )
    if args.pg:
        schemas = []

        def pg_url(every: int) -> str:
            schema = f"bench_snap_{uuid.uuid4().hex[:8]}"
            schemas.append(schema)
            with psycopg.connect(args.pg, autocommit=True) as conn:
                conn.execute(f'CREATE SCHEMA "{schema}"')
            return _pg_schema_url(args.pg, schema)

        try:
            results["dialects"]["postgresql"] = bench_store(pg_url, args.steps, args.every)
        finally:
            with psycopg.connect(args.pg, autocommit=True) as conn:
                for schema in schemas:
                    conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_bytes(orjson.dumps(results, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS))
    render(results, Console())
    return results


if __name__ == "__main__":
    main()
