"""Replay sessions: a private connection on which read models are rebuilt beside the
live ones (the adapters subclass `BaseReplaySession`).

The copies are TEMP tables of the same names. Temporary tables belong to the one
connection that made them and shadow the live tables there: on both SQLite and
PostgreSQL an unqualified table name is looked up in the temp schema first. So a
projection's own fold, run through the session's `tx`, writes the copy, while every
other connection (the runtime's, other replicas') still sees only the live tables.
No SQL is rewritten except `CREATE TABLE` -> `CREATE TEMP TABLE`. A failure or a kill
before `swap_in` leaves the live tables untouched: the copies vanish with the
connection.

`exclusive()` is one transaction that no append can run beside (SQLite: the write
lock; PostgreSQL: the position counter's row lock, which every append takes and holds
until COMMIT). `swap_in` makes a live table equal its copy inside it: `DELETE` of the
live rows the copy does not hold exactly, then `INSERT ... SELECT` of the copy's rows
the live table lacks, so a rebuild of correct read models writes nothing. Readers see
the old rows or the new rows, never a mix (SQLite WAL snapshots, PostgreSQL MVCC).
`DELETE` rather than `TRUNCATE` or a rename keeps PostgreSQL readers with older
snapshots correct and needs no exclusive table lock.
"""

from __future__ import annotations

import queue
import re
import threading
from abc import ABC, abstractmethod
from collections.abc import Collection, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any, ClassVar

import orjson

from domain.errors import SchemaError
from eventstore.api import MigrationStep, Row
from eventstore.migrations import statements_for
from eventstore.transaction import EVENT_COLUMNS, BaseTransaction

_CREATE_TABLE = re.compile(r"^\s*CREATE\s+TABLE\s+", re.IGNORECASE)
# Statements that would create objects outside the connection-private temp schema.
_UNSAFE_DDL = re.compile(r"^\s*CREATE\s+(VIEW|MATERIALIZED)\b", re.IGNORECASE)
# A live table's triggers (and their functions) are not copied: the copy's rows enter
# the live table through `swap_in`, which fires them there.
# A non-unique index (its name, its table) and the drop of one, as schema steps write them.
_CREATE_INDEX = re.compile(
    r"^\s*CREATE\s+INDEX\s+(IF\s+NOT\s+EXISTS\s+)?(?P<name>\w+)\s+ON\s+(?P<table>\w+)\b",
    re.IGNORECASE,
)
_DROP_INDEX = re.compile(r"^\s*DROP\s+INDEX\s+(IF\s+EXISTS\s+)?(?P<name>\w+)\s*$", re.IGNORECASE)
_LIVE_ONLY_DDL = re.compile(r"^\s*CREATE\s+(OR\s+REPLACE\s+)?(TRIGGER|FUNCTION)\b", re.IGNORECASE)


class LazyRecord:
    """A Record as a replay reads it: `data` decoded as it is read (every fold reads
    it), `metadata` on first use (most records' folds never do). A replay makes one
    only for a row some fold reads as a record (docs/DESIGN.md, "Rebuild")."""

    __slots__ = (
        "_metadata",
        "data",
        "event_id",
        "global_position",
        "stream_id",
        "stream_version",
        "type",
    )

    def __init__(self, row: Sequence[Any]) -> None:
        """`row`: the EVENT_COLUMNS of one event, as stored."""
        (
            self.global_position,
            self.event_id,
            self.stream_id,
            self.stream_version,
            self.type,
            data,
            self._metadata,
        ) = row
        self.data = orjson.loads(data)

    @property
    def metadata(self) -> Any:
        """The event's metadata, decoded on first use."""
        if isinstance(self._metadata, str):
            self._metadata = orjson.loads(self._metadata)
        return self._metadata


class DecodedRecord(LazyRecord):
    """A LazyRecord of a row whose data and metadata are decoded already (the rows
    `verify`'s log check hands on: it decodes every document to check it)."""

    __slots__ = ()

    def __init__(self, row: Sequence[Any]) -> None:
        (
            self.global_position,
            self.event_id,
            self.stream_id,
            self.stream_version,
            self.type,
            self.data,
            self._metadata,
        ) = row


def decoded_rows(records: Iterable[Any]) -> list[tuple[Any, ...]]:
    """Records as rows with their documents decoded (what a `DecodedRecord` reads)."""
    return [
        (r.global_position, r.event_id, r.stream_id, r.stream_version, r.type, r.data, r.metadata)
        for r in records
    ]


class BaseReplaySession(ABC):
    """A private connection wrapped in the adapter's Transaction class (see the module
    docstring); implements `eventstore.api.ReplaySession`."""

    live_schema: str
    temp_schema: str
    null_safe_equal: ClassVar[str]  # the operator that compares rows with NULLs as equal
    # whether `read_ahead` reads on a thread: worth it where the database does the
    # reading's work in a process of its own (PostgreSQL), not where the reading is
    # this process's own work under the same interpreter lock (SQLite)
    reads_ahead: ClassVar[bool] = False
    tx: BaseTransaction

    # -- what each adapter implements ----------------------------------------------------

    @abstractmethod
    def columns(self, table: str) -> list[str]:
        """Column names of the live `table`, in table order."""

    @abstractmethod
    def insert(self, table: str, columns: Sequence[str], rows: Sequence[Row]) -> None:
        """Add `rows` (values of `columns`) to the copy of `table`, in bulk."""

    @abstractmethod
    def reading(self) -> AbstractContextManager[None]:
        """A short transaction that reads the log and writes only the copies."""

    @abstractmethod
    def exclusive(self) -> AbstractContextManager[None]:
        """A transaction no append can run beside; commits on normal exit."""

    @abstractmethod
    def snapshot(self) -> AbstractContextManager[None]:
        """A transaction with one consistent view of log and live tables; rolls back."""

    @abstractmethod
    def close(self) -> None:
        """Close the connection (the copies go with it)."""

    @abstractmethod
    def _log_reader(self) -> BaseTransaction:
        """A Transaction on a new connection of its own to the same store, each
        statement its own short read transaction (`read_ahead`'s; closed by
        `_close_reader`)."""

    @abstractmethod
    def _close_reader(self, reader: BaseTransaction) -> None:
        """Close the connection of a `_log_reader`."""

    # -- shared --------------------------------------------------------------------------

    def live(self, table: str) -> str:
        """The qualified name of the live `table`."""
        return f'"{self.live_schema}"."{table}"'

    def copy(self, table: str) -> str:
        """The qualified name of the copy of `table`."""
        return f'"{self.temp_schema}"."{table}"'

    def copy_tables(
        self, component: str, steps: Sequence[MigrationStep], keyed_only: Collection[str] = ()
    ) -> None:
        """Create an empty copy of every table (and its indexes) the schema steps of
        `component` create, in a short transaction of its own. The copies of the
        `keyed_only` tables get no non-unique index: their replay reads and writes
        them by key alone, and the swap compares by key, so such an index would only
        be upkeep on every row written (the live tables keep theirs; docs/DESIGN.md,
        "Rebuild")."""
        skipped: set[str] = set()  # the indexes left out, whose later DROPs go too
        with self.reading():
            for number, step in enumerate(steps, start=1):
                for statement in statements_for(step, self.tx.dialect, component, number):
                    index = _CREATE_INDEX.match(statement)
                    if index is not None and index["table"] in keyed_only:
                        skipped.add(index["name"])
                        continue
                    dropped = _DROP_INDEX.match(statement)
                    if dropped is not None and dropped["name"] in skipped:
                        continue
                    if not _LIVE_ONLY_DDL.match(statement):
                        self.tx.execute(_temporary(statement, component, number))

    def read_log(self, after_position: int, limit: int | None = None) -> list[LazyRecord]:
        """The events after `after_position`, in position order (see LazyRecord)."""
        return [LazyRecord(row) for row in self.read_rows(after_position, limit)]

    def read_rows(self, after_position: int, limit: int | None = None) -> list[Row]:
        """The stored rows (EVENT_COLUMNS) after `after_position`, in position order."""
        return _read_rows(self.tx, "events", after_position, limit)

    @contextmanager
    def read_ahead(
        self, after_position: int, batch: int, *, decode: bool = True
    ) -> Iterator[Iterator[list[Any]]]:
        """The log after `after_position`, `batch` events at a time (the last batch
        shorter, maybe empty), each as `read_log` gives it (`decode`) or as `read_rows`
        does, each batch in a short read transaction of its own. Where the session
        `reads_ahead`, a thread reads (and decodes) the next batch on a connection of
        its own while the caller folds the current one. At most two batches are in memory (the one
        folded, the one read), so memory does not grow with the log (docs/DESIGN.md,
        "Rebuild"). The thread stops when the caller leaves the block."""
        if not self.reads_ahead:
            yield self._batches(after_position, batch, decode)
            return
        ready: queue.SimpleQueue[tuple[list[Any] | None, BaseException | None]]
        ready = queue.SimpleQueue()
        wanted = threading.Semaphore(1)  # a batch is read once the one before is taken
        stop = threading.Event()
        events = self.live("events")

        def read() -> None:
            try:
                reader = self._log_reader()
                try:
                    position = after_position
                    while True:
                        wanted.acquire()
                        if stop.is_set():
                            return
                        rows = _read_rows(reader, events, position, batch)
                        found = [LazyRecord(row) for row in rows] if decode else rows
                        ready.put((found, None))
                        if len(rows) < batch:
                            return
                        position = rows[-1][0]
                finally:
                    self._close_reader(reader)
            except BaseException as error:  # handed to the caller, raised there
                ready.put((None, error))

        def batches() -> Iterator[list[Any]]:
            while True:
                found, error = ready.get()
                if error is not None:
                    raise error
                assert found is not None
                if len(found) == batch:
                    wanted.release()  # the next batch is read while this one is folded
                yield found
                if len(found) < batch:
                    return

        thread = threading.Thread(target=read, name="qlflow-read-ahead", daemon=True)
        thread.start()
        try:
            yield batches()
        finally:
            stop.set()
            wanted.release()  # a thread waiting to read sees `stop` and ends
            thread.join()

    def _batches(self, after_position: int, batch: int, decode: bool) -> Iterator[list[Any]]:
        """`read_ahead` without the thread: each batch read when asked for, in a short
        read transaction of its own on this connection."""
        position = after_position
        while True:
            with self.reading():
                rows = self.read_rows(position, batch)
            yield [LazyRecord(row) for row in rows] if decode else rows
            if len(rows) < batch:
                return
            position = rows[-1][0]

    def head_position(self) -> int:
        """The highest committed position, read in a short transaction of its own."""
        with self.reading():
            return self.tx.head_position()

    def swap_in(self, table: str, key: Sequence[str]) -> int:
        """Make the live `table`'s rows equal its copy's, writing only the difference
        (see the module docstring); returns the rows it then has."""
        columns = self.columns(table)
        live, copy = self.live(table), self.copy(table)
        same_key, equal = self._equal(table, key, columns)
        self.tx.execute(f"DELETE FROM {live} AS l WHERE NOT EXISTS ({equal})")
        # each live row left has an equal copy row of its key, and keys are unique: as
        # many rows as the copy means none is missing (the common case: nothing to
        # insert), and afterwards the live table has exactly the copy's rows
        kept, rows = self.tx.query(
            f"SELECT (SELECT COUNT(*) FROM {live}), (SELECT COUNT(*) FROM {copy})"
        )[0]
        if kept < rows:
            # into an empty live table (a first fill) every copy row goes, with no
            # test: the test against a table its statistics say is empty was planned
            # as a scan of it per copy row, each scan passing the rows the statement
            # had inserted so far (PostgreSQL: 3.6 s of a 5.3 s rebuild at 213,222
            # events, 136 s at 1,006,031; docs/DESIGN.md, "Rebuild")
            missing = f"WHERE NOT EXISTS (SELECT 1 FROM {live} AS l WHERE {same_key})"
            self.tx.execute(
                f"INSERT INTO {live} ({_listed('', columns)}) "
                f"SELECT {_listed('c', columns)} FROM {copy} AS c {missing if kept else ''}"
            )
        count: int = rows
        return count

    def same_rows(self, table: str, key: Sequence[str]) -> bool:
        """Whether the live `table` and its copy hold the same rows: no row of either
        lacks an equal row of the same key on the other (as `swap_in` compares them).
        The keys are unique on both sides, so the rows then pair one to one."""
        live, copy, columns = self.live(table), self.copy(table), self.columns(table)
        _same_key, equal = self._equal(table, key, columns)
        _same_key, equal_live = self._equal(table, key, columns, from_copy=False)
        found = self.tx.query(
            f"SELECT 1 FROM {live} AS l WHERE NOT EXISTS ({equal}) "
            f"UNION ALL SELECT 1 FROM {copy} AS c WHERE NOT EXISTS ({equal_live}) LIMIT 1"
        )
        return not found

    def _equal(
        self, table: str, key: Sequence[str], columns: Sequence[str], *, from_copy: bool = True
    ) -> tuple[str, str]:
        """The condition that a copy row `c` and a live row `l` have the same key, and a
        query for the row equal to the outer one (`l`; not `from_copy`: `c`) on the
        other side, null-safe column by column."""
        same_key = " AND ".join(f'c."{k}" = l."{k}"' for k in key)
        same_row = f"({_listed('c', columns)}) {self.null_safe_equal} ({_listed('l', columns)})"
        inner = f"{self.copy(table)} AS c" if from_copy else f"{self.live(table)} AS l"
        return same_key, f"SELECT 1 FROM {inner} WHERE {same_key} AND {same_row}"


def _read_rows(tx: Any, table: str, after_position: int, limit: int | None) -> list[Row]:
    sql = f"SELECT {EVENT_COLUMNS} FROM {table} WHERE global_position > ?"
    sql += " ORDER BY global_position"
    if limit is None:
        rows: list[Row] = tx.query(sql, (after_position,))
        return rows
    found: list[Row] = tx.query(sql + " LIMIT ?", (after_position, limit))
    return found


def _listed(alias: str, columns: Sequence[str]) -> str:
    """`a."x", a."y"` (no alias: `"x", "y"`)."""
    prefix = f"{alias}." if alias else ""
    return ", ".join(f'{prefix}"{column}"' for column in columns)


def _temporary(statement: str, component: str, number: int) -> str:
    if _UNSAFE_DDL.match(statement):
        raise SchemaError(
            f"schema step {component} v{number} creates a view; rebuild can only "
            "copy tables and indexes into its private namespace"
        )
    return _CREATE_TABLE.sub("CREATE TEMP TABLE ", statement, count=1)
