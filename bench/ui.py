"""The dashboard's runs page over 100,000 Runs (issue 21).

    python -m bench.ui [--runs 100000] [--logged 5000] [--rounds 25] [--db PATH]
                       [--pg URL] [--quick]

Seeding (not measured). The first `--logged` Runs are written through the log: the
pure domain decisions (admission, attempt admission, lease, start, complete,
frontier, cancel) for three packages (a two-step and a one-step workflow each),
admitted 600 ms apart, with mixed fates (70% succeeded, 12% failed with the next
step skipped, 8% cancelled, 10% still running), appended in large transactions,
then the read models are rebuilt from the log once. The rest, up to `--runs`, are
copies of those Runs' rows in the `runs` read model under new ids and later
admission times (same shapes, same fates), inserted in bulk: the runs page reads
only that table (and the publications for its suggestions), so it sees 100,000 Runs
exactly as it would after 100,000 admissions, while seeding takes a minute instead
of an hour on this machine. `--logged` equal to `--runs` writes every Run through
the log. `--db` keeps the file and reuses it when it already holds the Runs.

Then, for each variant of the page (newest, filtered by status / package+workflow /
a one-hour window / an id prefix, a deep page, 200 a page), `--rounds` GETs through
the whole ASGI app (routing, the adapter's queries, Jinja2 rendering), after two
warm-ups; the figure is the median. The adapter's query alone is timed beside it.
The `runs` read model's own indexes serve every variant (newest first, by status,
by package and workflow: see projections/runs.py). The same runs on PostgreSQL (a
copy of the same rows in a fresh schema, dropped after) with `--pg` or
QLFLOW_TEST_PG_URL.
Target: under 200 ms a page. Prints a table, writes bench/results/ui.json.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import orjson
from rich.console import Console
from rich.table import Table

from bench.output import results_path

RESULTS = results_path("ui")
TARGET_MS = 200.0
T0 = 1_700_000_000_000
SPACING_MS = 600
COHORT = 2_000  # Runs appended per transaction
DIGEST = "sha256:" + "0" * 64
PACKAGES = ("backup", "etl", "reports")
WORKFLOWS = {"nightly": [("fetch", []), ("store", ["fetch"])], "hourly": [("sync", [])]}


# --- seeding ---------------------------------------------------------------------------


def _plan(run_id: str, package: str, workflow: str):
    from domain.plan import PLAN_SCHEMA, normalize, task_ref

    return normalize(
        {
            "schema": PLAN_SCHEMA,
            "project": "bench",
            "package": package,
            "installation": package,
            "lock_digest": DIGEST,
            "generation": 1,
            "revision_id": f"{package}-rev-1",
            "revision_digest": DIGEST,
            "publication_id": f"{package}-pub-1",
            "publication_digest": DIGEST,
            "workflow_key": workflow,
            "workflow_digest": DIGEST,
            "run_id": run_id,
            "timeout_ms": None,
            "steps": [
                {
                    "key": key,
                    "step_run_id": f"{run_id}.{key}",
                    "task_id": key,
                    "task_ref": task_ref(package, 1, key),
                    "source_digest": DIGEST,
                    "needs": needs,
                    "initial_status": "pending" if needs else "ready",
                }
                for key, needs in WORKFLOWS[workflow]
            ],
        }
    )


class _Run:
    """One Run being seeded: its aggregate, folded forward as records are appended."""

    def __init__(self, tx, decision) -> None:
        from domain.aggregate import fold

        records = tx.append(decision.appends)
        self.tx = tx
        self.aggregate = fold(
            [r for r in records if r.stream_id.startswith("run-")],
            [r for r in records if r.stream_id.startswith("steps-")],
        )

    def commit(self, decision):
        from domain.aggregate import extend

        if decision.noop:
            return decision
        records = self.tx.append(decision.appends)
        leases: dict[str, list] = {}
        for r in records:
            if r.stream_id.startswith("lease-"):
                leases.setdefault(r.stream_id.removeprefix("lease-"), []).append(r)
        self.aggregate = extend(
            self.aggregate,
            [r for r in records if r.stream_id.startswith("run-")],
            [r for r in records if r.stream_id.startswith("steps-")],
            leases,
        )
        return decision


def _seed_one(tx, number: int) -> None:
    from domain import cancellation, worker
    from domain.admission import admission_records
    from domain.attempts import decide_attempt_claims
    from domain.frontier import decide_frontier

    package = PACKAGES[number % len(PACKAGES)]
    workflow = "nightly" if number % 5 < 3 else "hourly"
    at = T0 + number * SPACING_MS
    run = _Run(
        tx, admission_records(_plan(f"ui-{number:07d}", package, workflow), f"k{number}", at)
    )
    fate = (number * 37) % 100  # spread the fates over time and packages
    if fate >= 90:  # still running: the first step claimed, nobody has it yet
        run.commit(decide_attempt_claims(run.aggregate, at + 5))
        return
    if fate >= 82:
        run.commit(cancellation.request_cancel(run.aggregate, "user", at + 40))
        run.commit(cancellation.decide_cancellation(run.aggregate, at + 50))
        return
    now = at
    while not run.aggregate.run.is_terminal:
        now += 10
        run.commit(decide_attempt_claims(run.aggregate, now))
        for attempt in list(run.aggregate.active_attempts()):
            grant = run.commit(
                worker.grant_lease(run.aggregate, attempt.attempt_id, "bench-w", 60_000, now)
            ).lease
            run.commit(
                worker.mark_running(
                    run.aggregate, attempt.attempt_id, grant.lease_id, grant.version, now + 1
                )
            )
            outcome = "failed" if fate >= 70 else "succeeded"
            run.commit(
                worker.complete(
                    run.aggregate,
                    attempt.attempt_id,
                    grant.lease_id,
                    grant.version,
                    outcome,
                    None,
                    {"exit_code": 0 if outcome == "succeeded" else 1},
                    now + 200 + number % 997,
                )
            )
            now += 200 + number % 997
        run.commit(decide_frontier(run.aggregate, now + 5))


def seed(url: str, runs: int, logged: int, console: Console) -> dict:
    """`logged` Runs through the log, the read models rebuilt, then copies of their
    `runs` rows up to `runs` in all; nothing if the store already holds them."""
    import qlflow
    from projections.rebuild import rebuild

    started = time.perf_counter()
    logged = min(logged, runs)
    with qlflow.open(url, synchronous="OFF") as rt:
        have = rt.store.query("SELECT COUNT(*) FROM runs")[0][0]
        if have >= runs:
            return {"reused": have}
        for package in PACKAGES:
            rt.publish(_manifest(package), now_ms=T0 - 60_000)
        for first in range(0, logged, COHORT):
            with rt.store.transaction() as tx:
                for number in range(first, min(logged, first + COHORT)):
                    _seed_one(tx, number)
            console.print(f"  {min(logged, first + COHORT):,} Runs through the log", end="\r")
        summary = rebuild(rt.store)
        copied = _copy_rows(rt.store, logged, runs)
        return {
            "runs": runs,
            "logged_runs": logged,
            "copied_rows": copied,
            "events": rt.store.head_position(),
            "seconds": time.perf_counter() - started,
            "rebuild_seconds": summary.seconds,
        }


_SHIFTED = ("admitted_at_ms", "deadline_ms", "cancel_requested_at_ms", "terminal_at_ms")


def _copy_rows(store, logged: int, runs: int) -> int:
    """Runs logged..runs-1 as copies of the logged Runs' rows: Run n copies Run
    n % logged, moved (n - n % logged) * SPACING_MS later, as ui-<n>, key k<n>."""
    with store.transaction() as tx:
        columns = [row[1] for row in tx.query("PRAGMA table_info(runs)")]
        rows = {
            int(row[0].removeprefix("ui-")): row
            for row in tx.query(f"SELECT {', '.join(columns)} FROM runs WHERE run_id LIKE 'ui-%'")
        }
        at = {name: columns.index(name) for name in _SHIFTED}
        made = []
        for number in range(logged, runs):
            base = rows[number % logged]
            shift = (number - number % logged) * SPACING_MS
            row = list(base)
            row[columns.index("run_id")] = f"ui-{number:07d}"
            row[columns.index("admission_key")] = f"k{number}"
            for index in at.values():
                if row[index] is not None:
                    row[index] += shift
            made.append(tuple(row))
        marks = ", ".join("?" * len(columns))
        tx.executemany(f"INSERT INTO runs ({', '.join(columns)}) VALUES ({marks})", made)
    return len(made)


def _manifest(package: str) -> dict:
    tasks = {key: {"command": ["true"]} for steps in WORKFLOWS.values() for key, _ in steps}
    return {
        "package": {"name": package, "publisher": "bench"},
        "tasks": tasks,
        "workflows": {
            name: {"steps": [{"key": k, "task": k, "needs": n} for k, n in steps]}
            for name, steps in WORKFLOWS.items()
        },
    }


# --- timing ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Variant:
    name: str
    params: dict[str, str]


def variants(rt) -> list[Variant]:
    newest, count = rt.store.query("SELECT MAX(admitted_at_ms), COUNT(*) FROM runs")[0]
    middle = count // 2  # a cursor half way down the list
    deep = rt.store.query(
        "SELECT admitted_at_ms, run_id FROM runs ORDER BY admitted_at_ms DESC, run_id "
        "LIMIT 1 OFFSET ?",
        (middle,),
    )[0]
    return [
        Variant("newest 50", {}),
        Variant("status=failed", {"status": "failed"}),
        Variant("package+workflow", {"package": "etl", "workflow": "hourly"}),
        Variant("last hour", {"since": str(newest - 3_600_000)}),
        Variant("running, last hour", {"status": "running", "since": str(newest - 3_600_000)}),
        Variant("id prefix", {"q": "ui-00004"}),
        Variant(f"page {middle // 50 + 1:,} (cursor)", {"before": f"{deep[0]}.{deep[1]}"}),
        Variant("newest 200", {"limit": "200"}),
    ]


def _medians(call: Callable[[], object], rounds: int) -> tuple[float, float]:
    """Median wall ms and median CPU ms of this process (every thread) per call: on
    a shared machine the CPU figure is what the page itself costs."""
    for _ in range(2):
        call()
    wall, cpu = [], []
    for _ in range(rounds):
        began, began_cpu = time.perf_counter(), time.process_time()
        call()
        wall.append((time.perf_counter() - began) * 1000)
        cpu.append((time.process_time() - began_cpu) * 1000)
    return statistics.median(wall), statistics.median(cpu)


def time_store(url: str, rounds: int) -> dict:
    from starlette.testclient import TestClient

    import qlflow
    from qlflow.ui import create_app
    from qlflow.ui.app import run_query

    with qlflow.open(url) as rt:
        app = create_app(rt, token=None, allow_remote=False)
        dashboard_runs = app.state.dashboard.runs
        results = {}
        with TestClient(app, base_url="http://127.0.0.1") as client:
            for variant in variants(rt):
                response = client.get("/runs", params=variant.params)
                assert response.status_code == 200, (variant, response.text[:500])
                query = run_query(variant.params)
                page_ms, page_cpu_ms = _medians(
                    lambda v=variant: client.get("/runs", params=v.params), rounds
                )
                query_ms, query_cpu_ms = _medians(lambda q=query: dashboard_runs(q), rounds)
                results[variant.name] = {
                    "page_ms": page_ms,
                    "page_cpu_ms": page_cpu_ms,
                    "query_ms": query_ms,
                    "query_cpu_ms": query_cpu_ms,
                    "rows": response.text.count("<tr data-run="),
                }
        return results


def render(results: dict, console: Console) -> None:
    stores = list(results["stores"])
    table = Table(
        title=f"runs page, {results['runs']:,} Runs: median ms of {results['rounds']} "
        "(wall / CPU of this process)"
    )
    table.add_column("variant")
    table.add_column("rows", justify="right")
    for store in stores:
        table.add_column(f"{store} page", justify="right")
        table.add_column("its query", justify="right")
    for name in results["stores"][stores[0]]:
        row = [name, str(results["stores"][stores[0]][name]["rows"])]
        for store in stores:
            f = results["stores"][store][name]
            row += [
                f"{f['page_ms']:.0f} / {f['page_cpu_ms']:.0f}",
                f"{f['query_ms']:.0f} / {f['query_cpu_ms']:.0f}",
            ]
        table.add_row(*row)
    console.print(table)
    for store in stores:
        worst = max(v["page_ms"] for v in results["stores"][store].values())
        verdict = "meets" if worst < TARGET_MS else "misses"
        console.print(
            f"{store}: slowest page {worst:.0f} ms, {verdict} the {TARGET_MS:.0f} ms target"
        )
    load = results.get("load_average_before", (0.0,))[0]
    console.print(f"load average when it started: {load:.1f} ({os.cpu_count()} cores)")


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m bench.ui", description=__doc__)
    parser.add_argument("--runs", type=int, default=100_000)
    parser.add_argument("--logged", type=int, default=5_000, help="Runs written through the log")
    parser.add_argument("--rounds", type=int, default=25)
    parser.add_argument("--db", help="SQLite file to seed (kept, and reused if seeded)")
    parser.add_argument("--pg", default=os.environ.get("QLFLOW_TEST_PG_URL"))
    parser.add_argument("--quick", action="store_true", help="5,000 Runs, 5 rounds")
    parser.add_argument(
        "--smoke", action="store_true", help="50 Runs, one round: does it still run"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.runs, args.logged, args.rounds = 5_000, 1_000, 5
    if args.smoke:
        args.runs, args.logged, args.rounds = 50, 10, 1
    console = Console(width=150)
    from bench.cycle import PgSchemas

    results: dict = {"runs": args.runs, "rounds": args.rounds, "target_ms": TARGET_MS}
    results["load_average_before"] = os.getloadavg()  # the machine may be shared
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(args.db).resolve() if args.db else Path(scratch) / "ui.db"
        results["seed"] = seed(f"sqlite:///{path}", args.runs, args.logged, console)
        console.print(f"store ready: {results['seed']}")
        stores = results["stores"] = {}
        stores["sqlite"] = time_store(f"sqlite:///{path}", args.rounds)
        if args.pg:
            schemas = PgSchemas(args.pg)
            try:
                stores["postgresql"] = time_store(schemas.clone(path, "ui"), args.rounds)
            finally:
                schemas.close()
    results["load_average_after"] = os.getloadavg()
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_bytes(orjson.dumps(results, option=orjson.OPT_INDENT_2))
    render(results, console)
    return results


if __name__ == "__main__":
    main()
