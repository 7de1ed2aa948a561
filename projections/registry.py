"""The read-model modules and how records reach them. What each module declares is
`projections.contract.Projection`; `modules()` is checked against it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from domain.records import Record, StreamAppend
from eventstore import faults
from eventstore.api import PENDING_POSITION, EventStore, Transaction
from eventstore.grants import ServerFunction
from eventstore.validation import EncodedBatch, encode_appends, record_from_event
from projections.contract import Folded, Projection


def modules() -> tuple[Projection, ...]:
    """All projection modules, in the order their records are applied."""
    from projections import (
        limits,
        notifications,
        publications,
        retention,
        runs,
        schedules,
        snapshots,
    )

    return (publications, runs, schedules, snapshots, retention, notifications, limits)


def functions() -> tuple[ServerFunction, ...]:
    """The server-side functions the projection layer needs installed where
    least-privilege roles are set up (see `actors.roles`)."""
    from projections import (
        admission_guard,
        admission_source,
        admitted_plans,
        published_revisions,
    )

    return (
        *admission_source.FUNCTIONS,
        *admitted_plans.FUNCTIONS,
        *admission_guard.FUNCTIONS,
        *published_revisions.FUNCTIONS,
    )


def migrate_all(store: EventStore) -> None:
    """Bring every projection schema up to date (idempotent), then let each upgraded
    module with a `backfill` fill what its schema steps could not compute."""
    upgraded: list[tuple[Projection, int]] = []
    for module in modules():
        before = store.schema_version(module.COMPONENT)
        if store.migrate(module.COMPONENT, module.MIGRATIONS) > before:
            upgraded.append((module, before))
    for module, before in upgraded:
        if module.backfill is not None:
            module.backfill(store, before)


def apply_records(tx: Transaction, records: Sequence[Record], folded: Folded | None = None) -> None:
    """Route freshly appended records to the modules that fold them."""
    if not records:
        return
    for module in modules():
        mine = [r for r in records if r.stream_id.startswith(module.STREAM_PREFIXES)]
        if mine:
            module.apply(tx, mine, folded)


def commit(
    tx: Transaction,
    appends: Sequence[StreamAppend],
    folded: Folded | None = None,
    *,
    at_commit: bool = False,
) -> list[Record]:
    """Append through the store and update the read models in the same transaction
    (`folded`: the Runs as the appends leave them, where the writer has them;
    `at_commit`: see `commit_encoded`)."""
    return commit_encoded(tx, encode_appends(appends), folded, at_commit=at_commit)


def commit_through(
    tx: Transaction,
    function: str,
    args: Sequence[Any],
    appends: Sequence[StreamAppend],
    folded: Folded | None = None,
) -> list[Record]:
    """`commit` with the append made through the server-side function `function`
    (`Transaction.append_through`)."""
    batch = encode_appends(appends)
    read_ahead(tx, batch)
    records = tx.append_through(function, args, batch)
    apply_records(tx, records, folded)
    faults.hit_append()
    return records


def read_ahead(tx: Transaction, batch: EncodedBatch, folded: Folded | None = None) -> None:
    """Ask the store to send what the read models' upkeep of `batch` reads first with
    the append (`Transaction.read_ahead`: one round trip for both on PostgreSQL). A
    module with `reads_ahead(records)` names those queries; the records are the
    batch's (their positions unknown yet, and no query depends on them)."""
    if batch.events and tx.sends_reads_ahead:
        records = [record_from_event(event, PENDING_POSITION) for event in batch.events]
        _read_ahead(tx, records, folded)


def _read_ahead(tx: Transaction, records: Sequence[Record], folded: Folded | None) -> None:
    modules_ahead = [m for m in modules() if m.reads_ahead is not None]
    if not modules_ahead or not records or not tx.sends_reads_ahead:
        return
    queries: list[tuple[str, Sequence[Any]]] = []
    for module in modules_ahead:
        mine = [r for r in records if r.stream_id.startswith(module.STREAM_PREFIXES)]
        if mine and module.reads_ahead is not None:
            queries += module.reads_ahead(mine, folded)
    if queries:
        tx.read_ahead(queries)


def commit_encoded(
    tx: Transaction, batch: EncodedBatch, folded: Folded | None = None, *, at_commit: bool = False
) -> list[Record]:
    """`commit` for appends already validated and encoded (`encode_appends`).

    `at_commit`: the store may send the append with COMMIT
    (`Transaction.append_at_commit`; the records returned may then carry
    `PENDING_POSITION`). For a writer to whom a refusal is a conflict to decide again,
    never an exact replay to answer: one that decided under its streams' locks, or
    that tries its whole unit again (a start: the next try finds the receipt)."""
    if at_commit:
        # queued where the store defers it: the reads go with it all the same
        records = tx.append_at_commit(batch)
        _read_ahead(tx, records, folded)
    else:
        read_ahead(tx, batch, folded)
        records = tx.append_encoded(batch)
    apply_records(tx, records, folded)
    faults.hit_append()
    return records


def read_ahead_of_runs(tx: Transaction, run_ids: Sequence[str], attempt_ids: Sequence[str]) -> None:
    """Before a write on these Runs is decided: ask the store to send, with the read it
    decides on, what the read models' upkeep of its records will likely read (records
    of these Runs naming these Attempts of theirs). Where the guess holds, the append
    needs no read of its own and can go with COMMIT (docs/DESIGN.md "Two round trips")."""
    if not run_ids or not tx.sends_reads_ahead:
        return
    queries: list[tuple[str, Sequence[Any]]] = []
    for module in modules():
        if module.reads_ahead_of_runs is not None:
            queries += module.reads_ahead_of_runs(run_ids, attempt_ids)
    if queries:
        tx.read_ahead(queries)
