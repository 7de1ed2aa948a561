"""The one contract both store adapters implement (SPEC §2, §8).

Usage::

    store = eventstore.open_store("sqlite:///qlflow.db")
    with store.transaction() as tx:          # SQLite: BEGIN IMMEDIATE; PostgreSQL: BEGIN
        run = tx.read_stream("run-r1")
        records = tx.append([StreamAppend("run-r1", len(run), (NewEvent(...),))])
        tx.execute("UPDATE runs SET ... WHERE run_id = ?", (...,))   # projections
    # leaving the block commits; an exception rolls everything back

`store.append(...)` is a one-call transaction. SQL passed to `tx.execute` (and
`tx.executemany`, `tx.query`) uses `?` placeholders on both dialects (the PostgreSQL
adapter translates them), so statements never contain a literal `?` or `%`.

Transactions do not nest: a second `store.transaction()` (or any other store call)
on a thread that has one open raises `StoreUsageError` — pass the open Transaction
down instead. If `tx.append` raises a conflict the transaction can only roll back.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

from domain.errors import QlflowError
from domain.records import Record, StreamAppend

MigrationStep = Mapping[str, str | Sequence[str]]
"""One schema step: dialect ("sqlite" | "postgresql") -> SQL statement(s)."""


class StoreUsageError(QlflowError, RuntimeError):
    """The store was used against its contract: a nested transaction on one thread, a
    transaction used after it ended or after a failed append, or a closed store."""


class Transaction(Protocol):
    """One open store transaction. Reads see the transaction's own writes."""

    @property
    def dialect(self) -> str:
        """Which database: "sqlite" or "postgresql"."""

    def append(self, appends: Sequence[StreamAppend]) -> list[Record]:
        """Append atomically with per-stream version CAS, or exactly replay."""

    def read_stream(self, stream_id: str, after_version: int = 0) -> list[Record]:
        """Events of one stream with stream_version > after_version, in order."""

    def read_streams(self, stream_ids: Sequence[str]) -> dict[str, list[Record]]:
        """Every event of each named stream, in version order, in one query."""

    def stream_versions(self, stream_ids: Sequence[str]) -> dict[str, int]:
        """Head version of each named stream (0 for a stream that does not exist)."""

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Any:
        """Run one statement (projection upkeep); returns a cursor."""

    def executemany(self, sql: str, seq_of_params: Iterable[Sequence[Any]]) -> None:
        """Run one statement once per parameter tuple (projection upkeep in bulk)."""

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple]:
        """Run one query and return all rows."""

    def read_all(self, after_position: int = 0, limit: int | None = None) -> list[Record]:
        """Events with global_position > after_position, in position order."""

    def streams_with_prefix(self, prefix: str) -> list[str]:
        """Ids of the existing streams starting with `prefix`, sorted."""

    def head_position(self) -> int:
        """Highest global position visible to this transaction (0 if none)."""


class EventStore(Protocol):
    """An append-only event store with per-stream version CAS."""

    @property
    def dialect(self) -> str: ...

    url: str

    def transaction(self) -> AbstractContextManager[Transaction]: ...

    def append(self, appends: Sequence[StreamAppend]) -> list[Record]: ...

    def read_stream(self, stream_id: str, after_version: int = 0) -> list[Record]: ...

    def read_streams(self, stream_ids: Sequence[str]) -> dict[str, list[Record]]: ...

    def session(self) -> AbstractContextManager[Transaction]:
        """A read session that takes no write lock (reads only)."""

    def read_all(self, after_position: int = 0, limit: int | None = None) -> list[Record]: ...

    def iter_all(self, after_position: int = 0, batch: int = 5000) -> Iterator[Record]: ...

    def stream_versions(self, stream_ids: Sequence[str]) -> dict[str, int]: ...

    def streams_with_prefix(self, prefix: str) -> list[str]: ...

    def head_position(self) -> int: ...

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple]: ...

    def migrate(self, component: str, steps: Sequence[MigrationStep]) -> int:
        """Apply the steps of `component` beyond its recorded schema version in one
        transaction; return the version now recorded. Raises SchemaError when the
        database records a newer version than `len(steps)`."""

    def close(self) -> None: ...
