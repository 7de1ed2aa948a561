"""The projection contract: what every read-model module declares, as a type the
checker holds each module in `projections.registry.modules` to (docs/DESIGN.md
"Projections")."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from domain.aggregate import RunAggregate
from domain.records import Record
from eventstore.api import EventStore, Transaction

Folded = Mapping[str, RunAggregate]
"""Run id -> the Run's aggregate after the records being applied, where the writer
has it: a module may use it instead of folding the Run again (same answer)."""

Insert = Callable[[str, Sequence[str], list[tuple[Any, ...]]], None]
"""`insert(table, columns, rows)`: a rebuild's bulk write of new rows."""

Migrations = Sequence[Mapping[str, str | Sequence[str]]]
"""Schema steps, each `{dialect: sql or [sql, ...]}` (see `EventStore.migrate`)."""


ReadsAhead = Callable[[Sequence[Record], Folded | None], Sequence[tuple[str, Sequence[Any]]]]
"""`reads_ahead(records, folded)`: the queries (sql, params) `apply(tx, records,
folded)` reads first."""

ReadsAheadOfRuns = Callable[[Sequence[str], Sequence[str]], Sequence[tuple[str, Sequence[Any]]]]
"""`reads_ahead_of_runs(run_ids, attempt_ids)`: the queries `apply` reads first for
the records a write on these Runs usually makes (records of the Runs naming these of
their Attempts), known before the write is decided."""


class Replayer(Protocol):
    """A module's fold of the whole log in a rebuild: batch after batch, then `flush`.

    Optional attributes the rebuild reads (`projections.rebuild`): `folds_nothing`
    (True: handed no records), `apply_rows(rows, record_of)` (handed the stored rows
    of every record of a batch instead of `apply`: it passes over those outside its
    `STREAM_PREFIXES` itself and makes records, `record_of(row)`, only of the rows it
    reads as records), `keyed_only` (the tables whose copies it reads and writes by key
    alone: made without their non-unique indexes)."""

    def apply(self, records: Sequence[Record]) -> None: ...

    def flush(self) -> None: ...


class Projection(Protocol):
    """A read-model module.

    - `COMPONENT`, `MIGRATIONS`: its schema component and steps;
    - `TABLES`: `{table: (key column, ...)}`, what `rebuild` recreates and `verify`
      compares;
    - `GRANTS`: `{table: {role kind: privileges}}` for every table it creates
      (`eventstore.grants`, applied by `actors.roles`);
    - `STREAM_PREFIXES`: the stream id prefixes whose records it folds;
    - `apply(tx, records, folded)`: update its tables for records just appended, in
      the append's transaction; deterministic, depending only on the records, the
      tables' rows and the log, so a replay gives the same rows;
    - `Replay(tx, insert)` or None: the rebuild's fold, which must leave exactly the
      rows `apply` would (None: the rebuild calls `apply` per batch);
    - `backfill(store, from_version)` or None: fills, after an upgrade from
      `from_version`, what its schema steps could not compute;
    - `reads_ahead(records, folded)` or None: the queries `apply` of these records
      reads first, which a writer may send with its append (`Transaction.read_ahead`);
    - `reads_ahead_of_runs(run_ids, attempt_ids)` or None: the same, guessed before
      a write on those Runs is decided, for a writer to send with the read it decides
      on (a guess that misses costs the round trip `reads_ahead` would have saved).
    """

    @property
    def COMPONENT(self) -> str: ...

    @property
    def MIGRATIONS(self) -> Migrations: ...

    @property
    def TABLES(self) -> Mapping[str, tuple[str, ...]]: ...

    @property
    def GRANTS(self) -> Mapping[str, Mapping[str, tuple[str, ...]]]: ...

    @property
    def STREAM_PREFIXES(self) -> tuple[str, ...]: ...

    @property
    def Replay(self) -> Callable[[Transaction, Insert], Replayer] | None: ...

    @property
    def backfill(self) -> Callable[[EventStore, int], object] | None: ...

    @property
    def reads_ahead(self) -> ReadsAhead | None: ...

    @property
    def reads_ahead_of_runs(self) -> ReadsAheadOfRuns | None: ...

    def apply(
        self, tx: Transaction, records: Sequence[Record], folded: Folded | None = None
    ) -> None: ...
