"""Snapshots of running Runs' folded aggregates (docs/DESIGN.md, "Snapshots").

`run_snapshots` holds one row per running Run: the aggregate a writer folded just
before an append (`snapshot_document`), with the Run and StepRun stream versions it
was folded at, written in that append's transaction whenever the append takes the
Run stream past a multiple of `SNAPSHOT_EVERY` events. A Run's terminal event
deletes its row (nothing decides about a finished Run). It is not a read model
compared row by row: `verify` proves each row equals the fold of the log up to its
versions, and `rebuild` drops them all (the next appends write them again).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from domain.aggregate import RunAggregate, fold, lease_stream, run_stream, steps_stream
from domain.errors import CorruptionError
from domain.records import Record
from domain.snapshot import aggregate_from_snapshot, snapshot_document
from domain.transitions import RUN_RUNNING, RUN_TERMINAL
from eventstore.grants import AUDIT, MOVE, READ, RUNTIME

COMPONENT = "projections.snapshots"
STREAM_PREFIXES = ("run-",)
TABLE = "run_snapshots"
SNAPSHOT_EVERY = 32  # Run stream events between snapshots (bench/snapshots.py)

_CREATE = """CREATE TABLE run_snapshots (
    run_id TEXT PRIMARY KEY,
    run_version INTEGER NOT NULL,
    steps_version INTEGER NOT NULL,
    document TEXT NOT NULL
)"""
MIGRATIONS = [{"sqlite": [_CREATE], "postgresql": [_CREATE.replace("INTEGER", "BIGINT")]}]
TABLES: dict[str, tuple[str, ...]] = {}  # checked by verify against the log, not replayed
# the runtime deletes a finished Run's snapshot: a cache it may already overwrite
GRANTS = {TABLE: {RUNTIME: (*MOVE, "DELETE"), AUDIT: READ}}
TAKES_FOLDED = True  # see projections.registry
_TERMINAL = frozenset(f"workflow.{status}" for status in RUN_TERMINAL)


def apply(tx, records: Sequence[Record], folded: RunAggregate | None = None) -> None:
    """Write `folded` as its Run's snapshot when these records take the Run stream past
    a multiple of SNAPSHOT_EVERY; delete the snapshot of a Run that ended."""
    ended = {r.stream_id.removeprefix("run-") for r in records if r.type in _TERMINAL}
    for run_id in sorted(ended):
        tx.execute("DELETE FROM run_snapshots WHERE run_id = ?", (run_id,))
    if folded is None or folded.run.status != RUN_RUNNING or folded.run_id in ended:
        return
    stream_id = run_stream(folded.run_id)
    added = sum(1 for r in records if r.stream_id == stream_id)
    if folded.version // SNAPSHOT_EVERY == (folded.version + added) // SNAPSHOT_EVERY:
        return
    write(tx, folded)


def write(tx, aggregate: RunAggregate) -> None:
    """Store `aggregate` as its Run's snapshot (replacing any older one)."""
    document = orjson.dumps(snapshot_document(aggregate), option=orjson.OPT_SORT_KEYS).decode()
    tx.execute(
        "INSERT INTO run_snapshots (run_id, run_version, steps_version, document) "
        "VALUES (?, ?, ?, ?) ON CONFLICT (run_id) DO UPDATE SET run_version = "
        "excluded.run_version, steps_version = excluded.steps_version, "
        "document = excluded.document",
        (aggregate.run_id, aggregate.version, aggregate.steps_version, document),
    )


def read(tx, run_id: str) -> Any | None:
    """The stored snapshot document of `run_id` as decoded JSON (None: there is none,
    or it is not JSON — the caller folds the whole log then)."""
    rows = tx.query("SELECT document FROM run_snapshots WHERE run_id = ?", (run_id,))
    if not rows:
        return None
    try:
        return orjson.loads(rows[0][0])
    except orjson.JSONDecodeError:
        return None


def check(tx, table: str) -> list[tuple[str, int, int, str]]:
    """Every snapshot in `table` (a qualified name) that is not the fold of the log up
    to its versions, as (run id, run version, steps version, what is wrong)."""
    problems = []
    rows = tx.query(f"SELECT run_id, run_version, steps_version, document FROM {table}")
    for run_id, run_version, steps_version, text in sorted(rows):
        problem = _problem(tx, run_id, run_version, steps_version, text)
        if problem is not None:
            problems.append((run_id, run_version, steps_version, problem))
    return problems


def _problem(tx, run_id: str, run_version: int, steps_version: int, text: str) -> str | None:
    try:
        snapshot = aggregate_from_snapshot(orjson.loads(text))
    except (orjson.JSONDecodeError, CorruptionError) as error:
        return f"it does not decode: {error}"
    if (snapshot.run_id, snapshot.version, snapshot.steps_version) != (
        run_id,
        run_version,
        steps_version,
    ):
        return "its row's versions are not its document's"
    found = tx.read_streams([run_stream(run_id), steps_stream(run_id)])
    run_records = found[run_stream(run_id)][:run_version]
    claimed = [r.data["attempt_id"] for r in run_records if r.type == "attempt.claimed"]
    leases = tx.read_streams([lease_stream(a) for a in claimed]) if claimed else {}
    try:
        whole = fold(
            run_records,
            found[steps_stream(run_id)][:steps_version],
            {a: leases[lease_stream(a)][: snapshot.lease_versions.get(a, 0)] for a in claimed},
        )
    except CorruptionError as error:
        return f"the log up to its versions does not fold: {error}"
    differ = [
        name
        for name in ("run", "steps", "attempts", "steps_version", "lease_versions", "topo_order")
        if getattr(whole, name) != getattr(snapshot, name)
    ]
    return f"differs from the fold of the log in {', '.join(differ)}" if differ else None
