"""The one contract both store adapters implement.

Usage::

    store = eventstore.open_store("sqlite:///qlflow.db")
    with store.transaction() as tx:          # SQLite: BEGIN IMMEDIATE; PostgreSQL: BEGIN
        run = tx.read_stream("run-r1")
        records = tx.append([StreamAppend("run-r1", len(run), (NewEvent(...),))])
        tx.execute("UPDATE runs SET ... WHERE run_id = ?", (...,))   # projections
    # leaving the block commits; an exception rolls everything back

`store.append(...)` is a one-call transaction. SQL passed to `tx.execute` (and
`tx.executemany`, `tx.query`) uses `?` placeholders on both stores (the PostgreSQL
adapter translates them), so statements never contain a literal `?` or `%`.

Transactions do not nest: a second `store.transaction()` (or any other store call)
on a thread that has one open raises `StoreUsageError` — pass the open Transaction
down instead. If `tx.append` raises a conflict the transaction can only roll back.

Locks. Callers name what they serialize on, and the store decides how: `lock(key)`
waits (bounded by the store's lock timeout, then `LockTimeout`), `try_lock(keys)`
never waits (all or nothing), `try_lock_each(keys)` never waits and says which it
took, `lock_heads(streams, wait=...)` and `lock_heads_each(streams)` row-lock stream
heads. On SQLite every
write transaction holds the database's one write lock already, so these cost
nothing there; on PostgreSQL they are transaction-scoped advisory and row locks.
Every lock is released when the transaction ends.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, NamedTuple, Protocol

from domain.errors import QlflowError
from domain.records import Record, StreamAppend
from eventstore.observers import Observers
from eventstore.validation import EncodedBatch

PENDING_POSITION = 0
"""The position of a record whose append is not sent yet (`Transaction.append_at_commit`):
positions start at 1."""


class LockJoin(NamedTuple):
    """`Transaction.try_lock_join`'s SQL: `join` after the FROM table, `suffix` last."""

    join: str
    suffix: str


MigrationStep = Mapping[str, str | Sequence[str]]
"""One schema step: store kind ("sqlite" | "postgresql") -> SQL statement(s)."""

Row = tuple[Any, ...]


class StoreUsageError(QlflowError, RuntimeError):
    """The store was used against its contract: a nested transaction on one thread, a
    transaction used after it ended or after a failed append, lock or call, or a
    closed store."""


class Reads(Protocol):
    """What a store, a read session and a transaction can all read."""

    def clock_ms(self) -> int:
        """The store's time (see `Transaction.clock_ms` and `EventStore.clock_ms`)."""
        ...

    def read_stream(self, stream_id: str, after_version: int = 0) -> list[Record]:
        """Events of one stream with stream_version > after_version, in order."""
        ...

    def read_streams(self, stream_ids: Sequence[str]) -> dict[str, list[Record]]:
        """Every event of each named stream, in version order, in one query."""
        ...

    def read_streams_after(self, after: Mapping[str, int]) -> dict[str, list[Record]]:
        """Events of each named stream after its given version, in version order."""
        ...

    def stream_versions(self, stream_ids: Sequence[str]) -> dict[str, int]:
        """Head version of each named stream (0 for a stream that does not exist)."""
        ...

    def read_all(self, after_position: int = 0, limit: int | None = None) -> list[Record]:
        """Events with global_position > after_position, in position order."""
        ...

    def streams_with_prefix(self, prefix: str) -> list[str]:
        """Ids of the existing streams starting with `prefix`, sorted."""
        ...

    def head_position(self) -> int:
        """Highest global position visible (0 if none)."""
        ...

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        """Run one query and return all rows."""
        ...

    def query_all(
        self, queries: Sequence[tuple[str, Sequence[Any]]], *, prepared: bool = False
    ) -> list[list[Row]]:
        """Run independent queries and return each one's rows, in one round trip where
        the store can. `prepared`: they are lookups by key, whose plan does not depend
        on the values (a store may keep their plans: PostgreSQL prepares them)."""
        ...


class Transaction(Reads, Protocol):
    """One open store transaction (or read session). Reads see its own writes."""

    def append(self, appends: Sequence[StreamAppend]) -> list[Record]:
        """Append atomically with per-stream version CAS, or exactly replay."""
        ...

    def append_encoded(self, batch: EncodedBatch) -> list[Record]:
        """`append` for a batch already validated by `validation.encode_appends`."""
        ...

    def append_through(
        self, function: str, args: Sequence[Any], batch: EncodedBatch
    ) -> list[Record]:
        """`append_encoded` through a server-side definer function that checks its own
        rule first (PostgreSQL); plainly where the database has no functions."""
        ...

    def append_at_commit(self, batch: EncodedBatch) -> list[Record]:
        """`append_encoded` for a writer to whom a refusal is a conflict to decide again,
        never an exact replay to answer (it holds the locks of the batch's streams, or
        tries its whole unit again): a store may send the append with the statements
        after it and COMMIT (PostgreSQL: one round trip for all). Records returned
        before it was sent carry `PENDING_POSITION`; `appended` gets them with their
        positions at COMMIT. A refusal then aborts the transaction and raises at the
        next statement that waits for an answer, or at COMMIT (VersionConflict, or
        IdempotencyConflict for an event id stored elsewhere)."""
        ...

    def try_lock_join(self, name_sql: str) -> LockJoin:
        """SQL for a SELECT that reads only rows whose lock (named by the SQL text
        expression `name_sql` over the row) no other transaction holds, taking each:
        `join` after the FROM table, `suffix` after the LIMIT, which counts only rows
        whose lock was taken (PostgreSQL: a lock row FOR UPDATE SKIP LOCKED; SQLite:
        empty, its write transactions exclude each other)."""
        ...

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Any:
        """Run one statement (projection upkeep); returns a cursor."""
        ...

    def executemany(self, sql: str, seq_of_params: Iterable[Sequence[Any]]) -> None:
        """Run one statement once per parameter tuple (projection upkeep in bulk)."""
        ...

    def upsert(
        self,
        table: str,
        columns: Sequence[str],
        key: Sequence[str],
        rows: Sequence[Sequence[Any]],
        *,
        stored: Sequence[Sequence[Any] | None] | None = None,
    ) -> None:
        """Insert rows into `table`, each replacing the row with its `key`, in one
        statement where the store can (projection upkeep in bulk). `stored`, one per
        row: the row's values as the transaction read them (None: no row with that
        key); a store may then write only the columns that differ."""
        ...

    def lock(self, key: str) -> None:
        """Hold the lock named `key` until this transaction ends, waiting for it at
        most the store's lock timeout (then `LockTimeout`; the transaction can only
        roll back)."""
        ...

    def lock_all(self, keys: Sequence[str]) -> None:
        """`lock` every key, in key order (one statement where the store can)."""
        ...

    def clock_ms(self) -> int:
        """The store's time for this transaction: PostgreSQL's `clock_timestamp()` read in
        the round trip of its first statement (asked for before any, it costs one of its
        own); SQLite's host clock now."""
        ...

    def try_lock(self, keys: Sequence[str]) -> bool:
        """Take every lock named in `keys` without waiting: True when all are held
        now, False when another transaction holds one (give this transaction up)."""
        ...

    def lock_heads(self, stream_ids: Sequence[str], *, wait: bool) -> dict[str, int] | None:
        """Row-lock the named stream heads in stream id order and return each head
        version (0 for a stream that does not exist, which cannot be locked). With
        `wait=False`, None when another transaction holds one of them; with
        `wait=True`, wait (bounded like `lock`)."""
        ...

    def lock_ahead(self, keys: Sequence[str], stream_ids: Sequence[str]) -> None:
        """`lock_all(keys)`, then `lock_heads(stream_ids, wait=True)`, answering
        nothing: a store may send them with the next statement, where a `LockTimeout`
        then surfaces (PostgreSQL does: one round trip for the locks and the read
        after them)."""
        ...

    def try_lock_each(self, keys: Sequence[str]) -> frozenset[str]:
        """Try each lock named in `keys` on its own, never waiting: the names taken
        (one another transaction holds is left out). One statement on PostgreSQL."""
        ...

    def try_lock_each_ahead(self, keys: Sequence[str]) -> Callable[[], frozenset[str]]:
        """`try_lock_each(keys)`, sent with the next statement where the store can; the
        function returned answers as `try_lock_each` would."""
        ...

    def lock_heads_each(self, stream_ids: Sequence[str]) -> dict[str, int]:
        """Row-lock each named stream head no other transaction holds, never waiting:
        the versions of those taken (0 for a stream that does not exist); one held
        elsewhere is left out."""
        ...

    def lock_heads_each_ahead(self, stream_ids: Sequence[str]) -> Callable[[], dict[str, int]]:
        """`lock_heads_each(stream_ids)`, sent with the next statement where the store
        can; the function returned answers as that would."""
        ...

    def stream_versions_ahead(self, stream_ids: Sequence[str]) -> Callable[[], dict[str, int]]:
        """`stream_versions(stream_ids)`, sent with the next statement where the store
        can (before it, after the locks queued by `lock_ahead`); the function returned
        answers as that would."""
        ...

    def read_ahead(self, queries: Sequence[tuple[str, Sequence[Any]]]) -> None:
        """Queries a `query_all` of exactly these asks for next, before anything but an
        append is written: a store may send them with the next statement and answer
        that `query_all` from them (PostgreSQL does; SQLite ignores this)."""
        ...

    @property
    def sends_reads_ahead(self) -> bool:
        """Whether `read_ahead` sends anything here (a caller that would build the
        queries only for it may skip them where it does not)."""
        ...

    def function_comment(self, signature: str) -> str | None:
        """The comment of the server-side function `signature` ("name(text)") if the
        database has that function ("" without a comment), else None. A database
        without server-side functions (SQLite) answers None."""
        ...

    def call(self, function: str, args: Sequence[Any] = ()) -> Any:
        """Call the server-side function `function` with `args` and return its value;
        lock waits inside it are bounded like `lock`. SQLite has none
        (StoreUsageError)."""
        ...


class ReplaySession(Protocol):
    """A private connection on which read models are rebuilt beside the live ones.

    `copy_tables` creates empty copies of projection tables that shadow the live
    ones on this connection only, so folds run through `tx` write the copies while
    every other connection still sees the live tables. See `eventstore.replay`."""

    @property
    def tx(self) -> Transaction:
        """The transaction folds write the copied tables through."""
        ...

    def copy_tables(
        self, component: str, steps: Sequence[MigrationStep], keyed_only: Collection[str] = ()
    ) -> None:
        """Create the copy of every table that the schema steps create; the copies of
        the `keyed_only` tables without their non-unique indexes."""
        ...

    def live(self, table: str) -> str:
        """The qualified name of the live `table`."""
        ...

    def copy(self, table: str) -> str:
        """The qualified name of the copy of `table`."""
        ...

    def columns(self, table: str) -> list[str]:
        """Column names of the live `table`, in table order."""
        ...

    def insert(self, table: str, columns: Sequence[str], rows: Sequence[Row]) -> None:
        """Add `rows` (values of `columns`) to the copy of `table`, in bulk."""
        ...

    def read_log(self, after_position: int, limit: int | None = None) -> list[Any]:
        """Events after `after_position` in position order, each Record-like with
        `data` decoded as read and `metadata` on first use."""
        ...

    def read_rows(self, after_position: int, limit: int | None = None) -> list[Row]:
        """The stored rows (EVENT_COLUMNS: position, event id, stream, version, type,
        data text, metadata text) after `after_position`, in position order."""
        ...

    def read_ahead(
        self, after_position: int, batch: int, *, decode: bool = True
    ) -> AbstractContextManager[Iterator[list[Any]]]:
        """The log after `after_position` in batches of `batch` events (the last one
        shorter), as `read_log` (`decode`) or `read_rows` gives them, the next batch
        read by a thread on a connection of its own while the caller folds this one."""
        ...

    def head_position(self) -> int:
        """The highest committed position, read in a short transaction of its own."""
        ...

    def swap_in(self, table: str, key: Sequence[str]) -> int:
        """Make the live `table` equal its copy, writing only the difference; returns
        its rows. Run inside `exclusive()`."""
        ...

    def same_rows(self, table: str, key: Sequence[str]) -> bool:
        """Whether the live `table` and its copy hold the same rows: each row of either
        has an equal row (null-safe, column by column) of the same key on the other,
        as `swap_in` compares them (it would write nothing)."""
        ...

    def reading(self) -> AbstractContextManager[None]:
        """A short transaction that reads the log and writes only the copies."""
        ...

    def exclusive(self) -> AbstractContextManager[None]:
        """A transaction no append can run beside; commits on normal exit."""
        ...

    def snapshot(self) -> AbstractContextManager[None]:
        """A transaction with one consistent view of log and live tables; rolls back."""
        ...


class EventStore(Reads, Protocol):
    """An append-only event store with per-stream version CAS."""

    url: str
    observers: Observers  # told of each commit and each StoreUnavailable

    @property
    def single_writer(self) -> bool:
        """True when the database admits one writer at a time (SQLite): the runtime then
        runs every unit of work on one thread instead of queueing for the write lock."""
        ...

    def transaction(self) -> AbstractContextManager[Transaction]: ...

    def clock_ms(self) -> int:
        """The store's time as last seen: this host's clock plus the offset the store's
        last clock reading showed (SQLite: the host's clock)."""
        ...

    def append(self, appends: Sequence[StreamAppend]) -> list[Record]: ...

    def session(self) -> AbstractContextManager[Transaction]:
        """A read session that takes no write lock (reads only)."""
        ...

    def replay_session(self) -> AbstractContextManager[ReplaySession]:
        """A private connection for rebuilding read models (closed on exit)."""
        ...

    def iter_all(self, after_position: int = 0, batch: int = 5000) -> Iterator[Record]: ...

    def schema_version(self, component: str) -> int:
        """The recorded schema version of `component` (0: none yet)."""
        ...

    def migrate(self, component: str, steps: Sequence[MigrationStep]) -> int:
        """Apply the steps of `component` beyond its recorded schema version in one
        transaction; return the version now recorded. Raises SchemaError when the
        database records a newer version than `len(steps)`."""
        ...

    def close(self) -> None: ...
