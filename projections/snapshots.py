"""Snapshots of running Runs' folded aggregates (docs/DESIGN.md, "Snapshots").

`run_snapshots` holds one row per running Run: the aggregate as a writer's append
leaves it (`snapshot_document`), with the Run and StepRun stream versions it is
folded at, written in that append's transaction whenever the append takes the
Run stream past a multiple of `SNAPSHOT_EVERY` events. A Run's terminal event
deletes its row (nothing decides about a finished Run). It is not a read model
compared row by row: `verify` proves each row equals the fold of the log up to its
versions, and `rebuild` drops them all (the next appends write them again).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from domain import streams
from domain.aggregate import RunAggregate, fold
from domain.errors import CorruptionError
from domain.event_types import Family, of
from domain.records import Record
from domain.snapshot import aggregate_from_snapshot, snapshot_document
from domain.streams import run_stream
from domain.transitions import RUN_RUNNING, RUN_TERMINAL
from eventstore.api import Reads, Transaction
from eventstore.grants import AUDIT, MOVE, READ, RUNTIME
from eventstore.in_lists import chunks, marks
from projections.contract import Folded, Insert
from projections.run_streams import claimed_attempt_ids, read_whole_runs

COMPONENT = "projections.snapshots"
STREAM_PREFIXES = (streams.prefix(streams.RUN),)
TABLE = "run_snapshots"
SNAPSHOT_EVERY = 64  # Run stream events between snapshots (bench/snapshots.py)

_CREATE = """CREATE TABLE run_snapshots (
    run_id TEXT PRIMARY KEY,
    run_version INTEGER NOT NULL,
    steps_version INTEGER NOT NULL,
    document TEXT NOT NULL
)"""
MIGRATIONS = [{"sqlite": [_CREATE], "postgresql": [_CREATE.replace("INTEGER", "BIGINT")]}]
TABLES: dict[str, tuple[str, ...]] = {}  # checked by verify against the log, not replayed
# the runtime deletes a finished Run's snapshot: a cache it may already overwrite
backfill = None  # nothing to fill after an upgrade
reads_ahead = None  # apply reads nothing worth sending ahead
reads_ahead_of_runs = None
GRANTS = {TABLE: {RUNTIME: (*MOVE, "DELETE"), AUDIT: READ}}
_TERMINAL = frozenset(of(Family.WORKFLOW, status) for status in RUN_TERMINAL)


def apply(tx: Transaction, records: Sequence[Record], folded: Folded | None = None) -> None:
    """Write a Run's aggregate after these records (`folded`, where the writer has it)
    as its snapshot when they take the Run stream past a multiple of SNAPSHOT_EVERY;
    delete the snapshot of a Run that ended."""
    ended = sorted({streams.entity_id(r.stream_id) for r in records if r.type in _TERMINAL})
    for chunk in chunks(ended):
        # answers nothing: a store sends it with its next statement or COMMIT
        tx.executemany(f"DELETE FROM run_snapshots WHERE run_id IN ({marks(chunk)})", [chunk])
    if not folded:
        return
    added: dict[str, int] = {}
    for record in records:
        if streams.category(record.stream_id) == streams.RUN:
            added[record.stream_id] = added.get(record.stream_id, 0) + 1
    for run_id in sorted(folded):
        after = folded[run_id]
        count = added.get(run_stream(run_id), 0)
        if not count or after.run.status != RUN_RUNNING or run_id in ended:
            continue
        if (after.version - count) // SNAPSHOT_EVERY != after.version // SNAPSHOT_EVERY:
            write(tx, after)


class Replay:
    """The rebuild's fold of snapshots: none. They are no read model replayed from the
    log (`TABLES` is empty): `rebuild` drops them, `verify` checks the live ones."""

    folds_nothing = True  # the rebuild hands it no records at all

    def __init__(self, tx: Transaction, insert: Insert) -> None:
        del tx, insert

    def apply(self, records: Sequence[Record]) -> None:
        """Nothing is folded."""

    def flush(self) -> None:
        """Nothing is held."""


def write(tx: Transaction, aggregate: RunAggregate) -> None:
    """Store `aggregate` as its Run's snapshot (replacing any older one)."""
    document = orjson.dumps(snapshot_document(aggregate), option=orjson.OPT_SORT_KEYS).decode()
    tx.execute(
        "INSERT INTO run_snapshots (run_id, run_version, steps_version, document) "
        "VALUES (?, ?, ?, ?) ON CONFLICT (run_id) DO UPDATE SET run_version = "
        "excluded.run_version, steps_version = excluded.steps_version, "
        "document = excluded.document",
        (aggregate.run_id, aggregate.version, aggregate.steps_version, document),
    )


def read(tx: Reads, run_id: str) -> Any | None:
    """The stored snapshot document of `run_id` as decoded JSON (None: there is none,
    or it is not JSON — the caller folds the whole log then)."""
    return read_many(tx, [run_id]).get(run_id)


def read_many(tx: Reads, run_ids: Sequence[str]) -> dict[str, Any]:
    """The stored snapshot documents of those of `run_ids` that have one, as decoded
    JSON (a document that is not JSON is left out), in one query per 500 Runs."""
    found: dict[str, Any] = {}
    for chunk in chunks(run_ids):
        rows = tx.query(
            f"SELECT run_id, document FROM run_snapshots WHERE run_id IN ({marks(chunk)})",
            chunk,
        )
        for run_id, text in rows:
            try:
                found[run_id] = orjson.loads(text)
            except orjson.JSONDecodeError:
                continue
    return found


def check(tx: Reads, table: str) -> list[tuple[str, int, int, str]]:
    """Every snapshot in `table` (a qualified name) that is not the fold of the log up
    to its versions, as (run id, run version, steps version, what is wrong)."""
    problems = []
    rows = tx.query(f"SELECT run_id, run_version, steps_version, document FROM {table}")
    for run_id, run_version, steps_version, text in sorted(rows):
        problem = _problem(tx, run_id, run_version, steps_version, text)
        if problem is not None:
            problems.append((run_id, run_version, steps_version, problem))
    return problems


def _problem(tx: Reads, run_id: str, run_version: int, steps_version: int, text: str) -> str | None:
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
    run_records, step_records, leases = read_whole_runs(tx, [run_id])[run_id]
    claimed = claimed_attempt_ids(run_records[:run_version])
    try:
        whole = fold(
            run_records[:run_version],
            step_records[:steps_version],
            {a: leases[a][: snapshot.lease_versions.get(a, 0)] for a in claimed},
        )
    except CorruptionError as error:
        return f"the log up to its versions does not fold: {error}"
    differ = [
        name
        for name in ("run", "steps", "attempts", "steps_version", "lease_versions", "topo_order")
        if getattr(whole, name) != getattr(snapshot, name)
    ]
    return f"differs from the fold of the log in {', '.join(differ)}" if differ else None
