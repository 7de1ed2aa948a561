"""The read-model modules and how records reach them.

Each projection module defines:

- `COMPONENT`: its schema component name (see `EventStore.migrate`);
- `MIGRATIONS`: its schema steps, each `{dialect: sql or [sql, ...]}`;
- `TABLES`: `{table: (key column, ...)}` — what `rebuild` recreates and `verify` compares;
- `GRANTS`: `{table: {role kind: privileges}}` for every table it creates — what each
  least-privilege role may do with it (`eventstore.grants`; applied by `actors.roles`);
- `STREAM_PREFIXES`: the stream id prefixes whose records it folds;
- `apply(tx, records)`: update its tables for records just appended, in the
  append's transaction. It must be deterministic and depend only on the records
  and the tables' current rows (and the log), so that a replay of the log gives the
  same rows. A module that sets `TAKES_FOLDED = True` is also given `folded`: run
  id -> the Run's aggregate as the writer's decisions leave it, after these records,
  for the Runs the writer has (it may use them instead of folding the Runs again;
  the answer must be the same).

It may also define `Replay(tx, insert)`, the rebuild's way to fold the whole log
batch after batch (`apply(records)`, then `flush()`): free to hold rows in memory and
to write new ones in bulk with `insert(table, columns, rows)`, it must leave exactly
the rows `apply` would. Without one the rebuild calls `apply` per batch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import ModuleType

from domain.aggregate import RunAggregate
from domain.records import Record
from eventstore import faults
from eventstore.grants import ServerFunction
from eventstore.validation import encode_appends, record_from_event


def modules() -> tuple[ModuleType, ...]:
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


def migrate_all(store) -> None:
    """Bring every projection schema up to date (idempotent). A module that defines
    `backfill(store, from_version)` fills, after an upgrade from `from_version`, what
    its schema steps could not compute."""
    upgraded = []
    for module in modules():
        before = store.schema_version(module.COMPONENT)
        if store.migrate(module.COMPONENT, module.MIGRATIONS) > before:
            upgraded.append((module, before))
    for module, before in upgraded:
        backfill = getattr(module, "backfill", None)
        if backfill is not None:
            backfill(store, before)


Folded = Mapping[str, RunAggregate]
"""Run id -> the Run's aggregate after the records being applied (see above)."""


def apply_records(tx, records: Sequence[Record], folded: Folded | None = None) -> None:
    """Route freshly appended records to the modules that fold them."""
    if not records:
        return
    for module in modules():
        mine = [r for r in records if r.stream_id.startswith(module.STREAM_PREFIXES)]
        if mine and getattr(module, "TAKES_FOLDED", False):
            module.apply(tx, mine, folded=folded)
        elif mine:
            module.apply(tx, mine)


def commit(tx, appends, folded: Folded | None = None) -> list[Record]:
    """Append through the store and update the read models in the same transaction
    (`folded`: the Runs as the appends leave them, where the writer has them)."""
    return commit_encoded(tx, encode_appends(appends), folded)


def commit_through(tx, function, args, appends, folded: Folded | None = None) -> list[Record]:
    """`commit` with the append made through the server-side function `function`
    (`Transaction.append_through`)."""
    batch = encode_appends(appends)
    read_ahead(tx, batch)
    records = tx.append_through(function, args, batch)
    apply_records(tx, records, folded)
    faults.hit_append()
    return records


def read_ahead(tx, batch) -> None:
    """Ask the store to send what the read models' upkeep of `batch` reads first with
    the append (`Transaction.read_ahead`: one round trip for both on PostgreSQL). A
    module that defines `reads_ahead(records)` names those queries; the records are
    the batch's (their positions unknown yet, and no query depends on them)."""
    modules_ahead = [m for m in modules() if hasattr(m, "reads_ahead")]
    if not modules_ahead or not batch.events:
        return
    records = [record_from_event(event, 0) for event in batch.events]
    queries = []
    for module in modules_ahead:
        mine = [r for r in records if r.stream_id.startswith(module.STREAM_PREFIXES)]
        if mine:
            queries += module.reads_ahead(mine)
    if queries:
        tx.read_ahead(queries)


def commit_encoded(tx, batch, folded: Folded | None = None) -> list[Record]:
    """`commit` for appends already validated and encoded (`encode_appends`)."""
    read_ahead(tx, batch)
    records = tx.append_encoded(batch)
    apply_records(tx, records, folded)
    faults.hit_append()
    return records
