"""Rebuild the read models from the event log, beside the live ones, then swap (SPEC §9).

How the fresh copy is built. The rebuild opens its own connection to the database
and creates every projection table (from the modules' own MIGRATIONS) as a TEMP
table of the same name. Temporary tables belong to that one connection and shadow
the live tables there: on both SQLite and PostgreSQL an unqualified table name is
looked up in the temp schema first. So the projection modules' own folds, run on
that connection, write the fresh copy, while every other connection (the runtime's,
other replicas') still sees only the live tables. No SQL is rewritten except
`CREATE TABLE` -> `CREATE TEMP TABLE`.

A module's fold here is its `Replay(tx, insert)` if it has one, else its `apply`. A
`Replay` folds batch after batch (`apply(records)`) like `apply` does, but may hold
rows in memory between batches as long as it writes them all by `flush()`; `insert`
adds new rows to a copy in bulk (SQLite `executemany`, PostgreSQL `COPY`). Records
reach the folds with `data` and `metadata` decoded on first use only.

Replay runs in batches, one short read transaction each, holding no write lock, so
the runtime keeps working meanwhile. A failure or a kill at any point before the swap
leaves the live tables untouched: they were never written, and the temp tables
vanish with the connection.

The swap takes the write lock once, at the end: SQLite `BEGIN IMMEDIATE`; PostgreSQL
a row lock on `qlflow_position`, which every append takes when it allocates
positions and holds until COMMIT (see eventstore.postgres_store) — so no append is
in flight and none can start. Under that lock the events appended since the replay's
last batch (the tail) are folded into the copy, and then every live table is made
equal to its copy, in that one transaction: `DELETE` of the live rows the copy does
not hold exactly, `INSERT ... SELECT` of the copy's rows the live table then lacks
(a rebuild of correct read models writes nothing). Readers see the old rows or the
new rows, never a mix (SQLite WAL snapshots, PostgreSQL MVCC). `DELETE` rather than
`TRUNCATE` or a table rename: it keeps PostgreSQL readers with older snapshots
correct and needs no exclusive table lock.
"""

from __future__ import annotations

import re
import sqlite3
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

import orjson

from domain.errors import InvalidInput, SchemaError
from eventstore.transaction import EVENT_COLUMNS
from projections import registry

Progress = Callable[[int, int], None]
"""`progress(events_done, events_total)`, called after each replayed batch."""

DEFAULT_BATCH = 5000
SQLITE_LOCK_TIMEOUT_S = 30.0  # how long the swap waits for SQLite's write lock

_CREATE_TABLE = re.compile(r"^\s*CREATE\s+TABLE\s+", re.IGNORECASE)
# Statements that would create objects outside the connection-private temp schema.
_UNSAFE_DDL = re.compile(r"^\s*CREATE\s+(VIEW|TRIGGER|MATERIALIZED)\b", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class RebuildSummary:
    """What a rebuild did: events replayed (`tail_events` of them inside the swap),
    the log position the new read models reflect, and the rows of each table."""

    events: int
    tail_events: int
    position: int
    tables: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def events_per_second(self) -> float:
        return self.events / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "events_per_second": self.events_per_second}


def rebuild(
    store, progress: Progress | None = None, *, batch: int = DEFAULT_BATCH
) -> RebuildSummary:
    """Replay the whole log into fresh read models and swap them in atomically."""
    check_batch(batch)
    started = time.perf_counter()
    registry.migrate_all(store)
    with ReplayCopy.open(store) as copy:
        copy.replay(progress, batch)
        replayed = copy.events
        with copy.exclusive():
            copy.catch_up()
            rows = copy.swap()
    return RebuildSummary(
        events=copy.events,
        tail_events=copy.events - replayed,
        position=copy.position,
        tables=rows,
        seconds=time.perf_counter() - started,
    )


def projection_tables() -> dict[str, tuple[str, ...]]:
    """Every read-model table with its key columns, over all projection modules."""
    tables: dict[str, tuple[str, ...]] = {}
    for module in registry.modules():
        tables.update(module.TABLES)
    return tables


class ReplayCopy:
    """Fresh read models built on a private connection, shadowing the live tables.

    `tx` is a store Transaction on that connection: its `execute`/`query` reach the
    copies through unqualified names; `live(table)` and `copy(table)` give qualified
    names of either side."""

    def __init__(self, session: _Session) -> None:
        self._session = session
        self.tx = session.tx
        self.tables = projection_tables()
        self.position = 0
        self.events = 0
        self._folds = [
            (module.STREAM_PREFIXES, _replayer(module, session.tx, session.insert))
            for module in registry.modules()
        ]

    @classmethod
    @contextmanager
    def open(cls, store) -> Iterator[ReplayCopy]:
        """A copy with empty fresh tables; the connection (and copy) end on exit."""
        store.head_position()  # refuses early if this thread holds a store transaction
        session = _open_session(store)
        try:
            copy = cls(session)
            copy._create_tables()
            yield copy
        finally:
            session.close()

    def live(self, table: str) -> str:
        return self._session.qualified(self._session.live_schema, table)

    def copy(self, table: str) -> str:
        return self._session.qualified(self._session.temp_schema, table)

    def replay(self, progress: Progress | None, batch: int) -> None:
        """Fold the log into the copy, `batch` events per short read transaction."""
        total = self._session.head_position()
        while True:
            with self._session.reading():
                records = self._read(batch)
                self._apply(records)
                if len(records) < batch:
                    self._flush()
            if records:
                self.position = records[-1].global_position
                self.events += len(records)
            if progress is not None:
                total = max(total, self.events)
                progress(self.events, total)
            if len(records) < batch:
                return

    def catch_up(self) -> int:
        """Fold every event after the copy's position, inside the current transaction
        (exclusive or snapshot); returns how many there were."""
        records = self._read()
        self._apply(records)
        self._flush()
        if records:
            self.position = records[-1].global_position
            self.events += len(records)
        return len(records)

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        """One transaction holding the append lock; commits on normal exit."""
        with self._session.exclusive():
            yield

    @contextmanager
    def snapshot(self) -> Iterator[None]:
        """One transaction seeing a single consistent state of log and live tables;
        rolled back on exit (nothing it did to the copy is kept)."""
        with self._session.snapshot():
            yield

    def swap(self) -> dict[str, int]:
        """Make every live table's rows equal its copy's; returns rows per table.

        Only the difference is written: the live rows missing from the copy or unequal
        to it are deleted, then the copy's rows the live table lacks are inserted."""
        same = _NULL_SAFE_EQUAL[self.tx.dialect]
        rows: dict[str, int] = {}
        for table, key in self.tables.items():
            columns = self.columns(table)
            live, copy = self.live(table), self.copy(table)
            same_key = " AND ".join(f'c."{k}" = l."{k}"' for k in key)
            same_row = f"({_listed('c', columns)}) {same} ({_listed('l', columns)})"
            self.tx.execute(
                f"DELETE FROM {live} AS l WHERE NOT EXISTS "
                f"(SELECT 1 FROM {copy} AS c WHERE {same_key} AND {same_row})"
            )
            self.tx.execute(
                f"INSERT INTO {live} ({_listed('', columns)}) "
                f"SELECT {_listed('c', columns)} FROM {copy} AS c "
                f"WHERE NOT EXISTS (SELECT 1 FROM {live} AS l WHERE {same_key})"
            )
            rows[table] = self.tx.query(f"SELECT COUNT(*) FROM {live}")[0][0]
        return rows

    def columns(self, table: str) -> list[str]:
        """Column names of the live table, in table order."""
        return self._session.columns(table)

    def _read(self, limit: int | None = None) -> list[_Replayed]:
        """The events after the copy's position, in order (`read_all`, decoded lazily)."""
        sql = f"SELECT {EVENT_COLUMNS} FROM events WHERE global_position > ?"
        sql += " ORDER BY global_position"
        if limit is None:
            rows = self.tx.query(sql, (self.position,))
        else:
            rows = self.tx.query(sql + " LIMIT ?", (self.position, limit))
        return [_Replayed(row) for row in rows]

    def _apply(self, records: list) -> None:
        for prefixes, fold in self._folds:
            mine = [r for r in records if r.stream_id.startswith(prefixes)]
            if mine:
                fold.apply(mine)

    def _flush(self) -> None:
        for _prefixes, fold in self._folds:
            fold.flush()

    def _create_tables(self) -> None:
        with self._session.reading():
            for module in registry.modules():
                for number, step in enumerate(module.MIGRATIONS, start=1):
                    for statement in _statements(step, self.tx.dialect, module.COMPONENT, number):
                        self.tx.execute(_temporary(statement, module.COMPONENT, number))


_NULL_SAFE_EQUAL = {"sqlite": "IS", "postgresql": "IS NOT DISTINCT FROM"}


def _listed(alias: str, columns: Sequence[str]) -> str:
    """`a."x", a."y"` (no alias: `"x", "y"`)."""
    prefix = f"{alias}." if alias else ""
    return ", ".join(f'{prefix}"{column}"' for column in columns)


class _Replayed:
    """A Record as replay reads it: `data` and `metadata` are decoded on first use, as
    the folds leave many unread (a steps record's fold reads only its version)."""

    __slots__ = (
        "_data",
        "_metadata",
        "event_id",
        "global_position",
        "stream_id",
        "stream_version",
        "type",
    )

    def __init__(self, row: Sequence[Any]) -> None:
        (
            self.global_position,
            self.event_id,
            self.stream_id,
            self.stream_version,
            self.type,
            self._data,
            self._metadata,
        ) = row

    @property
    def data(self) -> Any:
        if isinstance(self._data, str):
            self._data = orjson.loads(self._data)
        return self._data

    @property
    def metadata(self) -> Any:
        if isinstance(self._metadata, str):
            self._metadata = orjson.loads(self._metadata)
        return self._metadata


class _Apply:
    """The replay of a module without its own `Replay`: its `apply`, batch by batch."""

    def __init__(self, module, tx) -> None:
        self._module = module
        self._tx = tx

    def apply(self, records: list) -> None:
        self._module.apply(self._tx, records)

    def flush(self) -> None:
        """`apply` holds nothing back."""


def _replayer(module, tx, insert):
    replay = getattr(module, "Replay", None)
    return _Apply(module, tx) if replay is None else replay(tx, insert)


def _temporary(statement: str, component: str, number: int) -> str:
    if _UNSAFE_DDL.match(statement):
        raise SchemaError(
            f"schema step {component} v{number} creates a view or trigger; rebuild can only "
            "copy tables and indexes into its private namespace"
        )
    return _CREATE_TABLE.sub("CREATE TEMP TABLE ", statement, count=1)


def _statements(step, dialect: str, component: str, number: int) -> list[str]:
    try:
        sql = step[dialect]
    except (KeyError, TypeError) as exc:
        raise SchemaError(f"schema step {component} v{number} has no SQL for {dialect}") from exc
    return [sql] if isinstance(sql, str) else list(sql)


def check_batch(batch: int) -> None:
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise InvalidInput("batch", "positive", f"batch must be an int >= 1, got {batch!r}")


# --- one private connection per dialect ------------------------------------------------


class _Session(ABC):
    """A private connection wrapped in the adapter's Transaction class."""

    live_schema: str
    temp_schema: str
    tx: Any

    def qualified(self, schema: str, table: str) -> str:
        return f'"{schema}"."{table}"'

    def head_position(self) -> int:
        with self.reading():
            return self.tx.head_position()

    @abstractmethod
    def columns(self, table: str) -> list[str]:
        """Column names of the live `table`, in table order."""

    @abstractmethod
    def insert(self, table: str, columns: Sequence[str], rows: list[tuple]) -> None:
        """Add `rows` (values of `columns`) to the copy of `table`, in bulk."""

    @abstractmethod
    def reading(self) -> AbstractContextManager[None]:
        """A short transaction that reads the log and writes only the copy."""

    @abstractmethod
    def exclusive(self) -> AbstractContextManager[None]:
        """A transaction no append can run beside; commits on normal exit."""

    @abstractmethod
    def snapshot(self) -> AbstractContextManager[None]:
        """A transaction with one consistent view of log and live tables; rolls back."""

    @abstractmethod
    def close(self) -> None:
        """Close the connection (the copy goes with it)."""


def _open_session(store) -> _Session:
    if store.dialect == "sqlite":
        return _SqliteSession(store)
    if store.dialect == "postgresql":
        return _PostgresSession(store)
    raise InvalidInput("store", "dialect", f"cannot rebuild a {store.dialect!r} store")


class _SqliteSession(_Session):
    live_schema = "main"
    temp_schema = "temp"

    def __init__(self, store) -> None:
        from eventstore.sqlite_store import SqliteTransaction

        self._conn = sqlite3.connect(
            store.path,
            isolation_level=None,
            check_same_thread=False,
            timeout=SQLITE_LOCK_TIMEOUT_S,
        )
        self._conn.execute(f"PRAGMA synchronous={getattr(store, 'synchronous', 'FULL')}")
        self._conn.execute("PRAGMA temp_store=MEMORY")
        self._conn.execute("PRAGMA temp.cache_size=-262144")  # 256 MiB for the copy
        self.tx = SqliteTransaction(self._conn)

    def columns(self, table: str) -> list[str]:
        rows = self._conn.execute(f'PRAGMA main.table_info("{table}")').fetchall()
        return [row[1] for row in rows]

    def insert(self, table: str, columns: Sequence[str], rows: list[tuple]) -> None:
        self._conn.executemany(
            f"INSERT INTO {self.qualified(self.temp_schema, table)} ({', '.join(columns)}) "
            f"VALUES ({', '.join('?' * len(columns))})",
            rows,
        )

    @contextmanager
    def _transaction(self, begin: str, commit: bool) -> Iterator[None]:
        self._conn.execute(begin)
        try:
            yield
        except BaseException:
            if self._conn.in_transaction:
                self._conn.execute("ROLLBACK")
            raise
        self._conn.execute("COMMIT" if commit else "ROLLBACK")

    def reading(self):
        return self._transaction("BEGIN", commit=True)

    def exclusive(self):
        return self._transaction("BEGIN IMMEDIATE", commit=True)

    @contextmanager
    def snapshot(self) -> Iterator[None]:
        with self._transaction("BEGIN", commit=False):
            # a deferred transaction's snapshot starts at its first read
            self._conn.execute("SELECT COUNT(*) FROM main.events WHERE 0").fetchall()
            yield

    def close(self) -> None:
        self._conn.close()


class _PostgresSession(_Session):
    temp_schema = "pg_temp"

    def __init__(self, store) -> None:
        import psycopg

        from eventstore.postgres_store import PostgresTransaction

        self._psycopg = psycopg
        self._conn = psycopg.connect(store.url, autocommit=False)
        self.tx = PostgresTransaction(self._conn)
        self.live_schema = self.tx.query("SELECT current_schema()")[0][0]
        self._conn.commit()

    def columns(self, table: str) -> list[str]:
        rows = self.tx.query(
            "SELECT column_name FROM information_schema.columns "
            "WHERE table_schema = ? AND table_name = ? ORDER BY ordinal_position",
            (self.live_schema, table),
        )
        return [row[0] for row in rows]

    def insert(self, table: str, columns: Sequence[str], rows: list[tuple]) -> None:
        name = self.qualified(self.temp_schema, table)
        sql = f"COPY {name} ({', '.join(columns)}) FROM STDIN"
        with self._conn.cursor() as cursor, cursor.copy(sql) as copy:
            for row in rows:
                copy.write_row(row)

    @contextmanager
    def _transaction(self, first: str | None, commit: bool) -> Iterator[None]:
        try:
            if first is not None:
                self.tx.execute(first)
            yield
        except BaseException:
            self._conn.rollback()
            raise
        if commit:
            self._conn.commit()
        else:
            self._conn.rollback()

    def reading(self):
        return self._transaction(None, commit=True)

    def exclusive(self):
        return self._transaction("SELECT last FROM qlflow_position FOR UPDATE", commit=True)

    def snapshot(self):
        return self._transaction("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ", commit=False)

    def close(self) -> None:
        self._conn.close()
