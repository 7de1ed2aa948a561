"""SQLite adapter: one connection per store, WAL, durable commits.

The connection runs with `isolation_level=None` and every write transaction opens
with an explicit `BEGIN IMMEDIATE`: the write lock is taken before the first read, so
a read-then-write transaction can never fail with SQLITE_BUSY_SNAPSHOT (which a
deferred BEGIN would). One `threading.RLock` guards the connection for the whole
transaction, so any thread may use the store; SQLite's single writer makes commit
order equal position order, so positions are simply MAX + 1.

Checkpoints run outside write transactions. SQLite's automatic checkpoint would run
inside the COMMIT that crosses its threshold, adding milliseconds to that write; the
store turns it off and instead runs a PASSIVE checkpoint before the next BEGIN once
`CHECKPOINT_EVERY` of its transactions have committed. A PASSIVE checkpoint takes no
write lock, so other connections keep writing meanwhile, and a complete one lets the
next transaction write the WAL from its start again (overwriting is cheaper to sync
than growing the file).
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any
from urllib.parse import quote

from domain.errors import NotFound, SchemaError, StoreUnavailable
from eventstore.api import Row, StoreUsageError
from eventstore.replay import BaseReplaySession
from eventstore.store import BaseStore
from eventstore.transaction import EVENT_COLUMNS, BaseTransaction
from eventstore.validation import EncodedEvent

SYNCHRONOUS_LEVELS = ("OFF", "NORMAL", "FULL", "EXTRA")
# what a level gives up on power loss or an OS crash (the store runs in WAL mode);
# FULL (the default) and EXTRA keep every acknowledged COMMIT
SYNCHRONOUS_LOSSES = {
    "NORMAL": "the last acknowledged commits can be lost on power loss or an OS crash "
    "(the file stays consistent; a process crash loses nothing)",
    "OFF": "acknowledged commits can be lost, and the file corrupted, on power loss or an OS crash",
}
REPLAY_LOCK_TIMEOUT_S = 30.0  # how long a replay's swap waits for the write lock
DEFAULT_BUSY_TIMEOUT_MS = 5000
CHECKPOINT_EVERY = 32  # committed transactions between checkpoints (~1,000 WAL pages)
_ID_CHUNK = 500  # ids per IN (...) list, well under SQLite's variable limit


def _stream_and_version(row: Row) -> tuple[str, int]:
    return row[2], row[3]


class SqliteTransaction(BaseTransaction):
    """A transaction (or read session) on the store's one connection."""

    dialect = "sqlite"

    def __init__(self, conn: sqlite3.Connection) -> None:
        super().__init__()
        self._conn = conn

    def _rows(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        self.round_trips += 1  # in process: a statement is SQLite's round trip
        return self._conn.execute(sql, params).fetchall()

    def _run(self, sql: str, params: Sequence[Any] = (), prepared: bool = False) -> sqlite3.Cursor:
        # sqlite3 caches every statement it compiles; `prepared` matters to PostgreSQL only
        self.round_trips += 1
        return self._conn.execute(sql, params)

    def _run_many(self, sql: str, seq_of_params: Iterable[Sequence[Any]]) -> None:
        self.round_trips += 1
        self._conn.executemany(sql, seq_of_params)

    def _rows_by_event_id(self, event_ids: Sequence[str]) -> list[Row]:
        return self._rows_in(f"SELECT {EVENT_COLUMNS} FROM events WHERE event_id", event_ids)

    def _rows_by_stream(self, stream_ids: Sequence[str]) -> list[Row]:
        # the (stream_id, stream_version) index gives this order without a sort
        rows = self._rows_in(f"SELECT {EVENT_COLUMNS} FROM events WHERE stream_id", stream_ids)
        rows.sort(key=_stream_and_version)
        return rows

    def _heads(self, stream_ids: Sequence[str]) -> list[tuple[str, int]]:
        return self._rows_in("SELECT stream_id, version FROM streams WHERE stream_id", stream_ids)

    def _insert(self, events: Sequence[EncodedEvent]) -> list[int] | None:
        self.round_trips += 2
        last = self._conn.execute("SELECT COALESCE(MAX(global_position), 0) FROM events")
        first = last.fetchone()[0] + 1
        positions = range(first, first + len(events))
        cursor = self._conn.executemany(
            f"INSERT INTO events ({EVENT_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?) "
            "ON CONFLICT (event_id) DO NOTHING",
            [(position, *event) for position, event in zip(positions, events, strict=True)],
        )
        return list(positions) if cursor.rowcount == len(events) else None

    # Every write transaction began with BEGIN IMMEDIATE and holds the database's one
    # write lock until it ends: no other writer can run, so named locks and head locks
    # are held already, and nothing here ever waits.

    def _lock(self, key: str) -> None:
        return None

    def _try_lock_each(self, keys: list[str]) -> frozenset[str]:
        return frozenset(keys)

    def _lock_heads(self, stream_ids: list[str], wait: bool) -> dict[str, int] | None:
        return self._lock_heads_each(stream_ids)

    def _lock_heads_each(self, stream_ids: list[str]) -> dict[str, int]:
        versions = dict.fromkeys(stream_ids, 0)
        versions.update(self._heads(stream_ids))
        return versions

    def _function_comment(self, signature: str) -> str | None:
        return None  # SQLite has no server-side functions

    def _call(self, function: str, args: Sequence[Any]) -> Any:
        raise StoreUsageError(f"SQLite has no server-side functions: cannot call {function}()")

    def _rows_in(self, select: str, values: Sequence[str]) -> list[Row]:
        rows: list[Row] = []
        for start in range(0, len(values), _ID_CHUNK):
            chunk = values[start : start + _ID_CHUNK]
            marks = ", ".join("?" * len(chunk))
            self.round_trips += 1
            rows.extend(self._conn.execute(f"{select} IN ({marks})", chunk).fetchall())
        return rows


class SqliteStore(BaseStore):
    """The event store on one SQLite database file."""

    dialect = "sqlite"
    single_writer = True

    def __init__(
        self,
        url: str,
        path: str,
        synchronous: str = "FULL",
        busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS,
        read_only: bool = False,
    ) -> None:
        super().__init__(url, read_only)
        self.path = path
        self.synchronous = synchronous
        self.busy_timeout_ms = busy_timeout_ms
        self._lock = threading.RLock()
        self._commits_since_checkpoint = 0
        with self._typed_errors():
            self._conn = connect(path, read_only, busy_timeout_ms / 1000)
        try:
            with self._typed_errors():
                refuse_foreign(self._conn, path, read_only)
                if not read_only:
                    # a read-only open never converts the file (WAL is a property of it)
                    self._conn.execute("PRAGMA journal_mode=WAL")
                    self._conn.execute(f"PRAGMA synchronous={synchronous}")
                    self._conn.execute("PRAGMA wal_autocheckpoint=0")
                self._conn.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
            self._migrate_own_schema()
        except BaseException:
            self._conn.close()
            raise

    def _begin(self) -> SqliteTransaction:
        self._lock.acquire()
        try:
            if self._commits_since_checkpoint >= CHECKPOINT_EVERY:
                self.checkpoint()
            self._conn.execute("BEGIN IMMEDIATE")
        except BaseException:
            self._lock.release()
            raise
        tx = SqliteTransaction(self._conn)
        tx.round_trips = 1  # BEGIN
        return tx

    def _finish(self, tx: BaseTransaction, commit: bool) -> None:
        tx.ended = True
        try:
            if commit:
                tx.round_trips += 1
                try:
                    self._conn.execute("COMMIT")
                except BaseException:
                    self._rollback()
                    raise
                self._commits_since_checkpoint += 1
            else:
                self._rollback()
        finally:
            self._lock.release()

    def checkpoint(self) -> tuple[int, int, int]:
        """Copy committed WAL pages into the database file without taking the write
        lock (PASSIVE): (busy, WAL frames, frames checkpointed)."""
        with self._lock:
            self._commits_since_checkpoint = 0
            busy, frames, done = self._conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
            return busy, frames, done

    def _rollback(self) -> None:
        # an error inside SQLite may already have ended the transaction
        if self._conn.in_transaction:
            self._conn.execute("ROLLBACK")

    @contextmanager
    def _session(self) -> Iterator[SqliteTransaction]:
        with self._lock:
            session = SqliteTransaction(self._conn)
            try:
                yield session
            finally:
                session.ended = True

    def _prepare_versions_table(self, tx: BaseTransaction) -> None:
        # plain SQL: sqlite_utils would pull numpy (and OpenBLAS) into every process
        self._conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_versions "
            "(component TEXT PRIMARY KEY, version INTEGER NOT NULL)"
        )

    def _recorded_version(self, session: BaseTransaction, component: str) -> int | None:
        if not session.query(_VERSIONS_TABLE):
            return None
        rows = session.query(
            "SELECT version FROM schema_versions WHERE component = ?", (component,)
        )
        return int(rows[0][0]) if rows else 0

    def _unavailable(self, error: BaseException) -> StoreUnavailable | None:
        return unavailable(error, self.path, self.busy_timeout_ms)

    def _replay_session(self) -> SqliteReplaySession:
        return SqliteReplaySession(self.path, self.synchronous, self.read_only)

    def _close(self) -> None:
        with self._lock:
            self._conn.close()


REPLAY_CACHE_KIB = 16 * 1024  # the replay's page cache for its copies


class SqliteReplaySession(BaseReplaySession):
    """A replay session on a second connection to the database file; the copies live
    in its temp schema, a file behind a page cache of `REPLAY_CACHE_KIB`."""

    live_schema = "main"
    temp_schema = "temp"
    null_safe_equal = "IS"

    def __init__(self, path: str, synchronous: str, read_only: bool = False) -> None:
        self._path, self._read_only = path, read_only
        self._conn = connect(path, read_only, REPLAY_LOCK_TIMEOUT_S)
        self._conn.execute(f"PRAGMA synchronous={synchronous}")
        # the copies live in a temp file behind a bounded page cache, so a rebuild's
        # memory does not grow with the read models (docs/DESIGN.md, "Rebuild")
        self._conn.execute("PRAGMA temp_store=FILE")
        self._conn.execute(f"PRAGMA temp.cache_size=-{REPLAY_CACHE_KIB}")
        # the copies' undo log in memory, not in a second temp file: the copies die
        # with the connection anyway, and a transaction's undo is one batch's pages
        self._conn.execute("PRAGMA temp.journal_mode=MEMORY")
        self.tx = SqliteTransaction(self._conn)

    def columns(self, table: str) -> list[str]:
        rows = self._conn.execute(f'PRAGMA main.table_info("{table}")').fetchall()
        return [row[1] for row in rows]

    def insert(self, table: str, columns: Sequence[str], rows: Sequence[Row]) -> None:
        self._conn.executemany(
            f"INSERT INTO {self.copy(table)} ({', '.join(columns)}) "
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

    def reading(self) -> AbstractContextManager[None]:
        return self._transaction("BEGIN", commit=True)

    def exclusive(self) -> AbstractContextManager[None]:
        return self._transaction("BEGIN IMMEDIATE", commit=True)

    @contextmanager
    def snapshot(self) -> Iterator[None]:
        with self._transaction("BEGIN", commit=False):
            # a deferred transaction's snapshot starts at its first read
            self._conn.execute("SELECT COUNT(*) FROM main.events WHERE 0").fetchall()
            yield

    def close(self) -> None:
        self._conn.close()

    def _log_reader(self) -> SqliteTransaction:
        return SqliteTransaction(connect(self._path, self._read_only, REPLAY_LOCK_TIMEOUT_S))

    def _close_reader(self, reader: BaseTransaction) -> None:
        assert isinstance(reader, SqliteTransaction)
        reader._conn.close()


# -- opening the file -------------------------------------------------------------------

_VERSIONS_TABLE = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_versions'"
# primary result codes (the low byte of an extended code) that mean "not now"
_UNAVAILABLE = {
    5: "busy",  # SQLITE_BUSY
    6: "busy",  # SQLITE_LOCKED
    8: "read_only",  # SQLITE_READONLY
    10: "io_error",  # SQLITE_IOERR
    13: "disk_full",  # SQLITE_FULL
    14: "unreachable",  # SQLITE_CANTOPEN
    15: "busy",  # SQLITE_PROTOCOL
}
_WHAT_TO_DO = {
    "busy": "another connection held the write lock longer than the busy timeout "
    "({timeout} ms); try again",
    "read_only": "the file or its folder is read-only here; writing needs write access to both",
    "io_error": "the disk failed to read or write; check it and try again",
    "disk_full": "the disk is full; free space and try again",
    "unreachable": "the file cannot be opened; check the path and its permissions",
}
_NOT_A_DATABASE = 26  # SQLITE_NOTADB


def connect(path: str, read_only: bool, timeout_s: float) -> sqlite3.Connection:
    """A connection to the database file; `read_only` never creates, converts or locks
    it for writing.

    Read-only opens use `mode=ro`, which still needs the WAL index (`-shm`) beside the
    file: it creates one if the folder is writable and uses an existing one read-only.
    In a read-only folder holding no `-shm` that fails; when there is no WAL either
    (the last writer closed cleanly, so every commit is in the main file) the file is
    opened `immutable`: read as it is, without locks. A WAL with commits but no index
    cannot be read safely in a folder that cannot take one, and is refused."""
    if not read_only:
        return sqlite3.connect(
            path, isolation_level=None, check_same_thread=False, timeout=timeout_s
        )
    if not os.path.isfile(path):
        what = "is not a file" if os.path.exists(path) else "does not exist"
        raise NotFound(
            f"no qlflow store at {path}: the file {what} (a read command never creates a "
            "store; check --db)"
        )
    uri = f"file:{quote(os.path.abspath(path))}?mode=ro"
    conn = sqlite3.connect(
        uri, uri=True, isolation_level=None, check_same_thread=False, timeout=timeout_s
    )
    try:
        conn.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()
        return conn
    except sqlite3.DatabaseError as error:
        conn.close()
        if _primary(error) == _NOT_A_DATABASE:
            raise _not_a_database(path) from None
        if _primary(error) not in (8, 14):  # READONLY (the folder), CANTOPEN
            raise
        wal = f"{path}-wal"
        if os.path.exists(wal) and os.path.getsize(wal) > 0:
            raise StoreUnavailable(
                "read_only",
                f"cannot read the SQLite store {path}: its write-ahead log holds commits "
                "but its index (-shm) is missing and this folder is read-only; open it "
                "once where the folder is writable",
            ) from error
    return sqlite3.connect(
        f"{uri}&immutable=1",
        uri=True,
        isolation_level=None,
        check_same_thread=False,
        timeout=timeout_s,
    )


def refuse_foreign(conn: sqlite3.Connection, path: str, read_only: bool) -> None:
    """SchemaError unless the file is a qlflow store (or, opened to write, an empty
    database that becomes one). Nothing is written before this check: another
    application's database is left exactly as it was."""
    try:
        tables = [
            row[0]
            for row in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' "
                "AND name NOT LIKE 'sqlite_%' ORDER BY name"
            )
        ]
    except sqlite3.DatabaseError as error:
        if _primary(error) != _NOT_A_DATABASE:
            raise
        raise _not_a_database(path) from None
    if not tables:
        if read_only:
            raise SchemaError(f"{path} is not a qlflow store: the database is empty")
        return
    try:
        ours = conn.execute(
            "SELECT 1 FROM schema_versions WHERE component = 'eventstore'"
        ).fetchall()
    except sqlite3.OperationalError:
        ours = []
    if not ours:
        shown = ", ".join(tables[:5]) + (", ..." if len(tables) > 5 else "")
        raise SchemaError(
            f"{path} is not a qlflow store: it holds another application's tables "
            f"({shown}); qlflow leaves it unchanged — choose another --db file"
        )


def _not_a_database(path: str) -> SchemaError:
    return SchemaError(f"{path} is not a SQLite database; qlflow leaves it unchanged")


def unavailable(error: BaseException, path: str, busy_timeout_ms: int) -> StoreUnavailable | None:
    """StoreUnavailable for a SQLite error that means "not now", else None."""
    if not isinstance(error, sqlite3.Error):
        return None
    reason = _UNAVAILABLE.get(_primary(error))
    if reason is None:
        return None
    advice = _WHAT_TO_DO[reason].format(timeout=busy_timeout_ms)
    return StoreUnavailable(reason, f"SQLite store {path}: {error} — {advice}")


def _primary(error: sqlite3.Error) -> int:
    code = getattr(error, "sqlite_errorcode", None)
    return code & 0xFF if isinstance(code, int) else -1
