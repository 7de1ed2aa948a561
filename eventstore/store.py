"""What both adapters' stores share: transaction lifecycle, the one-thread-one-transaction
rule, store-level conveniences and migrations. Adapters supply connections and SQL."""

from __future__ import annotations

import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any, ClassVar

from domain.errors import InvalidInput, SchemaError, StoreUnavailable
from domain.records import Record, StreamAppend
from eventstore import logs
from eventstore.api import MigrationStep, Row, StoreUsageError
from eventstore.clock import HostClock, host_ms
from eventstore.migrations import (
    EVENTSTORE_COMPONENT,
    EVENTSTORE_STEPS,
    apply_steps,
    check_version,
)
from eventstore.observers import Commit, Observers
from eventstore.replay import BaseReplaySession
from eventstore.transaction import BaseTransaction
from eventstore.validation import encode_appends


class BaseStore(ABC):
    """An append-only event store (see eventstore.api.EventStore)."""

    dialect: ClassVar[str]  # which database: known inside eventstore only
    single_writer: ClassVar[bool]  # one writer at a time (see EventStore.single_writer)

    def __init__(self, url: str, read_only: bool = False) -> None:
        self.url = url
        self.read_only = read_only  # opened for reads only: no transaction, no migration
        self._closed = False
        self._thread = threading.local()
        self.observers = Observers()  # metrics, logs, traces (eventstore.observers)
        self.host_clock: HostClock = host_ms  # this host's clock (tests give a skewed one)
        self._offset_ms = 0  # the store's clock minus the host's, as last read

    def clock_ms(self) -> int:
        """The store's time as last seen: the host's clock plus the offset the store's
        last clock reading showed (docs/DESIGN.md, "One clock per store")."""
        return self.host_clock() + self._offset_ms

    def set_host_clock(self, clock: HostClock) -> None:
        """Read this host's time from `clock` from now on (the store's time as last
        seen stays what it was)."""
        seen = self.clock_ms()
        self.host_clock = clock
        self._offset_ms = seen - clock()

    def saw_clock(self, store_ms: int) -> None:
        """The store's clock read `store_ms` just now: keep the offset to the host's."""
        self._offset_ms = store_ms - self.host_clock()

    # -- hooks each adapter implements -------------------------------------------------

    @abstractmethod
    def _begin(self) -> BaseTransaction:
        """Take the connection (and lock) and start a write transaction."""

    @abstractmethod
    def _finish(self, tx: BaseTransaction, commit: bool) -> None:
        """Commit or roll back `tx`, then give its connection (and lock) back — always."""

    @abstractmethod
    def _session(self) -> AbstractContextManager[BaseTransaction]:
        """A short read session outside any write transaction."""

    @abstractmethod
    def _prepare_versions_table(self, tx: BaseTransaction) -> None:
        """Create schema_versions if missing and serialise concurrent migrations."""

    @abstractmethod
    def _replay_session(self) -> BaseReplaySession:
        """Open a replay session on a private connection."""

    @abstractmethod
    def _close(self) -> None:
        """Release connections."""

    @abstractmethod
    def _unavailable(self, error: BaseException) -> StoreUnavailable | None:
        """The typed error for a driver error that means the database cannot serve
        the call right now (unreachable, busy, disk full, read-only, I/O), else None."""

    @abstractmethod
    def _recorded_version(self, session: BaseTransaction, component: str) -> int | None:
        """The schema version recorded for `component` (0 if none), or None when the
        database has no schema_versions table yet."""

    @contextmanager
    def _typed_errors(self) -> Iterator[None]:
        """Raise a driver's "cannot serve now" errors as StoreUnavailable."""
        try:
            yield
        except Exception as error:
            typed = self._unavailable(error)
            if typed is None:
                raise
            self.observers.failed(typed.reason)
            raise typed from error

    # -- transactions ------------------------------------------------------------------

    @contextmanager
    def transaction(self) -> Iterator[BaseTransaction]:
        """Open a transaction: commit on normal exit, roll back on an exception.

        A transaction whose append failed rolls back and raises StoreUsageError at exit,
        even if the caller caught the conflict."""
        self._check_usable("store.transaction()")
        if self.read_only:
            raise StoreUsageError(
                "this store was opened read-only (read_only=True): it takes no write "
                "transaction; open it again without read_only to write"
            )
        self._thread.in_transaction = True
        observers = self.observers
        began = time.perf_counter() if observers.active else 0.0
        try:
            with self._typed_errors():
                tx = self._begin()
                tx.clock_of = self
                try:
                    yield tx
                except BaseException:
                    self._finish(tx, commit=False)
                    raise
                if tx.failure is not None:
                    self._finish(tx, commit=False)
                    raise StoreUsageError(
                        "transaction rolled back: an append, lock or call in it failed "
                        f"({type(tx.failure).__name__}: {tx.failure}); nothing was written"
                    ) from tx.failure
                self._finish(tx, commit=True)
        finally:
            self._thread.in_transaction = False
        if began:
            observers.committed(Commit(tx.appended, time.perf_counter() - began, tx.round_trips))
        if tx.appended:
            self._after_appending(tx.appended[-1].global_position)

    def _after_appending(self, position: int) -> None:  # noqa: B027 (a hook: nothing by default)
        """After a commit that appended up to `position` (an adapter may gather its
        tables' statistics again: docs/DESIGN.md "A fresh store")."""

    def append(self, appends: Sequence[StreamAppend]) -> list[Record]:
        """Append in a transaction of its own (see Transaction.append)."""
        batch = encode_appends(appends)  # before taking any lock
        with self.transaction() as tx:
            return tx.append_encoded(batch)

    # -- reads -------------------------------------------------------------------------

    def read_stream(self, stream_id: str, after_version: int = 0) -> list[Record]:
        """Events of one stream with stream_version > after_version, in order."""
        with self._reading() as session:
            return session.read_stream(stream_id, after_version)

    def read_streams(self, stream_ids: Sequence[str]) -> dict[str, list[Record]]:
        """Every event of each named stream, in version order, read in one query."""
        with self._reading() as session:
            return session.read_streams(stream_ids)

    def read_streams_after(self, after: Mapping[str, int]) -> dict[str, list[Record]]:
        """Events of each named stream after its given version, in version order."""
        with self._reading() as session:
            return session.read_streams_after(after)

    def session(self) -> AbstractContextManager[BaseTransaction]:
        """A read session outside any write transaction: no write lock is taken, and
        each statement sees the latest committed state (use stream versions to check
        that what was read still holds when writing)."""
        return self._reading()

    @contextmanager
    def replay_session(self) -> Iterator[BaseReplaySession]:
        """A private connection for rebuilding read models beside the live ones (see
        eventstore.replay); closed, with every copy it made, on exit."""
        self._check_usable("store.replay_session()")
        session = self._replay_session()
        try:
            yield session
        finally:
            session.close()

    def read_all(self, after_position: int = 0, limit: int | None = None) -> list[Record]:
        """Committed events with global_position > after_position, in position order."""
        with self._reading() as session:
            return session.read_all(after_position, limit)

    def iter_all(self, after_position: int = 0, batch: int = 5000) -> Iterator[Record]:
        """Every committed event after `after_position`, read `batch` at a time; no lock
        or connection is held between batches."""
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise InvalidInput("batch", "positive", f"batch must be an int >= 1, got {batch!r}")
        position = after_position
        while True:
            records = self.read_all(position, batch)
            yield from records
            if len(records) < batch:
                return
            position = records[-1].global_position

    def stream_versions(self, stream_ids: Sequence[str]) -> dict[str, int]:
        """Head version of each named stream (0 for a stream that does not exist)."""
        with self._reading() as session:
            return session.stream_versions(stream_ids)

    def streams_with_prefix(self, prefix: str) -> list[str]:
        """Ids of the existing streams that start with `prefix`, sorted."""
        with self._reading() as session:
            return session.streams_with_prefix(prefix)

    def head_position(self) -> int:
        """The highest committed global position (0 for an empty store)."""
        with self._reading() as session:
            return session.head_position()

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        """Run one read-only query (`?` placeholders) outside a transaction."""
        with self._reading() as session:
            return session.query(sql, params)

    def query_all(
        self, queries: Sequence[tuple[str, Sequence[Any]]], *, prepared: bool = False
    ) -> list[list[Row]]:
        """Run independent read-only queries outside a transaction (one round trip
        where the store can); `prepared` as `Transaction.query_all`."""
        with self._reading() as session:
            return session.query_all(queries, prepared=prepared)

    # -- schema ------------------------------------------------------------------------

    def schema_version(self, component: str) -> int:
        """The recorded schema version of `component` (0: none yet)."""
        with self._reading() as session:
            return self._recorded_version(session, component) or 0

    def migrate(self, component: str, steps: Sequence[MigrationStep]) -> int:
        """Apply the steps of `component` beyond its recorded version in one transaction;
        return the version now recorded. SchemaError if the database is newer.

        The recorded version is read first, in a read session: a schema already up to
        date costs no write transaction (so opening a current store never waits for
        another process's writer). A read-only store is never migrated: a schema
        behind this qlflow is a SchemaError saying so."""
        with self._reading() as session:
            recorded = self._recorded_version(session, component)
        if recorded is not None and check_version(component, recorded, len(steps)):
            return recorded
        if self.read_only:
            raise SchemaError(
                f"database schema {component} is at v{recorded or 0}, this qlflow needs "
                f"v{len(steps)}; a read-only open never upgrades it — run any write "
                "command (qlflow cycle, say) once to upgrade the store"
            )
        with self.transaction() as tx:
            self._prepare_versions_table(tx)
            version = apply_steps(tx, component, steps)
        self._after_migrating()
        return version

    def _after_migrating(self) -> None:  # noqa: B027 (a hook: nothing to do by default)
        """After a migration committed (an adapter may gather the new tables'
        statistics: docs/DESIGN.md "A fresh store")."""

    def reclaim(self) -> list[str]:
        """Make the space that deleted rows held reusable by the next inserts, after
        retention removed Runs (docs/DESIGN.md, "Retention"): on PostgreSQL a VACUUM of
        the store's tables this role owns, which autovacuum would otherwise do only
        once a fifth of a table is dead, and a rebuild of the events' indexes once
        removals left its primary key sparse; nothing on SQLite, whose freed pages go to its
        freelist at COMMIT. The tables reclaimed."""
        self._check_usable("store.reclaim()")
        if self.read_only:
            raise StoreUsageError("this store was opened read-only: it reclaims no space")
        with self._typed_errors():
            return self._reclaim()

    def _reclaim(self) -> list[str]:
        return []

    def _migrate_own_schema(self) -> None:
        self.migrate(EVENTSTORE_COMPONENT, EVENTSTORE_STEPS)
        self.migrate(logs.COMPONENT, logs.MIGRATIONS)

    # -- lifecycle ---------------------------------------------------------------------

    def close(self) -> None:
        """Release the store's connections; further use raises StoreUsageError."""
        if not self._closed:
            self._closed = True
            self._close()

    def __enter__(self) -> BaseStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.dialect}{' closed' if self._closed else ''}>"

    @contextmanager
    def _reading(self) -> Iterator[BaseTransaction]:
        self._check_usable("a store read")
        with self._typed_errors(), self._session() as session:
            yield session

    def _check_usable(self, what: str) -> None:
        if self._closed:
            raise StoreUsageError(f"{what} on a closed store; open it again with open_store()")
        if getattr(self._thread, "in_transaction", False):
            raise StoreUsageError(
                f"{what} while this thread has a transaction open: transactions do not nest "
                "and store calls do not join them — use the open Transaction instead"
            )
