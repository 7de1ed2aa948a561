"""The rerun of the last step of a long chain: records in its one commit and its time.

    python -m bench.rerun [--steps 128] [--rounds 5] [--pg URL] [--smoke]

A chain of `--steps` steps runs with its last step failing; then `rt.rerun` admits a
new Run that reuses every other step (docs/DESIGN.md, "Reruns"). The table gives,
per store, the records the rerun's commit appended (admission, creations, reuses,
the claim of the step that runs), the median wall time of `rt.rerun` (each round
reruns the source again with a new key), and whether the step could be leased at once
(no cycle between). Results go to bench/results/rerun.json. PostgreSQL runs when
--pg (or QLFLOW_TEST_PG_URL) is set.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence

import orjson
import psycopg
from rich.console import Console
from rich.table import Table

import qlflow
from bench.output import results_path
from bench.rebuild import _pg_schema_url
from bench.snapshots import chain_manifest

RESULTS = results_path("rerun")
T0 = 1_700_000_000_000


def _fail_last(rt: qlflow.Runtime, run_id: str, steps: int) -> None:
    last = f"s{steps - 1:03d}"
    for _ in range(steps * 2 + 4):
        rt.cycle(now_ms=T0 + 1)
        leases = rt.lease_attempts("bench", limit=8, now_ms=T0 + 1, run_id=run_id)
        if not leases:
            if rt.get_run(run_id).status != "running":
                return
            continue
        for lease in leases:
            lease = rt.mark_running(lease, now_ms=T0 + 1)
            outcome = "failed" if lease.step_key == last else "succeeded"
            rt.complete(lease, outcome, output={"at": lease.step_key}, now_ms=T0 + 1)
    raise AssertionError("the chain did not end")


def bench_store(url: str, steps: int, rounds: int) -> dict:
    with qlflow.open(url) as rt:
        rt.publish(chain_manifest(steps), now_ms=T0)
        source = rt.start("bench", "chain", admission_key="source", now_ms=T0).run_id
        _fail_last(rt, source, steps)
        times, records, leased_at_once = [], [], []
        for n in range(rounds):
            before = len(rt.events())
            started = time.perf_counter()
            receipt = rt.rerun(source, admission_key=f"rerun-{n}", now_ms=T0 + 2)
            times.append((time.perf_counter() - started) * 1000)
            records.append(len(rt.events()) - before)
            lease = rt.lease_attempts("bench", limit=1, now_ms=T0 + 2, run_id=receipt.run_id)
            leased_at_once.append(bool(lease))
        view = rt.get_run(receipt.run_id)
        reused = sum(1 for step in view.steps.values() if step.reused_from is not None)
    return {
        "records_in_commit": max(records),
        "reused_steps": reused,
        "rerun_ms_median": round(statistics.median(times), 2),
        "rerun_ms_max": round(max(times), 2),
        "leased_at_once": all(leased_at_once),
    }


def render(results: dict, console: Console) -> None:
    table = Table(title=f"rerun of the last step of a {results['steps']}-step chain")
    for column in ("store", "reused steps", "records in the commit", "rerun ms (median)",
                   "rerun ms (max)", "leased at once"):  # fmt: skip
        table.add_column(column, justify="right")
    for dialect, row in results["dialects"].items():
        table.add_row(
            dialect, str(row["reused_steps"]), str(row["records_in_commit"]),
            f"{row['rerun_ms_median']:.1f}", f"{row['rerun_ms_max']:.1f}",
            "yes" if row["leased_at_once"] else "NO",
        )  # fmt: skip
    console.print(table)


def _with_pg_schema(base: str, run: Callable[[str], dict]) -> dict:
    schema = f"bench_rerun_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    try:
        return run(_pg_schema_url(base, schema))
    finally:
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


def main(argv: Sequence[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m bench.rerun", description=__doc__)
    parser.add_argument("--steps", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--pg", default=os.environ.get("QLFLOW_TEST_PG_URL"))
    parser.add_argument("--smoke", action="store_true", help="an 8-step chain, 2 rounds")
    args = parser.parse_args(argv)
    if args.smoke:
        args.steps, args.rounds = 8, 2
    results: dict = {"steps": args.steps, "rounds": args.rounds, "dialects": {}}
    with tempfile.TemporaryDirectory() as scratch:
        results["dialects"]["sqlite"] = bench_store(
            f"sqlite:///{scratch}/rerun.db", args.steps, args.rounds
        )
    if args.pg:
        results["dialects"]["postgresql"] = _with_pg_schema(
            args.pg, lambda url: bench_store(url, args.steps, args.rounds)
        )
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_bytes(orjson.dumps(results, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS))
    render(results, Console())
    return results


if __name__ == "__main__":
    main()
