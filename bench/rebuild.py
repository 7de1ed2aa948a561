"""Projection rebuild (and verify) throughput beside a raw read of the log, in the same
run, at several log sizes, on SQLite and PostgreSQL, with each one's peak memory.

    python -m bench.rebuild [--sizes 200000,1000000] [--pg URL | --no-pg] [--rounds 3]
                            [--verify] [--profile] [--dir DIR]

Generates a log by driving the pure domain decisions (admission, frontier, attempt
admission, lease / start / renew / complete, recovery, cancellation) over many Runs,
appended through the store in large transactions: DAGs of 3-6 steps; most Runs
succeed; some fail a step (skips follow), some are cancelled while a worker holds a
started Attempt, some have a lease expire before start (lost, requeued), some time
out. Each size has a log of its own. At each size, `--rounds` rounds, each
in fresh processes one after the other (interleaved): a raw `iter_all` over the
whole log, then `rebuild` (the first round's fills the empty live tables, later ones
replace full ones), then `verify` with `--verify`. The best round of each is compared
(noise on a shared machine only ever slows a round): target rebuild >= 0.8x raw.
Each process reports its peak RSS, which must not grow with the log's size.
`--profile` adds one rebuild under cProfile per size: its top lines and
`orjson.loads` calls per event (the main thread's only: on PostgreSQL the read-ahead
thread decodes each event's data unseen, so add 1.0 there). Each process also
reports its CPU seconds, steadier than the wall clock on a loaded machine. Prints a
table and writes bench/results/rebuild.json.
PostgreSQL runs when --pg (or QLFLOW_TEST_PG_URL) is given, in a fresh schema dropped
afterwards; `--dir` keeps the SQLite files and `--pg-schema` the PostgreSQL schemas
(one per size), and a later run reuses them. An empty PostgreSQL log copies the
SQLite log of its size from `--dir` where there is one (COPY: seconds, where
generating it through the domain takes minutes there).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import random
import resource
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

import orjson
import psycopg
from rich.console import Console
from rich.table import Table

from bench.output import results_path
from domain import cancellation, worker
from domain.admission import admission_records
from domain.aggregate import RunAggregate, extend, fold
from domain.attempts import decide_attempt_claims
from domain.frontier import decide_frontier
from domain.plan import PLAN_SCHEMA, ExecutionPlan, normalize, task_ref
from domain.recovery import decide_recovery
from eventstore import open_store
from projections import registry
from projections.rebuild import rebuild
from projections.verify import verify

RESULTS = results_path("rebuild")
TARGET = 0.8
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
    _commit(tx, sim, decide_attempt_claims(sim.aggregate, now))
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


def copy_log(source: str, url: str) -> dict:
    """Fill an empty PostgreSQL store's log with a SQLite log's events and stream heads
    by COPY: the same log as `generate` makes (it is the same events), in seconds
    rather than the minutes a generation through the domain takes there (about 230 s
    per 200,000 events, an append's round trips each). The position counter is the
    PostgreSQL store's own (`qlflow_position`), set to the last position."""
    started = time.perf_counter()
    lite = sqlite3.connect(f"file:{source}?mode=ro", uri=True)
    try:
        with psycopg.connect(url) as conn:
            with conn.cursor().copy(f"COPY events ({_EVENT_COLUMNS}) FROM STDIN") as copy:
                for row in lite.execute(
                    f"SELECT {_EVENT_COLUMNS} FROM events ORDER BY global_position"
                ):
                    copy.write_row(row)
            with conn.cursor().copy("COPY streams (stream_id, version) FROM STDIN") as copy:
                for row in lite.execute("SELECT stream_id, version FROM streams"):
                    copy.write_row(row)
            conn.execute(
                "UPDATE qlflow_position SET last = (SELECT MAX(global_position) FROM events)"
            )
            conn.execute("ANALYZE events")
            conn.execute("ANALYZE streams")
    finally:
        lite.close()
    return {"copied_from": source, "copy_seconds": time.perf_counter() - started}


_EVENT_COLUMNS = "global_position, event_id, stream_id, stream_version, type, data, metadata"


def generate(store, events: int, seed: int = 7) -> dict:
    """Append Runs until the log holds at least `events` events; returns counts."""
    rng = random.Random(seed)
    # a log grown from a smaller one goes on where it stopped: new Runs, later times
    [(number, latest)] = store.query("SELECT COUNT(*), MAX(admitted_at_ms) FROM runs")
    now = T0 if latest is None else latest + 3600 * TICK_MS
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


# --- timing: each measurement in a process of its own ------------------------------------


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def measure(kind: str, url: str) -> dict:
    """One measurement in this process: `raw` (iter_all), `rebuild`, `verify` or
    `profile` (a rebuild under cProfile)."""
    store = open_store(url)
    # the projection modules imported before the clock starts, as a raw read imports
    # nothing: a process pays that once, it is no part of a replay's throughput
    registry.modules()
    try:
        cpu_started = _cpu_seconds()
        started = time.perf_counter()
        result: dict = {}
        if kind == "raw":
            events = sum(1 for _ in store.iter_all())
        elif kind == "rebuild":
            events = rebuild(store).events
        elif kind == "verify":
            report = verify(store)
            events, result["ok"] = report.position, report.ok
        else:
            profile = cProfile.Profile()
            profile.enable()
            events = rebuild(store).events
            profile.disable()
            result.update(_profile_lines(profile, events))
        seconds = time.perf_counter() - started
        cpu = _cpu_seconds() - cpu_started
    finally:
        store.close()
    return {
        **result,
        "events": events,
        "seconds": seconds,
        "events_per_s": events / seconds if seconds else 0.0,
        # this process's CPU (every thread), not the database server's: steadier than
        # the wall clock on a loaded machine
        "cpu_seconds": cpu,
        "events_per_cpu_s": events / cpu if cpu else 0.0,
        "peak_rss_mb": _peak_rss_mb(),
    }


def _profile_lines(profile: cProfile.Profile, events: int) -> dict:
    text = io.StringIO()
    stats = pstats.Stats(profile, stream=text)
    stats.sort_stats("cumulative").print_stats(PROFILE_LINES)
    loads = sum(
        calls
        for (_file, _line, name), (calls, *_rest) in stats.stats.items()  # type: ignore[attr-defined]
        if "orjson" in name and "loads" in name
    )
    return {
        "profile": text.getvalue().split("\n"),
        "orjson_loads": loads,
        "loads_per_event": loads / events if events else 0.0,
    }


PROFILE_LINES = 20


BEFORE = "_before"  # a kind's suffix: measured with the code of `--before DIR`


def _child(kind: str, url: str, before: str | None = None) -> dict:
    env = dict(os.environ)
    if kind.endswith(BEFORE):
        assert before is not None
        kind = kind.removesuffix(BEFORE)
        env["PYTHONPATH"] = before  # that tree's qlflow, and this very bench copied there
        shutil.copy(__file__, os.path.join(before, "bench", "rebuild.py"))
    done = subprocess.run(
        [sys.executable, "-m", "bench.rebuild", "--child", kind, "--url", url],
        check=True,
        capture_output=True,
        text=True,
        env=env,
        cwd=before if env.get("PYTHONPATH") == before else None,
    )
    return orjson.loads(done.stdout.strip().splitlines()[-1])


def bench_size(
    url: str,
    size: int,
    rounds: int,
    console: Console,
    extra: Sequence[str],
    before: str | None = None,
    source: str | None = None,
) -> dict:
    """Grow the log to `size` events, then `rounds` interleaved rounds of raw read,
    rebuild (and whatever `extra` names), each in a process of its own; with `before`
    (a source tree), its rebuild (and verify) too, in the same rounds. `source`: a
    SQLite log of that size whose events an empty PostgreSQL log copies instead."""
    store = open_store(url)
    try:
        registry.migrate_all(store)
        started = time.perf_counter()
        existing = store.head_position()
        if existing == 0 and source is not None and os.path.exists(source):
            generated = copy_log(source, url)
        elif existing < size:
            generated = generate(store, size)
        else:
            generated = {"reused": existing}
        generated["seconds"] = time.perf_counter() - started
        events = store.head_position()
        dialect = store.dialect
    finally:
        store.close()
    console.print(f"{dialect}: log ready, {events:,} events {generated}")
    kinds = ["raw", "rebuild", *(k for k in extra if k != "profile")]
    if before is not None:
        kinds += [kind + BEFORE for kind in kinds if kind != "raw"]
    found: dict[str, list[dict]] = {kind: [] for kind in kinds}
    for number in range(rounds):
        for kind in kinds:
            found[kind].append(_child(kind, url, before))
        console.print(
            f"  round {number + 1}: "
            + ", ".join(f"{k} {found[k][-1]['events_per_s']:,.0f} events/s" for k in kinds)
        )
    best = {kind: max(found[kind], key=lambda r: r["events_per_s"]) for kind in kinds}
    result: dict = {
        "events": events,
        "generated": generated,
        "best": best,
        "rounds": found,
        "ratio": best["rebuild"]["events_per_s"] / best["raw"]["events_per_s"],
        "peak_rss_mb": {kind: max(r["peak_rss_mb"] for r in found[kind]) for kind in kinds},
    }
    for kind in kinds[1:]:
        result[f"{kind}_ratio"] = best[kind]["events_per_s"] / best["raw"]["events_per_s"]
    if "profile" in extra:
        result["profile"] = _child("profile", url)
        console.print("\n".join(result["profile"]["profile"]))
        if before is not None:
            result["profile" + BEFORE] = _child("profile" + BEFORE, url, before)
            console.print("\n".join(result["profile" + BEFORE]["profile"]))
    return result


def render(results: dict, console: Console) -> None:
    table = Table(title="rebuild and verify vs raw iter_all (same run, best round of each)")
    columns = ("store", "events", "what", "events/s", "x raw", "CPU events/s", "x raw CPU")
    for column in (*columns, "peak RSS MB", "loads/event"):
        table.add_column(column, justify="right")
    for dialect, sizes in results["dialects"].items():
        for r in sizes.values():
            raw_cpu = _best_cpu(r["rounds"]["raw"])
            for kind, best in r["best"].items():
                profile = r.get("profile" + (BEFORE if kind.endswith(BEFORE) else ""))
                cpu = _best_cpu(r["rounds"][kind])
                table.add_row(
                    dialect,
                    f"{r['events']:,}",
                    kind,
                    f"{best['events_per_s']:,.0f}",
                    f"{best['events_per_s'] / r['best']['raw']['events_per_s']:.2f}",
                    f"{cpu:,.0f}" if cpu else "",
                    f"{cpu / raw_cpu:.2f}" if cpu and raw_cpu else "",
                    f"{r['peak_rss_mb'][kind]:.0f}",
                    f"{profile['loads_per_event']:.2f}"
                    if profile and kind.startswith("rebuild")
                    else "",
                )
    console.print(table)


def _best_cpu(rounds: list[dict]) -> float:
    """The best events per CPU second over the rounds (0: not measured)."""
    return max((r.get("events_per_cpu_s", 0.0) for r in rounds), default=0.0)


def _pg_schema_url(url: str, schema: str, *, async_commit: bool = False) -> str:
    separator = "&" if "?" in url else "?"
    options = f"-c search_path={schema}" + (" -c synchronous_commit=off" if async_commit else "")
    return f"{url}{separator}options={quote(options)}"


def main(argv: Sequence[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(
        prog="python -m bench.rebuild",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--sizes", default="200000,1000000", help="log sizes, comma-separated")
    parser.add_argument("--dir", help="keep (and reuse) the SQLite log files here")
    parser.add_argument("--pg", default=os.environ.get("QLFLOW_TEST_PG_URL"))
    parser.add_argument("--no-pg", action="store_true", help="SQLite only")
    parser.add_argument("--no-sqlite", action="store_true", help="PostgreSQL only")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per store and size")
    parser.add_argument("--verify", action="store_true", help="also time verify")
    parser.add_argument("--profile", action="store_true", help="one rebuild under cProfile")
    parser.add_argument("--before", help="a source tree whose rebuild to measure alongside")
    parser.add_argument("--pg-schema", help="keep (and reuse) the PostgreSQL log in this schema")
    parser.add_argument("--out", default=str(RESULTS), help="where the JSON goes")
    parser.add_argument("--child", choices=("raw", "rebuild", "verify", "profile"))
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument(
        "--smoke", action="store_true", help="200 events, one round, verified: does it still run"
    )
    args = parser.parse_args(argv)
    if args.smoke:
        args.sizes, args.rounds, args.verify = "200", 1, True
    if args.child:
        result = measure(args.child, args.url)
        print(orjson.dumps(result).decode())
        return result
    sizes = sorted(int(size) for size in args.sizes.split(","))
    extra = [k for k in ("verify", "profile") if getattr(args, k)]
    console = Console(width=120)
    before = os.path.abspath(args.before) if args.before else None
    results: dict = {"target": TARGET, "sizes": sizes, "dialects": {}}
    if not args.no_sqlite:
        with tempfile.TemporaryDirectory() as scratch:
            if args.dir:
                os.makedirs(args.dir, exist_ok=True)
            folder = os.path.abspath(args.dir or scratch)
            results["dialects"]["sqlite"] = {
                str(size): bench_size(
                    f"sqlite:///{folder}/rebuild-{size}.db",
                    size,
                    args.rounds,
                    console,
                    extra,
                    before,
                )
                for size in sizes
            }
    if args.pg and not args.no_pg:
        prefix = args.pg_schema or f"bench_rebuild_{uuid.uuid4().hex[:8]}"
        schemas = {size: f"{prefix}_{size}" for size in sizes}
        with psycopg.connect(args.pg, autocommit=True) as conn:
            for schema in schemas.values():
                conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
        try:
            results["dialects"]["postgresql"] = {
                str(size): bench_size(
                    _pg_schema_url(args.pg, schemas[size]),
                    size,
                    args.rounds,
                    console,
                    extra,
                    before,
                    # the SQLite log of that size, where this run kept one: copied
                    os.path.join(args.dir, f"rebuild-{size}.db") if args.dir else None,
                )
                for size in sizes
            }
        finally:
            if not args.pg_schema:
                with psycopg.connect(args.pg, autocommit=True) as conn:
                    for schema in schemas.values():
                        conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(orjson.dumps(results, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS))
    render(results, console)
    return results


if __name__ == "__main__":
    main()
