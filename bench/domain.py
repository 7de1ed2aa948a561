"""Cost of the pure core: µs per decision on a 128-Step workflow, µs per fold (issue 3).

    python -m bench.domain [--repeat 7]

Scenarios are built by applying real decisions to in-memory streams (as the store
would), then each decision is timed on the resulting aggregate: frontier over a
wide DAG (127 Steps become ready) and over a chain (one failure skips 127 Steps
and ends the Run), cancellation with mixed states (claims with and without live
or expired leases, started Attempts, pending Steps) and with 128 unleased claims
(the most records one cancellation can write), and the fold of a Run of about
1,000 records. Target: a 128-Step cancellation decision ≤ 2 ms. Prints a table
and writes bench/results/domain.json.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import platform
import statistics
import time
from collections import defaultdict
from collections.abc import Callable

import orjson
from rich.console import Console
from rich.table import Table

from bench.output import results_path
from domain.admission import admission_records
from domain.aggregate import RunAggregate, extend, fold
from domain.attempts import decide_attempt_claims
from domain.cancellation import decide_cancellation, request_cancel
from domain.decision import Decision
from domain.frontier import decide_frontier
from domain.ids import STEP_RUN_ID, derive_id
from domain.plan import PLAN_SCHEMA, ExecutionPlan, PlanStep
from domain.records import Record
from domain.streams import lease_stream, run_stream, steps_stream
from domain.worker import complete, grant_lease, mark_running, mark_starting

RESULTS = results_path("domain")
CANCELLATION_TARGET_US = 2_000
STEPS = 128
TTL_MS = 30_000
START_MS = 1_700_000_000_000


def _digest(*parts: object) -> str:
    return "sha256:" + hashlib.sha256(repr(parts).encode()).hexdigest()


def make_plan(needs: dict[str, list[str]], run_id: str = "bench-run") -> ExecutionPlan:
    steps = tuple(
        PlanStep(
            key=key,
            step_run_id=derive_id(STEP_RUN_ID, run_id, key),
            task_id=f"t-{key}",
            task_ref=f"pkg@1#t-{key}",
            source_digest=_digest(key),
            needs=tuple(sorted(needs[key])),
            initial_status="pending" if needs[key] else "ready",
        )
        for key in sorted(needs)
    )
    return ExecutionPlan(
        PLAN_SCHEMA, "proj", "pkg", "inst", _digest("lock"), 1, "rev-1", _digest("rev"), "pub-1",
        _digest("pub"), "wf", _digest("wf"), run_id, None, steps, _digest("plan", run_id),
    )  # fmt: skip


class Streams:
    """A Run's streams in memory; decisions are appended as the store would."""

    def __init__(self, plan: ExecutionPlan) -> None:
        self.plan = plan
        self.now_ms = START_MS
        self.streams: dict[str, list[Record]] = defaultdict(list)
        self.position = 0
        self.agg: RunAggregate | None = None
        self.apply(admission_records(plan, "bench", self.now_ms))

    def apply(self, decision: Decision) -> None:
        new: dict[str, list[Record]] = {}
        for append in decision.appends:
            stream = self.streams[append.stream_id]
            assert len(stream) == append.expected_version
            records = []
            for offset, event in enumerate(append.events, start=1):
                self.position += 1
                records.append(
                    Record(
                        event.event_id, append.stream_id, append.expected_version + offset,
                        self.position, event.type, orjson.loads(orjson.dumps(event.data)),
                        dict(event.metadata),
                    )
                )  # fmt: skip
            stream.extend(records)
            new[append.stream_id] = records
        run_new = new.pop(run_stream(self.plan.run_id), [])
        steps_new = new.pop(steps_stream(self.plan.run_id), [])
        leases = {stream.removeprefix("lease-"): records for stream, records in new.items()}
        if self.agg is None:
            self.agg = fold(run_new, steps_new, leases)
        else:
            self.agg = extend(self.agg, run_new, steps_new, leases)

    def all_records(self) -> tuple[list[Record], list[Record], dict[str, list[Record]]]:
        run_id = self.plan.run_id
        leases = {a: list(self.streams[lease_stream(a)]) for a in self.agg.attempts}
        return self.streams[run_stream(run_id)], self.streams[steps_stream(run_id)], leases

    def lease(self, attempt_id: str):
        decision = grant_lease(self.agg, attempt_id, "w1", TTL_MS, self.now_ms)
        self.apply(decision)
        return decision.lease

    def finish(self, key: str, outcome: str) -> None:
        attempt_id = self.agg.steps[key].attempt_ids[-1]
        grant = self.lease(attempt_id)
        args = (attempt_id, grant.lease_id, grant.version)
        self.apply(mark_running(self.agg, *args, self.now_ms))
        self.apply(complete(self.agg, *args, outcome, None, None, self.now_ms))


def chain(n: int) -> dict[str, list[str]]:
    return {f"s{i:03d}": [f"s{i - 1:03d}"] if i else [] for i in range(n)}


def wide(n: int) -> dict[str, list[str]]:
    return {f"s{i:03d}": ["s000"] if i else [] for i in range(n)}


def frontier_wide() -> tuple[RunAggregate, int]:
    streams = Streams(make_plan(wide(STEPS)))
    streams.apply(decide_attempt_claims(streams.agg, streams.now_ms))
    streams.finish("s000", "succeeded")
    return streams.agg, streams.now_ms


def frontier_chain_failure() -> tuple[RunAggregate, int]:
    streams = Streams(make_plan(chain(STEPS)))
    streams.apply(decide_attempt_claims(streams.agg, streams.now_ms))
    streams.finish("s000", "failed")
    return streams.agg, streams.now_ms


def cancellation_mixed() -> tuple[RunAggregate, int]:
    """64 roots, each needed by one pending Step; roots in four states of 16:
    unleased claim, live lease, started (starting/running), expired lease."""
    needs = {f"r{i:03d}": [] for i in range(64)} | {f"d{i:03d}": [f"r{i:03d}"] for i in range(64)}
    streams = Streams(make_plan(needs))
    streams.apply(decide_attempt_claims(streams.agg, streams.now_ms))

    def attempt(i: int) -> str:
        return streams.agg.steps[f"r{i:03d}"].attempt_ids[-1]

    for i in range(48, 64):
        streams.lease(attempt(i))
    streams.now_ms += TTL_MS  # the leases of r048..r063 have expired
    for i in range(16, 48):
        grant = streams.lease(attempt(i))
        if i >= 32:
            start = mark_running if i % 2 else mark_starting
            streams.apply(
                start(streams.agg, attempt(i), grant.lease_id, grant.version, streams.now_ms)
            )
    streams.apply(request_cancel(streams.agg, "user", streams.now_ms))
    return streams.agg, streams.now_ms + 1


def cancellation_all_claims() -> tuple[RunAggregate, int]:
    streams = Streams(make_plan({f"s{i:03d}": [] for i in range(STEPS)}))
    streams.apply(decide_attempt_claims(streams.agg, streams.now_ms))
    streams.apply(request_cancel(streams.agg, "timeout", streams.now_ms))
    return streams.agg, streams.now_ms


def fold_records(target: int = 1_000) -> tuple[tuple, int]:
    """A wide Run driven Step by Step until its streams hold about `target` records."""
    streams = Streams(make_plan(wide(STEPS)))
    streams.apply(decide_attempt_claims(streams.agg, streams.now_ms))
    streams.finish("s000", "succeeded")
    streams.apply(decide_frontier(streams.agg, streams.now_ms))
    streams.apply(decide_attempt_claims(streams.agg, streams.now_ms))
    total = 0
    for i in range(1, STEPS):
        streams.finish(f"s{i:03d}", "succeeded" if i % 5 else "failed")
        run, steps, leases = streams.all_records()
        total = len(run) + len(steps) + sum(len(r) for r in leases.values())
        if total >= target:
            break
    return streams.all_records(), total


def measure(call: Callable[[], object], repeat: int) -> tuple[float, float]:
    """(median, min) µs per call over `repeat` rounds of enough calls to take ~50 ms."""
    start = time.perf_counter()
    call()
    once = max(time.perf_counter() - start, 1e-6)
    number = max(1, int(0.05 / once))
    rounds = []
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(number):
            call()
        rounds.append((time.perf_counter() - start) / number * 1e6)
    return statistics.median(rounds), min(rounds)


_ID_USERS = ("admission", "attempts", "cancellation", "decision", "frontier", "recovery", "worker")


def count_ids(call: Callable[[], object]) -> int:
    """How many ids `call` derives (one untimed call with a counting derive_id)."""
    modules = [importlib.import_module(f"domain.{name}") for name in _ID_USERS]
    count = 0

    def counting(prefix: str, *parts: object) -> str:
        nonlocal count
        count += 1
        return derive_id(prefix, *parts)

    for module in modules:
        module.derive_id = counting
    try:
        call()
    finally:
        for module in modules:
            module.derive_id = derive_id
    return count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--smoke", action="store_true", help="one round: does it still run")
    args = parser.parse_args()
    if args.smoke:
        args.repeat = 1

    parts = ("wcs:", "run-1", START_MS, "step", derive_id(STEP_RUN_ID, "run-1", "s000"), 3)
    id_us, id_best = measure(lambda: derive_id(*parts), args.repeat)
    rows = [
        {"name": "one id (domain.ids.derive_id)", "records": 1, "ids": 1, "us": id_us,
         "min_us": id_best, "target_us": None}
    ]  # fmt: skip

    def decision_row(name: str, scenario, decide, target: float | None = None) -> None:
        agg, now = scenario()
        decision = decide(agg, now)
        records = sum(len(a.events) for a in decision.appends)
        ids = count_ids(lambda: decide(agg, now))
        median, best = measure(lambda: decide(agg, now), args.repeat)
        rows.append(
            {"name": name, "records": records, "ids": ids, "us": median, "min_us": best,
             "target_us": target}
        )  # fmt: skip

    decision_row("frontier, wide (127 become ready)", frontier_wide, decide_frontier)
    decision_row(
        "frontier, chain (127 skipped + Run ends)", frontier_chain_failure, decide_frontier
    )
    decision_row(
        "cancellation, mixed states (32 blocked)", cancellation_mixed, decide_cancellation,
        CANCELLATION_TARGET_US,
    )  # fmt: skip
    decision_row(
        "cancellation, 128 unleased claims (timeout): most records", cancellation_all_claims,
        decide_cancellation, CANCELLATION_TARGET_US,
    )  # fmt: skip
    decision_row("attempt admission, 128 ready", fresh_roots, decide_attempt_claims)

    streams, total = fold_records()
    median, best = measure(lambda: fold(*streams), args.repeat)
    rows.append(
        {"name": f"fold of {total} records", "records": total, "ids": 0, "us": median,
         "min_us": best, "target_us": None}
    )  # fmt: skip
    for row in rows:
        row["id_share"] = row["ids"] * id_us / row["us"]

    table = Table(title=f"domain core, {STEPS}-Step workflow (median of {args.repeat} rounds)")
    columns = ("case", "records", "ids", "µs median", "µs min", "% in ids", "target µs", "ok")
    for column in columns:
        table.add_column(column, justify="left" if column == "case" else "right")
    for row in rows:
        target = row["target_us"]
        ok = "" if target is None else ("yes" if row["us"] <= target else "NO")
        table.add_row(
            row["name"],
            str(row["records"]),
            str(row["ids"]),
            _micros(row["us"]),
            _micros(row["min_us"]),
            f"{100 * row['id_share']:.0f}",
            "" if target is None else str(target),
            ok,
        )
    Console(width=130).print(table)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_bytes(
        orjson.dumps(
            {"python": platform.python_version(), "machine": platform.machine(), "rows": rows},
            option=orjson.OPT_INDENT_2,
        )
    )


def _micros(value: float) -> str:
    return f"{value:.1f}" if value < 100 else f"{value:.0f}"


def fresh_roots() -> tuple[RunAggregate, int]:
    streams = Streams(make_plan({f"s{i:03d}": [] for i in range(STEPS)}))
    return streams.agg, streams.now_ms


if __name__ == "__main__":
    main()
