"""Projection rebuild throughput beside a raw read of the log, in the same run (issue 7).

    python -m bench.rebuild [--events 1000000] [--pg URL] [--pg-events 200000] [--db PATH]

Generates a log of about `--events` events by driving the pure domain decisions
(admission, frontier, attempt admission, lease / start / renew / complete,
recovery, cancellation) over many Runs, appended through the store in large
transactions: DAGs of 3-6 steps; most Runs succeed; some fail a step (skips
follow), some are cancelled while a worker holds a started Attempt, some have a
lease expire before start (lost, requeued), some time out. Then times, in the
same process, `--rounds` rounds of: a raw `iter_all` over the whole log, then
`rebuild` (the first round's fills the empty live tables, later ones replace full
ones); the best round of each is compared. Target: rebuild >= 0.5x raw events/s.
Prints a table and writes bench/results/rebuild.json. PostgreSQL runs when --pg (or
QLFLOW_TEST_PG_URL) is given, in a fresh schema dropped afterwards.
"""

from __future__ import annotations

import argparse
import os
import random
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from urllib.parse import quote

import orjson
import psycopg
from rich.console import Console
from rich.table import Table

from bench.output import results_path
from domain import cancellation, worker
from domain.admission import admission_records
from domain.aggregate import RunAggregate, extend, fold
from domain.attempts import decide_attempt_admission
from domain.frontier import decide_frontier
from domain.plan import PLAN_SCHEMA, ExecutionPlan, normalize, task_ref
from domain.recovery import decide_recovery
from eventstore import open_store
from projections import registry
from projections.rebuild import rebuild
from projections.verify import verify

RESULTS = results_path("rebuild")
TARGET = 0.5
COHORT = 400  # Runs driven side by side (one transaction per tick over all of them)
TICK_MS = 1000
TTL_MS = 5000
DIGEST = "sha256:" + "0" * 64
T0 = 1_700_000_000_000

SHAPES = {
    "chain3": [("a", []), ("b", ["a"]), ("c", ["b"])],
    "diamond": [("a", []), ("b", ["a"]), ("c", ["a"]), ("d", ["b", "c"])],
    "wide": [("a", []), ("b", []), ("c", ["a"]), ("d", ["a", "b"]), ("e", ["c"]), ("f", ["d"])],
}


# --- the workload ------------------------------------------------------------------------


@dataclass
class SimRun:
    """One Run being driven, with its scripted fate."""

    aggregate: RunAggregate
    fail_step: str | None = None
    cancel: bool = False
    stall_step: str | None = None  # its first Attempt is leased but never started
    stalled: bool = False
    leases: dict[str, tuple[str, int]] = field(default_factory=dict)  # attempt -> (id, version)


def plan_for(run_id: str, shape: str, timeout_ms: int | None) -> ExecutionPlan:
    steps = SHAPES[shape]
    return normalize(
        {
            "schema": PLAN_SCHEMA,
            "project": "bench",
            "package": "bench",
            "installation": "bench",
            "lock_digest": DIGEST,
            "generation": 1,
            "revision_id": "bench-rev-1",
            "revision_digest": DIGEST,
            "publication_id": "bench-pub-1",
            "publication_digest": DIGEST,
            "workflow_key": shape,
            "workflow_digest": DIGEST,
            "run_id": run_id,
            "timeout_ms": timeout_ms,
            "steps": [
                {
                    "key": key,
                    "step_run_id": f"{run_id}.{key}",
                    "task_id": key,
                    "task_ref": task_ref("bench", 1, key),
                    "source_digest": DIGEST,
                    "needs": needs,
                    "initial_status": "pending" if needs else "ready",
                }
                for key, needs in steps
            ],
        }
    )


def _commit(tx, sim: SimRun, decision) -> None:
    """Append a decision's records and fold them into the Run's aggregate."""
    if decision.noop:
        return
    records = tx.append(decision.appends)
    run = [r for r in records if r.stream_id.startswith("run-")]
    steps = [r for r in records if r.stream_id.startswith("steps-")]
    leases: dict[str, list] = {}
    for r in records:
        if r.stream_id.startswith("lease-"):
            leases.setdefault(r.stream_id[len("lease-") :], []).append(r)
    sim.aggregate = extend(sim.aggregate, run, steps, leases)


def _tick(tx, sim: SimRun, now: int) -> None:
    """One cycle over the Run (every phase) and one pass of its worker."""
    agg = sim.aggregate
    _commit(tx, sim, decide_recovery(agg, now))
    _commit(tx, sim, cancellation.decide_cancellation(sim.aggregate, now))
    _commit(tx, sim, decide_frontier(sim.aggregate, now))
    _commit(tx, sim, decide_attempt_admission(sim.aggregate, now))
    for attempt in list(sim.aggregate.active_attempts()):
        agg = sim.aggregate
        if agg.run.is_terminal:
            return
        if attempt.status == "claimed":
            if attempt.has_live_lease(now) or agg.run.cancel_reason is not None:
                continue
            if agg.run.deadline_ms is not None and now >= agg.run.deadline_ms:
                continue
            decision = worker.grant_lease(agg, attempt.attempt_id, "w1", TTL_MS, now)
            _commit(tx, sim, decision)
            grant = decision.lease
            sim.leases[attempt.attempt_id] = (grant.lease_id, grant.version)
            if attempt.step_key == sim.stall_step and not sim.stalled:
                sim.stalled = True  # the worker vanishes: recovery will find the lease expired
                continue
            _commit(
                tx,
                sim,
                worker.mark_running(
                    sim.aggregate, attempt.attempt_id, *sim.leases[attempt.attempt_id], now
                ),
            )
            if sim.cancel and sim.aggregate.run.cancel_reason is None:
                _commit(tx, sim, cancellation.request_cancel(sim.aggregate, "user", now))
            decision = worker.renew(
                sim.aggregate, attempt.attempt_id, grant.lease_id, grant.version, TTL_MS, now
            )
            _commit(tx, sim, decision)
            outcome = "failed" if attempt.step_key == sim.fail_step else "succeeded"
            _commit(
                tx,
                sim,
                worker.complete(
                    sim.aggregate,
                    attempt.attempt_id,
                    decision.lease.lease_id,
                    decision.lease.version,
                    outcome,
                    None,
                    {"exit_code": 0 if outcome == "succeeded" else 1},
                    now,
                ),
            )


def generate(store, events: int, seed: int = 7) -> dict:
    """Append Runs until the log holds at least `events` events; returns counts."""
    rng = random.Random(seed)
    number = 0
    now = T0
    runs = 0
    # a small log (--smoke) in a few Runs, not a whole cohort of ~58 events each
    size = min(COHORT, max(1, events // 60))
    while store.head_position() < events:
        cohort: list[SimRun] = []
        with store.transaction() as tx:
            for _ in range(size):
                number += 1
                shape = rng.choice(list(SHAPES))
                keys = [k for k, _ in SHAPES[shape]]
                fate = rng.random()
                timeout = 3 * TICK_MS if fate > 0.97 else None
                plan = plan_for(f"bench-{number:08d}", shape, timeout)
                decision = admission_records(plan, f"bench-key-{number}", now)
                records = tx.append(decision.appends)
                sim = SimRun(
                    fold(
                        [r for r in records if r.stream_id.startswith("run-")],
                        [r for r in records if r.stream_id.startswith("steps-")],
                    )
                )
                if fate < 0.10:
                    sim.fail_step = rng.choice(keys[:-1])
                elif fate < 0.15:
                    sim.cancel = True
                elif fate < 0.20 or timeout:
                    sim.stall_step = keys[0]
                cohort.append(sim)
        runs += len(cohort)
        while cohort:
            now += TICK_MS
            with store.transaction() as tx:
                for sim in cohort:
                    _tick(tx, sim, now)
            cohort = [s for s in cohort if not s.aggregate.run.is_terminal]
    return {"runs": runs, "events": store.head_position()}


# --- timing ------------------------------------------------------------------------------


def time_raw(store) -> dict:
    started = time.perf_counter()
    count = sum(1 for _ in store.iter_all())
    seconds = time.perf_counter() - started
    return {"events": count, "seconds": seconds, "events_per_s": count / seconds}


def time_rebuild(store) -> dict:
    summary = rebuild(store)
    return {
        "events": summary.events,
        "seconds": summary.seconds,
        "events_per_s": summary.events_per_second,
        "rows": summary.tables,
    }


def bench_store(url: str, events: int, rounds: int, console: Console, check: bool) -> dict:
    """Generate (or reuse) the log, then `rounds` rounds of raw read + rebuild; the best
    round of each counts (the machine may be shared: noise only ever slows a round)."""
    store = open_store(url)
    try:
        registry.migrate_all(store)
        started = time.perf_counter()
        existing = store.head_position()
        generated = generate(store, events) if existing < events else {"reused": existing}
        generated["seconds"] = time.perf_counter() - started
        console.print(f"{store.dialect}: log ready, {store.head_position():,} events {generated}")
        raws, rebuilds = [], []
        for number in range(rounds):
            raws.append(time_raw(store))
            rebuilds.append(time_rebuild(store))
            console.print(
                f"  round {number + 1}: raw {raws[-1]['events_per_s']:,.0f} events/s, "
                f"rebuild {rebuilds[-1]['events_per_s']:,.0f} events/s"
            )
        raw = max(raws, key=lambda r: r["events_per_s"])
        best = max(rebuilds, key=lambda r: r["events_per_s"])
        result = {
            "events": store.head_position(),
            "generated": generated,
            "raw_iter_all": raw,
            "rebuild": best,
            "rounds": {"raw_iter_all": raws, "rebuild": rebuilds},
            "ratio": best["events_per_s"] / raw["events_per_s"],
        }
        if check:
            result["verify_ok"] = verify(store).ok
        return result
    finally:
        store.close()


def render(results: dict, console: Console) -> None:
    table = Table(title="projection rebuild vs raw iter_all (same run, best round of each)")
    for column in ("store", "events", "raw events/s", "rebuild events/s", "rebuild s", "ratio"):
        table.add_column(column, justify="right")
    for dialect, r in results["dialects"].items():
        table.add_row(
            dialect,
            f"{r['events']:,}",
            f"{r['raw_iter_all']['events_per_s']:,.0f}",
            f"{r['rebuild']['events_per_s']:,.0f}",
            f"{r['rebuild']['seconds']:.1f}",
            f"{r['ratio']:.2f} (target {TARGET})",
        )
    console.print(table)


def _pg_schema_url(url: str, schema: str) -> str:
    separator = "&" if "?" in url else "?"
    return f"{url}{separator}options={quote(f'-c search_path={schema}')}"


def main(argv: Sequence[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m bench.rebuild", description=__doc__)
    parser.add_argument("--events", type=int, default=1_000_000, help="SQLite log size")
    parser.add_argument("--db", help="SQLite file to use (reused if it already holds the log)")
    parser.add_argument("--pg", default=os.environ.get("QLFLOW_TEST_PG_URL"))
    parser.add_argument("--pg-events", type=int, default=200_000, help="PostgreSQL log size")
    parser.add_argument("--rounds", type=int, default=3, help="raw + rebuild rounds per store")
    parser.add_argument("--verify", action="store_true", help="also verify after the rebuilds")
    parser.add_argument(
        "--smoke", action="store_true", help="200 events, one round, verified: does it still run"
    )
    args = parser.parse_args(argv)
    if args.smoke:
        args.events, args.pg_events, args.rounds, args.verify = 200, 200, 1, True
    console = Console()
    results: dict = {"target": TARGET, "dialects": {}}
    with tempfile.TemporaryDirectory() as scratch:
        path = args.db or os.path.join(scratch, "rebuild.db")
        results["dialects"]["sqlite"] = bench_store(
            f"sqlite:///{os.path.abspath(path)}", args.events, args.rounds, console, args.verify
        )
    if args.pg:
        schema = f"bench_rebuild_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(args.pg, autocommit=True) as conn:
            conn.execute(f'CREATE SCHEMA "{schema}"')
        try:
            results["dialects"]["postgresql"] = bench_store(
                _pg_schema_url(args.pg, schema), args.pg_events, args.rounds, console, args.verify
            )
        finally:
            with psycopg.connect(args.pg, autocommit=True) as conn:
                conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_bytes(orjson.dumps(results, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS))
    render(results, console)
    return results


if __name__ == "__main__":
    main()
