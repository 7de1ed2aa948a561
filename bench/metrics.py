"""What metrics and traces cost: the per-call overhead with metrics on, the CPU per
Workflow with traces on, and a scrape on a store of 100,000 Runs, on SQLite and
PostgreSQL.

    python -m bench.metrics [--runs 100000] [--workflows 40] [--rounds 5] [--pg URL]

Metrics: `--workflows` diamond Runs (a -> b, c -> d) driven in process through the
public API — start, then lease (with the start barrier) and complete every claimable
Attempt until the Runs end — batched (leases of 64, one `complete_many`) and per
call (one lease, one `complete`, as a user's loop), metrics off and on
(`qlflow.metrics.instrument`) in `--rounds` pairs whose order alternates: wall and
process CPU per Workflow, the overhead the median of the pairs' ratios. Free of a
shared machine's noise: the metrics observer's own CPU per Workflow, timed over the
commits of such a workload. Traces: the same pairs for process CPU per Workflow
(every thread, the span thread included), `qlflow.tracing` off and on with the SDK's
TracerProvider and an exporter that drops every span; and the tracer's own CPU per
Workflow (its commit observer and its thread making each Run's 9 spans, over the
replayed commits of a workload) beside the Workflow's CPU. Scrape: `--runs`
rows seeded straight into the `runs` read model (bench.runs_search's mix: 10%
running) and 300,000 ended Attempts plus 1,000 claimed and 200 running over five
Tasks into `attempts` (the gauges read only those tables), then `generate_latest`
with the gauges read on every scrape (`min_interval_s=0`), median of 25 after two
warm-ups. Prints three tables and writes bench/results/metrics.json.
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


def _drive(
    rt: qlflow.Runtime,
    workflows: int,
    tag: str,
    *,
    per_call: bool = False,
    finish: Callable[[], None] | None = None,
) -> tuple[float, float]:
    """Wall and CPU seconds per Workflow for `workflows` diamonds, start to end (and
    `finish()`: what waits for a thread's work). Batched: leases of up to 64 and one
    `complete_many`; per call, as a user's loop would: one lease and one `complete`."""
    began, began_cpu = time.perf_counter(), time.process_time()  # CPU: every thread
    for number in range(workflows):
        rt.start("bench", "diamond", admission_key=f"{tag}-{number}", now_ms=T0)
    while True:
        leases = rt.lease_attempts("w1", limit=1 if per_call else 64, now_ms=T0 + 1, start=True)
        if not leases:
            break
        if per_call:
            rt.complete(leases[0], "succeeded", now_ms=T0 + 2)
        else:
            rt.complete_many([qlflow.Completion(lease, "succeeded") for lease in leases],
                             now_ms=T0 + 2)  # fmt: skip
    if finish is not None:
        finish()
    return (time.perf_counter() - began) / workflows, (time.process_time() - began_cpu) / workflows


Switch = Callable[[], tuple[Callable[[], None] | None, Callable[[], None]]]


def _off_on(
    rt: qlflow.Runtime, workflows: int, rounds: int, switch_on: Switch, *, per_call: bool = False
) -> dict[str, float]:
    """The same workload off and on in `rounds` pairs, the pair's order alternating
    (so a drift of the machine's load favours neither side); the overhead is the
    median of each pair's ratio. `switch_on()` returns (finish, switch off)."""
    wall: dict[str, list[float]] = {"off": [], "on": []}
    cpu: dict[str, list[float]] = {"off": [], "on": []}
    for number in range(rounds):
        for side in ("off", "on") if number % 2 == 0 else ("on", "off"):
            finish, switch_off = switch_on() if side == "on" else (None, None)
            tag = f"{side}{number}{'p' if per_call else 'b'}"
            took, took_cpu = _drive(rt, workflows, tag, per_call=per_call, finish=finish)
            if switch_off is not None:
                switch_off()
            wall[side].append(took)
            cpu[side].append(took_cpu)

    def overhead(found: dict[str, list[float]]) -> float:
        ratios = [on / off - 1 for off, on in zip(found["off"], found["on"], strict=True)]
        return statistics.median(ratios) * 100

    return {
        "off_ms": statistics.median(wall["off"]) * 1000,
        "on_ms": statistics.median(wall["on"]) * 1000,
        "overhead_pct": overhead(wall),
        "off_cpu_ms": statistics.median(cpu["off"]) * 1000,
        "on_cpu_ms": statistics.median(cpu["on"]) * 1000,
        "cpu_overhead_pct": overhead(cpu),
    }


def per_call(url: str, workflows: int, rounds: int) -> dict[str, dict[str, float]]:
    """Metrics off and on (`qlflow.metrics.instrument`), batched and per call."""
    rt = qlflow.open(url)

    def switch_on() -> tuple[None, Callable[[], None]]:
        return None, metrics.instrument(rt).close

    try:
        rt.publish(DIAMOND, now_ms=T0)
        _drive(rt, workflows, "warm")
        return {
            loop: _off_on(rt, workflows, rounds, switch_on, per_call=loop == "per_call")
            for loop in ("batched", "per_call")
        }
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
        _, workflow_cpu = _drive(rt, workflows, "observed")
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


def _dropping_provider() -> tuple[Any, list[int]]:
    """The SDK's TracerProvider with a simple span processor and an exporter that
    counts and drops every span: what a span costs in the SDK, sent nowhere."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

    exported = [0]

    class Dropping(SpanExporter):
        def export(self, spans):  # type: ignore[no-untyped-def]
            exported[0] += len(spans)
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(Dropping()))
    return provider, exported


def traces(url: str, workflows: int, rounds: int) -> dict[str, float]:
    """CPU per Workflow with `qlflow.tracing` off and on (the SDK's TracerProvider,
    spans dropped), in pairs of rounds; and, free of the shared machine's noise, the
    tracer's own CPU per Workflow: the commits of a workload replayed through its
    observer, its thread making every ended Run's spans, median of 9."""
    from qlflow import tracing

    provider, exported = _dropping_provider()
    rt = qlflow.open(url)

    def switch_on() -> tuple[Callable[[], None], Callable[[], None]]:
        runs = tracing.trace_runs(rt, tracer_provider=provider)
        return runs.flush, runs.close

    try:
        rt.publish(DIAMOND, now_ms=T0)
        _drive(rt, workflows, "warm")
        found = _off_on(rt, workflows, rounds, switch_on)
        alone_workflows = workflows * 5
        commits: list[Any] = []
        remove = rt.store.observers.on_commit(commits.append)
        _, workflow_cpu = _drive(rt, alone_workflows, "alone")
        remove()
        runs = tracing.trace_runs(rt, tracer_provider=provider)  # no commit follows
        exported[0] = 0
        alone = []
        for _ in range(9):
            began = time.process_time()  # the commit thread's and the tracing thread's
            for commit in commits:
                runs._observe(commit)
            runs.flush()
            alone.append((time.process_time() - began) / alone_workflows)
        runs.close()
        tracer = statistics.median(alone)
        return {
            **found,
            "workflow_cpu_ms": workflow_cpu * 1000,
            "tracer_us": tracer * 1e6,
            "tracer_pct": tracer / workflow_cpu * 100,
            "spans_per_run": exported[0] / (9 * alone_workflows),
        }
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
    made: list[str] = []  # the PostgreSQL schemas made, dropped at the end
    with tempfile.TemporaryDirectory() as folder:
        stores = {"sqlite": lambda name: f"sqlite:///{folder}/{name}.db"}
        if args.pg:
            stores["postgresql"] = lambda name: _pg_schema(args.pg, name, made)
        try:
            for kind, url_of in stores.items():
                results[kind] = {
                    "per_call": per_call(url_of("calls"), args.workflows, args.rounds),
                    "observer": observer_cost(url_of("observer"), args.workflows * 5),
                    "traces": traces(url_of("traces"), args.workflows, args.rounds),
                    "scrape": scrape(url_of("scrape"), args.runs),
                }
        finally:
            _drop_schemas(args.pg, made)
    console = Console(width=160)
    calls = Table(title="metrics off and on: per Workflow (4-step diamond)")
    for column in ("store", "loop", "off ms/wf", "on ms/wf", "wall overhead", "off CPU ms/wf",
                   "on CPU ms/wf", "CPU overhead", "observer CPU alone"):  # fmt: skip
        calls.add_column(column, justify="right")
    spans = Table(title="traces off and on: CPU per Workflow, the SDK's exporter dropping spans")
    for column in ("store", "off CPU ms/wf", "on CPU ms/wf", "CPU overhead", "tracer CPU alone",
                   "spans/Run"):  # fmt: skip
        spans.add_column(column, justify="right")
    scrapes = Table(title=f"a scrape of {args.runs:,} Runs (gauges read every scrape)")
    for column in ("store", "median", "max"):
        scrapes.add_column(column, justify="right")
    for kind, found in results.items():
        observer = found["observer"]
        for loop, measured in found["per_call"].items():
            calls.add_row(
                kind, loop.replace("_", " "),
                f"{measured['off_ms']:.2f}", f"{measured['on_ms']:.2f}",
                f"{measured['overhead_pct']:+.1f}%",
                f"{measured['off_cpu_ms']:.2f}", f"{measured['on_cpu_ms']:.2f}",
                f"{measured['cpu_overhead_pct']:+.1f}%",
                f"{observer['observer_us']:.0f} us ({observer['observer_pct']:.2f}%)"
                if loop == "batched" else "",
            )  # fmt: skip
        traced = found["traces"]
        spans.add_row(
            kind, f"{traced['off_cpu_ms']:.2f}", f"{traced['on_cpu_ms']:.2f}",
            f"{traced['cpu_overhead_pct']:+.1f}%",
            f"{traced['tracer_us']:.0f} us ({traced['tracer_pct']:.2f}%)",
            f"{traced['spans_per_run']:.0f}",
        )  # fmt: skip
        scraped = found["scrape"]
        scrapes.add_row(kind, f"{scraped['median_ms']:.1f} ms", f"{scraped['max_ms']:.1f} ms")
    for table in (calls, spans, scrapes):
        console.print(table)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_bytes(orjson.dumps(results, option=orjson.OPT_INDENT_2))


def _pg_schema(base: str, name: str, made: list[str]) -> str:
    """A fresh schema on `base` for one measurement (its name added to `made`)."""
    import psycopg

    from eventstore.url import with_search_path

    schema = f"bench_metrics_{name}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    made.append(schema)
    return with_search_path(base, schema)


def _drop_schemas(base: str | None, schemas: list[str]) -> None:
    if not base or not schemas:
        return
    import psycopg

    with psycopg.connect(base, autocommit=True) as conn:
        for schema in schemas:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


if __name__ == "__main__":
    main()
