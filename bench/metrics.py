"""What metrics and traces cost: the per-call overhead with metrics on, the CPU per
Workflow with traces on, and a scrape on a store of 100,000 Runs, on SQLite and
PostgreSQL.

    python -m bench.metrics [--runs 100000] [--workflows 40] [--rounds 5] [--pg URL]

Per call: `--workflows` diamond Runs (a -> b, c -> d) driven in process through the
public API — start, then lease (with the start barrier) and complete every claimable
Attempt until the Runs end — timed per Workflow, in rounds that alternate metrics off
and on (`qlflow.metrics.instrument`), the median of `--rounds` each; and, free of a
shared machine's wall-clock noise, the metrics observer's own CPU per Workflow, timed
over the commits of such a workload. Traces: the same
workload's process CPU time per Workflow (every thread, the span thread included),
`qlflow.tracing` off and on with the SDK's TracerProvider and an exporter that drops
every span. Scrape: `--runs`
rows seeded straight into the `runs` read model (bench.runs_search's mix: 10%
running) and 300,000 ended Attempts plus 1,000 claimed and 200 running over five
Tasks into `attempts` (the gauges read only those tables), then `generate_latest`
with the gauges read on every scrape (`min_interval_s=0`), median of 25 after two
warm-ups. Prints a table and writes bench/results/metrics.json.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import tempfile
import time
import uuid
from typing import Any

import orjson
from prometheus_client import generate_latest
from rich.console import Console
from rich.table import Table

import qlflow
from bench.output import results_path
from bench.runs_search import _seed as seed_runs
from projections.runs_schema import ATTEMPTS
from qlflow import metrics

RESULTS = results_path("metrics")
T0 = 1_700_000_000_000
DIAMOND = {
    "package": {"name": "bench", "publisher": "acme"},
    "tasks": {key: {"command": ["true"]} for key in "abcd"},
    "workflows": {
        "diamond": {
            "steps": [
                {"key": "a", "task": "a"},
                {"key": "b", "task": "b", "needs": ["a"]},
                {"key": "c", "task": "c", "needs": ["a"]},
                {"key": "d", "task": "d", "needs": ["b", "c"]},
            ]
        }
    },
}


def _drive(rt: qlflow.Runtime, workflows: int, tag: str) -> float:
    """Seconds per Workflow for `workflows` diamonds, start to end."""
    began = time.perf_counter()
    for number in range(workflows):
        rt.start("bench", "diamond", admission_key=f"{tag}-{number}", now_ms=T0)
    while True:
        leases = rt.lease_attempts("w1", limit=64, now_ms=T0 + 1, start=True)
        if not leases:
            break
        rt.complete_many([qlflow.Completion(lease, "succeeded") for lease in leases],
                         now_ms=T0 + 2)  # fmt: skip
    return (time.perf_counter() - began) / workflows


def per_call(url: str, workflows: int, rounds: int) -> dict[str, float]:
    rt = qlflow.open(url)
    try:
        rt.publish(DIAMOND, now_ms=T0)
        _drive(rt, workflows, "warm")
        off: list[float] = []
        on: list[float] = []
        for round_number in range(rounds):
            off.append(_drive(rt, workflows, f"off{round_number}"))
            handle = metrics.instrument(rt)
            on.append(_drive(rt, workflows, f"on{round_number}"))
            handle.close()
        off_ms, on_ms = statistics.median(off) * 1000, statistics.median(on) * 1000
        return {"off_ms": off_ms, "on_ms": on_ms, "overhead_pct": (on_ms / off_ms - 1) * 100}
    finally:
        rt.close()


def observer_cost(url: str, workflows: int) -> dict[str, float]:
    """The metrics observer's CPU per Workflow, timed alone over the commits a workload
    made (free of the wall-clock noise of a shared machine), beside the Workflow's CPU."""
    rt = qlflow.open(url)
    try:
        rt.publish(DIAMOND, now_ms=T0)
        commits: list[Any] = []
        remove = rt.store.observers.on_commit(commits.append)
        began = time.process_time()
        _drive(rt, workflows, "observed")
        workflow_cpu = (time.process_time() - began) / workflows
        remove()
        runs = []
        for _ in range(7):
            began = time.process_time()
            for commit in commits:
                metrics._commit(commit)
            runs.append((time.process_time() - began) / workflows)
        observer = statistics.median(runs)
        return {
            "workflow_cpu_ms": workflow_cpu * 1000,
            "observer_us": observer * 1e6,
            "observer_pct": observer / workflow_cpu * 100,
        }
    finally:
        rt.close()


def _cpu_per_workflow(rt: qlflow.Runtime, workflows: int, tag: str, flush=None) -> float:
    began = time.process_time()  # every thread of the process: the tracing one too
    _drive(rt, workflows, tag)
    if flush is not None:
        flush()
    return (time.process_time() - began) / workflows


def traces(url: str, workflows: int, rounds: int) -> dict[str, float]:
    """CPU per Workflow with `qlflow.tracing` off and on (the SDK's TracerProvider, a
    simple span processor and an exporter that drops every span)."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

    from qlflow import tracing

    class Dropping(SpanExporter):
        def export(self, spans):  # type: ignore[no-untyped-def]
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(Dropping()))
    rt = qlflow.open(url)
    try:
        rt.publish(DIAMOND, now_ms=T0)
        _drive(rt, workflows, "warm")
        off: list[float] = []
        on: list[float] = []
        for round_number in range(rounds):
            off.append(_cpu_per_workflow(rt, workflows, f"off{round_number}"))
            runs = tracing.trace_runs(rt, tracer_provider=provider)
            on.append(_cpu_per_workflow(rt, workflows, f"on{round_number}", runs.flush))
            runs.close()
        off_ms, on_ms = statistics.median(off) * 1000, statistics.median(on) * 1000
        overhead = (on_ms / off_ms - 1) * 100
        return {"off_cpu_ms": off_ms, "on_cpu_ms": on_ms, "overhead_pct": overhead}
    finally:
        rt.close()


def _attempt_rows(history: int, queued: int, running: int) -> list[tuple[Any, ...]]:
    rows = []
    columns = ATTEMPTS.columns
    for number in range(history + queued + running):
        row = dict.fromkeys(columns)
        if number < history:
            status, lease = "succeeded", "completed"
        elif number < history + queued:
            status, lease = "claimed", None
        else:
            status, lease = "running", "leased"
        digest = hashlib.sha256(b"attempt-%d" % number).hexdigest()
        row.update(
            attempt_id=f"wta:{digest[:32]}",
            run_id=f"run:{digest[32:]}",
            step_key="s",
            step_run_id=f"wsr:{digest[:16]}",
            step_epoch=1,
            attempt_number=1,
            task_ref=f"etl@1#task{number % 5}",
            status=status,
            claimed_at_ms=T0 + number,
            claimed_position=number + 1,
            lease_status=lease,
            expires_at_ms=T0 + 10**12 if lease == "leased" else None,
            grant_opens_ms=T0 + number if status == "claimed" else None,  # claimable
        )
        rows.append(tuple(row[column] for column in columns))
    return rows


def scrape(url: str, runs: int) -> dict[str, float]:
    rt = qlflow.open(url)
    try:
        seed_runs(rt, runs)
        rows = _attempt_rows(min(300_000, runs * 3), 1_000, 200)
        marks = ", ".join("?" * len(ATTEMPTS.columns))
        for start in range(0, len(rows), 5000):
            with rt.store.transaction() as tx:
                tx.executemany(
                    f"INSERT INTO attempts ({', '.join(ATTEMPTS.columns)}) VALUES ({marks})",
                    rows[start : start + 5000],
                )
        with rt.store.transaction() as tx:
            tx.execute("ANALYZE")
        handle = metrics.instrument(rt, min_interval_s=0, clock=lambda: T0 + 10**9)
        times = []
        for number in range(27):
            began = time.perf_counter()
            body = generate_latest(metrics.registry())
            if number >= 2:
                times.append((time.perf_counter() - began) * 1000)
        handle.close()
        assert b'qlflow_runs{status="running"}' in body
        return {"median_ms": statistics.median(times), "max_ms": max(times)}
    finally:
        rt.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100_000)
    parser.add_argument("--workflows", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--pg", default=os.environ.get("QLFLOW_TEST_PG_URL"))
    parser.add_argument("--smoke", action="store_true", help="the smallest sizes (CI)")
    args = parser.parse_args()
    if args.smoke:
        args.runs, args.workflows, args.rounds = 200, 2, 1
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as folder:
        stores = {"sqlite": lambda name: f"sqlite:///{folder}/{name}.db"}
        if args.pg:
            stores["postgresql"] = lambda name: _pg_schema(args.pg, name)
        for kind, url_of in stores.items():
            results[kind] = {
                "per_call": per_call(url_of("calls"), args.workflows, args.rounds),
                "observer": observer_cost(url_of("observer"), args.workflows * 5),
                "traces": traces(url_of("traces"), args.workflows, args.rounds),
                "scrape": scrape(url_of("scrape"), args.runs),
            }
    table = Table(title=f"metrics: per Workflow (4-step diamond), scrape of {args.runs:,} Runs")
    columns = (
        "store", "off ms/wf", "metrics on", "overhead", "observer CPU", "CPU ms/wf",
        "traces on", "overhead",
        "scrape median", "scrape max",
    )  # fmt: skip
    for column in columns:
        table.add_column(column, justify="right")
    for kind, found in results.items():
        calls, traced, scraped = found["per_call"], found["traces"], found["scrape"]
        table.add_row(
            kind,
            f"{calls['off_ms']:.2f}",
            f"{calls['on_ms']:.2f}",
            f"{calls['overhead_pct']:+.1f}%",
            f"{found['observer']['observer_us']:.0f} us ({found['observer']['observer_pct']:.2f}%)",
            f"{traced['off_cpu_ms']:.2f}",
            f"{traced['on_cpu_ms']:.2f}",
            f"{traced['overhead_pct']:+.1f}%",
            f"{scraped['median_ms']:.1f} ms",
            f"{scraped['max_ms']:.1f} ms",
        )
    Console().print(table)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_bytes(orjson.dumps(results, option=orjson.OPT_INDENT_2))


def _pg_schema(base: str, name: str) -> str:
    """A fresh schema on `base` for one measurement."""
    import psycopg

    from eventstore.url import with_search_path

    schema = f"bench_metrics_{name}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    return with_search_path(base, schema)


if __name__ == "__main__":
    main()
