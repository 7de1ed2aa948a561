"""The append flow and reads both adapters share; each adapter supplies a few SQL hooks.

The outcome of an append is decided in this order: every event id already
stored with identical content at the same place is an exact replay (return the
original Records, write nothing); some ids stored is an `IdempotencyConflict`;
otherwise a stream not at its expected version is a `VersionConflict`; otherwise the
events are inserted, positions assigned by the adapter in call order.

The hot path runs optimistically and looks ids up only when something did not fit,
which gives the same outcomes with one statement fewer per append:

1. version CAS per stream, in stream id order (a fixed lock order, so two multi-stream
   appends cannot deadlock). An exact replay always fails the first CAS, before any
   write: its events sit at versions above each expected version. So on a mismatch
   the ids are looked up: all identical -> replay, some stored -> IdempotencyConflict,
   none -> VersionConflict.
2. insert, skipping ids that already exist. If any was skipped the ids were stored
   elsewhere (the CAS passed, so this is no replay): IdempotencyConflict.

A conflict dooms the transaction: it can only roll back, so a half-done append (one
stream's head already moved) can never commit, even if the caller catches the error.
Plain SQL (`execute`, `executemany`, `query`) uses `?` placeholders on both dialects.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, ClassVar, NamedTuple, TypeVar

from domain.errors import CorruptionError, InvalidInput, VersionConflict
from domain.records import Record, StreamAppend
from eventstore.api import LockJoin, Row, StoreUsageError
from eventstore.clock import host_ms
from eventstore.validation import (
    EncodedAppend,
    EncodedBatch,
    EncodedEvent,
    encode_appends,
    record_from_event,
    record_from_row,
    replay_or_conflict,
)

T = TypeVar("T")

_SQL_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")  # a function, table or column name
EVENT_COLUMNS = "global_position, event_id, stream_id, stream_version, type, data, metadata"


def _stream_id_of(append: EncodedAppend) -> str:
    return append.stream_id


class Refused(NamedTuple):
    """Why a write did not go through: the stream whose CAS failed (None if the CAS passed
    but an event id was already stored), and whether any stream head had moved."""

    stream: EncodedAppend | None
    heads_moved: bool


def _check_key(key: object) -> None:
    if not isinstance(key, str) or not key:
        raise InvalidInput("key", "text", f"a lock is named by a non-empty string, got {key!r}")


class BaseTransaction(ABC):
    """One open transaction (or read session) on one connection."""

    dialect: ClassVar[str]

    def __init__(self) -> None:
        self.ended = False
        self.failure: BaseException | None = None
        self.clock_of: Any = None  # the store whose time this transaction tells
        # (function, leading args) an append goes through instead of the plain one
        self._through: tuple[str, tuple[Any, ...]] | None = None
        self.appended: list[Record] = []  # what this transaction wrote (not replays)
        # how often it waited for the database, BEGIN and COMMIT included (each adapter
        # counts its own: PostgreSQL pipelines several statements into one)
        self.round_trips = 0

    # -- hooks each adapter implements -------------------------------------------------

    @abstractmethod
    def _rows(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        """Run one query written with `?` placeholders and return all rows."""

    @abstractmethod
    def _run(self, sql: str, params: Sequence[Any] = (), prepared: bool = False) -> Any:
        """Run one statement written with `?` placeholders and return its cursor;
        `prepared` marks a key lookup whose cached generic plan stays right at any size."""

    @abstractmethod
    def _run_many(self, sql: str, seq_of_params: Iterable[Sequence[Any]]) -> None:
        """Run one statement written with `?` placeholders once per parameter tuple."""

    @abstractmethod
    def _rows_by_event_id(self, event_ids: Sequence[str]) -> list[Row]:
        """Stored rows (EVENT_COLUMNS) of those of `event_ids` that exist."""

    @abstractmethod
    def _rows_by_stream(self, stream_ids: Sequence[str]) -> list[Row]:
        """Stored rows (EVENT_COLUMNS) of the named streams, by stream id then version."""

    @abstractmethod
    def _heads(self, stream_ids: Sequence[str]) -> list[tuple[str, int]]:
        """(stream_id, version) of those of `stream_ids` that exist."""

    @abstractmethod
    def _insert(self, events: Sequence[EncodedEvent]) -> list[int] | None:
        """Insert `events` in order and return the global position given to each — or
        None, having inserted only some, if an event id already exists."""

    @abstractmethod
    def _lock(self, key: str) -> None:
        """Wait (bounded) for the lock named `key`, held until the transaction ends."""

    @abstractmethod
    def _try_lock_each(self, keys: list[str]) -> frozenset[str]:
        """Try each lock named by the sorted, non-empty `keys` without waiting: the
        names taken (see try_lock_each)."""

    @abstractmethod
    def _lock_heads(self, stream_ids: list[str], wait: bool) -> dict[str, int] | None:
        """Row-lock the heads of the sorted, non-empty `stream_ids` (see lock_heads)."""

    @abstractmethod
    def _lock_heads_each(self, stream_ids: list[str]) -> dict[str, int]:
        """Row-lock each head of the sorted, non-empty `stream_ids` that no other
        transaction holds, without waiting (see lock_heads_each)."""

    @abstractmethod
    def _function_comment(self, signature: str) -> str | None:
        """See function_comment."""

    @abstractmethod
    def _call(self, function: str, args: Sequence[Any]) -> Any:
        """See call (the name is checked already)."""

    # -- the contract ------------------------------------------------------------------

    def append(self, appends: Sequence[StreamAppend]) -> list[Record]:
        """Append atomically with per-stream version CAS, or exactly replay."""
        self._check_usable()
        return self.append_encoded(encode_appends(appends))

    def append_encoded(self, batch: EncodedBatch) -> list[Record]:
        """`append` for an already validated call (validation can then run outside a lock)."""
        self._check_usable()
        try:
            written = self._write(batch)
            if isinstance(written, Refused):
                return self._explain(batch, written)
        except BaseException as exc:
            self.failure = exc
            raise
        records = [
            record_from_event(event, position)
            for event, position in zip(batch.events, written, strict=True)
        ]
        self.appended.extend(records)
        return records

    def append_through(
        self, function: str, args: Sequence[Any], batch: EncodedBatch
    ) -> list[Record]:
        """`append_encoded` through the server-side function `function(*args, batch...)`
        where the database has such functions (PostgreSQL: a SECURITY DEFINER function
        that checks its own rule, then appends like `qlflow_append`); a store without
        functions (SQLite) appends plainly."""
        self._check_usable()
        if not isinstance(function, str) or not _SQL_NAME.fullmatch(function):
            raise InvalidInput(
                "function", "identifier", f"a function name is a-z 0-9 _, got {function!r}"
            )
        self._through = (function, tuple(args))
        try:
            return self.append_encoded(batch)
        finally:
            self._through = None

    def append_at_commit(self, batch: EncodedBatch) -> list[Record]:
        """See the Transaction protocol; at once unless the adapter defers it."""
        return self.append_encoded(batch)

    def _write(self, batch: EncodedBatch) -> list[int] | Refused:
        """CAS every stream in id order, then insert: the positions, or what stopped it."""
        appends: Sequence[EncodedAppend] = batch.appends
        if len(appends) > 1:
            appends = sorted(appends, key=_stream_id_of)
        for moved, append in enumerate(appends):
            if not self._compare_and_set(append):
                return Refused(append, heads_moved=moved > 0)
        positions = self._insert(batch.events)
        return Refused(None, heads_moved=True) if positions is None else positions

    def _explain(self, batch: EncodedBatch, refused: Refused) -> list[Record]:
        """Return the original records of an exact replay, or raise the conflict."""
        stored = self._rows_by_event_id(batch.event_ids)
        if stored:
            records = replay_or_conflict(batch, stored)  # raises unless an exact replay
            if refused.heads_moved:
                raise CorruptionError(
                    "stream heads accepted the expected versions of an exact replay: "
                    "the streams table disagrees with the events"
                )
            return records
        if refused.stream is None:
            raise CorruptionError("an event insert was skipped, yet none of its ids is stored")
        stream_id = refused.stream.stream_id
        actual = self.stream_versions([stream_id])[stream_id]
        raise VersionConflict(stream_id, refused.stream.expected_version, actual)

    def _compare_and_set(self, append: EncodedAppend) -> bool:
        if append.expected_version == 0:
            cursor = self._run(
                "INSERT INTO streams (stream_id, version) VALUES (?, ?) "
                "ON CONFLICT (stream_id) DO NOTHING",
                (append.stream_id, append.new_version),
                prepared=True,
            )
        else:
            cursor = self._run(
                "UPDATE streams SET version = ? WHERE stream_id = ? AND version = ?",
                (append.new_version, append.stream_id, append.expected_version),
                prepared=True,
            )
        return bool(cursor.rowcount == 1)

    def read_stream(self, stream_id: str, after_version: int = 0) -> list[Record]:
        """Events of one stream with stream_version > after_version, in order."""
        self._check_usable()
        rows = self._rows(
            f"SELECT {EVENT_COLUMNS} FROM events WHERE stream_id = ? AND stream_version > ? "
            "ORDER BY stream_version",
            (stream_id, after_version),
        )
        return [record_from_row(row) for row in rows]

    def read_streams(self, stream_ids: Sequence[str]) -> dict[str, list[Record]]:
        """Every event of each named stream, in version order, in one query (a stream
        that does not exist maps to an empty list)."""
        self._check_usable()
        streams: dict[str, list[Record]] = {stream_id: [] for stream_id in stream_ids}
        if streams:
            for row in self._rows_by_stream(sorted(streams)):
                streams[row[2]].append(record_from_row(row))
        return streams

    def read_streams_after(self, after: Mapping[str, int]) -> dict[str, list[Record]]:
        """Events of each named stream with stream_version > its `after` version, in
        version order (a stream with none maps to [])."""
        self._check_usable()
        streams: dict[str, list[Record]] = {stream_id: [] for stream_id in after}
        if streams:
            names = sorted(streams)
            for row in self._rows_after(names, [int(after[name]) for name in names]):
                streams[row[2]].append(record_from_row(row))
        return streams

    def _rows_after(self, stream_ids: Sequence[str], versions: Sequence[int]) -> list[Row]:
        """Stored rows (EVENT_COLUMNS) of each stream after its version, by stream id then
        version: one query per 200 streams (an adapter may do better)."""
        found: list[Row] = []
        for start in range(0, len(stream_ids), 200):
            chunk = stream_ids[start : start + 200]
            where = " OR ".join(["(stream_id = ? AND stream_version > ?)"] * len(chunk))
            pairs = zip(chunk, versions[start : start + 200], strict=True)
            params = [v for pair in pairs for v in pair]
            found += self._rows(
                f"SELECT {EVENT_COLUMNS} FROM events WHERE {where} "
                "ORDER BY stream_id, stream_version",
                params,
            )
        return found

    def read_all(self, after_position: int = 0, limit: int | None = None) -> list[Record]:
        """Events with global_position > after_position in position order, at most `limit`."""
        self._check_usable()
        sql = (
            f"SELECT {EVENT_COLUMNS} FROM events WHERE global_position > ? ORDER BY global_position"
        )
        if limit is None:
            rows = self._rows(sql, (after_position,))
        else:
            if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
                raise InvalidInput(
                    "limit", "non_negative", f"limit must be None or an int >= 0, got {limit!r}"
                )
            rows = self._rows(sql + " LIMIT ?", (after_position, limit))
        return [record_from_row(row) for row in rows]

    def stream_versions(self, stream_ids: Sequence[str]) -> dict[str, int]:
        """Head version of each named stream (0 for a stream that does not exist)."""
        self._check_usable()
        versions = dict.fromkeys(stream_ids, 0)
        if versions:
            versions.update(self._heads(list(versions)))
        return versions

    def streams_with_prefix(self, prefix: str) -> list[str]:
        """Ids of the existing streams that start with `prefix`, sorted."""
        self._check_usable()
        if not prefix:
            rows = self._rows("SELECT stream_id FROM streams ORDER BY stream_id")
            return [row[0] for row in rows]
        # a range scan on the primary key: ids compare by code point on both dialects
        upper = prefix[:-1] + chr(ord(prefix[-1]) + 1)
        rows = self._rows(
            "SELECT stream_id FROM streams WHERE stream_id >= ? AND stream_id < ? "
            "ORDER BY stream_id",
            (prefix, upper),
        )
        return [row[0] for row in rows]

    def head_position(self) -> int:
        """The highest committed (or, in this transaction, written) global position; 0 if none."""
        self._check_usable()
        position: int = self._rows("SELECT COALESCE(MAX(global_position), 0) FROM events")[0][0]
        return position

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Any:
        """Run one statement (`?` placeholders); returns a cursor."""
        self._check_usable()
        return self._run(sql, params)

    def executemany(self, sql: str, seq_of_params: Iterable[Sequence[Any]]) -> None:
        """Run one statement (`?` placeholders) once per parameter tuple, in order."""
        self._check_usable()
        self._run_many(sql, seq_of_params)

    def upsert(
        self,
        table: str,
        columns: Sequence[str],
        key: Sequence[str],
        rows: Sequence[Sequence[Any]],
        *,
        stored: Sequence[Sequence[Any] | None] | None = None,
    ) -> None:
        """Insert `rows` (values of `columns`, in order) into `table`, each replacing
        the row with its `key`; in one statement where the store can. `stored`, one
        per row: its values as this transaction read them (None: no such row); the
        store may then write only the columns that differ. Like `executemany`, it
        answers nothing (a store may send it with the next statement)."""
        self._check_usable()
        for name in (table, *columns):
            if not _SQL_NAME.fullmatch(name):
                raise InvalidInput("table", "identifier", f"not a table or column name: {name!r}")
        if stored is not None and len(stored) != len(rows):
            raise InvalidInput("stored", "count", f"{len(stored)} stored rows for {len(rows)} rows")
        if rows:
            self._upsert(table, list(columns), list(key), rows, stored)

    def _upsert(
        self,
        table: str,
        columns: list[str],
        key: list[str],
        rows: Sequence[Sequence[Any]],
        stored: Sequence[Sequence[Any] | None] | None,
    ) -> None:
        """A statement per row (an adapter may send them as one). A row read before
        is an UPDATE of the columns that differ: SQLite rewrites the entry of every
        index on a column an UPDATE sets, changed or not, so a full-row upsert of a
        `runs` row costs about three times an update of the one window that moved."""
        if stored is None:
            self._insert_or_replace(table, columns, key, rows)
            return
        new = [row for row, before in zip(rows, stored, strict=True) if before is None]
        if new:
            self._insert_or_replace(table, columns, key, new)
        keys = [columns.index(k) for k in key]
        by_columns: dict[tuple[int, ...], list[list[Any]]] = {}
        for row, before in zip(rows, stored, strict=True):
            if before is None:
                continue
            differ = tuple(
                i for i, (now, then) in enumerate(zip(row, before, strict=True)) if now != then
            )
            if differ:
                by_columns.setdefault(differ, []).append(
                    [row[i] for i in differ] + [row[i] for i in keys]
                )
        where = " AND ".join(f"{k} = ?" for k in key)
        for differ, params in by_columns.items():
            sets = ", ".join(f"{columns[i]} = ?" for i in differ)
            self._run_many(f"UPDATE {table} SET {sets} WHERE {where}", params)

    def _insert_or_replace(
        self, table: str, columns: list[str], key: list[str], rows: Sequence[Sequence[Any]]
    ) -> None:
        updates = ", ".join(f"{c} = excluded.{c}" for c in columns if c not in key)
        self._run_many(
            f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))}) "
            f"ON CONFLICT ({', '.join(key)}) DO UPDATE SET {updates}",
            rows,
        )

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        """Run one query (`?` placeholders) and return all rows."""
        self._check_usable()
        return self._rows(sql, params)

    def try_lock_join(self, name_sql: str) -> LockJoin:
        """SQL for a SELECT that reads only rows whose lock no other transaction holds,
        taking each lock as a row is read: `join` goes after the FROM table, `suffix`
        after the LIMIT, which then counts only rows whose lock was taken.
        `name_sql` is the lock's name as an SQL text expression over the row (a lock
        `try_lock` takes by that name). Where write transactions exclude each other
        (SQLite) both are empty."""
        self._check_usable()
        return self._try_lock_join(name_sql)

    def _try_lock_join(self, name_sql: str) -> LockJoin:
        """See try_lock_join (an adapter whose write transactions exclude each other
        needs no clause)."""
        return LockJoin("", "")

    def query_all(
        self, queries: Sequence[tuple[str, Sequence[Any]]], *, prepared: bool = False
    ) -> list[list[Row]]:
        """Run independent queries (`?` placeholders) and return each one's rows, in
        one round trip where the store can (none reads another's result); `prepared`:
        lookups by key, whose plans a store may keep (`eventstore.api.Reads`)."""
        self._check_usable()
        return self._rows_all(queries, prepared) if queries else []

    def _rows_all(
        self, queries: Sequence[tuple[str, Sequence[Any]]], prepared: bool = False
    ) -> list[list[Row]]:
        """Each query's rows (an adapter may send them all at once)."""
        return [self._rows(sql, params) for sql, params in queries]

    # -- locks (see eventstore.api) ------------------------------------------------------

    def lock(self, key: str) -> None:
        """Hold the lock named `key` until the transaction ends; wait for it at most the
        store's lock timeout, then LockTimeout (and the transaction can only roll back)."""
        self._check_usable()
        _check_key(key)
        try:
            self._lock(key)
        except BaseException as exc:
            self.failure = exc
            raise

    def clock_ms(self) -> int:
        """The store's time for this transaction (see `EventStore`): here the host's
        clock now; an adapter whose server has a clock of its own reads that."""
        return int(self.clock_of.host_clock()) if self.clock_of is not None else host_ms()

    def lock_all(self, keys: Sequence[str]) -> None:
        """`lock` every key, in key order (the fixed order two waiting lockers share, so
        they cannot deadlock on these), in one statement where the store can."""
        self._check_usable()
        if isinstance(keys, str):
            raise InvalidInput("keys", "sequence", "lock_all takes a sequence of lock names")
        for key in keys:
            _check_key(key)
        if not keys:
            return
        try:
            self._lock_all(sorted(set(keys)))
        except BaseException as exc:
            self.failure = exc
            raise

    def _lock_all(self, keys: list[str]) -> None:
        """Wait (bounded) for each of the sorted `keys` in turn (an adapter may do it in
        one statement)."""
        for key in keys:
            self._lock(key)

    def try_lock(self, keys: Sequence[str]) -> bool:
        """Take every lock named in `keys` without waiting; False if one is held
        elsewhere (locks already taken stay held until the transaction ends)."""
        self._check_usable()
        if isinstance(keys, str):
            raise InvalidInput("keys", "sequence", "try_lock takes a sequence of lock names")
        for key in keys:
            _check_key(key)
        wanted = frozenset(keys)
        return not wanted or self._try_lock_each(sorted(wanted)) == wanted

    def lock_heads(self, stream_ids: Sequence[str], *, wait: bool) -> dict[str, int] | None:
        """Row-lock the named stream heads in stream id order and return their versions
        (0 for a stream that does not exist); with wait=False None when one is held by
        another transaction, with wait=True a bounded wait (LockTimeout)."""
        self._check_usable()
        if isinstance(stream_ids, str):
            raise InvalidInput("stream_ids", "sequence", "lock_heads takes a sequence of ids")
        if not stream_ids:
            return {}
        try:
            heads = self._lock_heads(sorted(set(stream_ids)), wait)
        except BaseException as exc:
            self.failure = exc
            raise
        return None if heads is None else {stream_id: heads[stream_id] for stream_id in stream_ids}

    def lock_ahead(self, keys: Sequence[str], stream_ids: Sequence[str]) -> None:
        """`lock_all(keys)`, then `lock_heads(stream_ids, wait=True)`, answering nothing:
        a store may send them with this transaction's next statement (PostgreSQL: in
        its round trip), where a LockTimeout then surfaces; the order is kept either
        way (docs/DESIGN.md "Locks")."""
        self._check_usable()
        if isinstance(keys, str) or isinstance(stream_ids, str):
            raise InvalidInput("keys", "sequence", "lock_ahead takes sequences of names")
        for key in (*keys, *stream_ids):
            _check_key(key)
        try:
            self._lock_ahead(sorted(set(keys)), sorted(set(stream_ids)))
        except BaseException as exc:
            self.failure = exc
            raise

    def _lock_ahead(self, keys: list[str], stream_ids: list[str]) -> None:
        """Take them now (an adapter may send them with the next statement)."""
        if keys:
            self._lock_all(keys)
        if stream_ids:
            self._lock_heads(stream_ids, True)

    def try_lock_each(self, keys: Sequence[str]) -> frozenset[str]:
        """Try each lock named in `keys` on its own, never waiting: the names taken.
        One another transaction holds is left out; those taken stay held until the
        transaction ends."""
        return self.try_lock_each_ahead(keys)()

    def try_lock_each_ahead(self, keys: Sequence[str]) -> Callable[[], frozenset[str]]:
        """`try_lock_each(keys)` sent with this transaction's next statement where the
        store can; the function returned answers as `try_lock_each` would (asked before
        that statement, it sends it alone). Nothing else reads its answer, so a writer
        may guess the locks it will want and check later."""
        self._check_usable()
        if isinstance(keys, str):
            raise InvalidInput("keys", "sequence", "try_lock_each takes a sequence of names")
        for key in keys:
            _check_key(key)
        if not keys:
            return frozenset
        wanted = sorted(set(keys))
        return self._failing_on(lambda: self._try_lock_each_ahead(wanted))

    def _try_lock_each_ahead(self, keys: list[str]) -> Callable[[], frozenset[str]]:
        """Try them now (an adapter may send them with the next statement)."""
        taken = self._try_lock_each(keys)
        return lambda: taken

    def lock_heads_each(self, stream_ids: Sequence[str]) -> dict[str, int]:
        """Row-lock each named stream head no other transaction holds, never waiting:
        the versions of those taken (0 for a stream that does not exist). One held
        elsewhere is left out."""
        return self.lock_heads_each_ahead(stream_ids)()

    def lock_heads_each_ahead(self, stream_ids: Sequence[str]) -> Callable[[], dict[str, int]]:
        """`lock_heads_each(stream_ids)` sent with this transaction's next statement
        where the store can; the function returned answers as that would (asked
        before that statement, it sends it alone)."""
        self._check_usable()
        if isinstance(stream_ids, str):
            raise InvalidInput("stream_ids", "sequence", "lock_heads_each takes a sequence")
        if not stream_ids:
            return dict
        wanted = sorted(set(stream_ids))
        return self._failing_on(lambda: self._lock_heads_each_ahead(wanted))

    def _lock_heads_each_ahead(self, stream_ids: list[str]) -> Callable[[], dict[str, int]]:
        """Lock them now (an adapter may send it with the next statement)."""
        found = self._lock_heads_each(stream_ids)
        return lambda: found

    def _failing_on(self, ask: Callable[[], Callable[[], T]]) -> Callable[[], T]:
        """`ask()`'s answer, marking the transaction failed where asking or answering
        raises (a lock statement that failed leaves it only to roll back)."""
        try:
            answer = ask()
        except BaseException as exc:
            self.failure = exc
            raise

        def answered() -> T:
            try:
                return answer()
            except BaseException as exc:
                self.failure = exc
                raise

        return answered

    def stream_versions_ahead(self, stream_ids: Sequence[str]) -> Callable[[], dict[str, int]]:
        """`stream_versions(stream_ids)` sent with this transaction's next statement
        where the store can (after the locks `lock_ahead` queued, before that
        statement); the function returned answers as `stream_versions` would (asked
        before that statement, it sends it alone)."""
        self._check_usable()
        if isinstance(stream_ids, str):
            raise InvalidInput("stream_ids", "sequence", "stream_versions_ahead takes a sequence")
        wanted = list(stream_ids)
        if not wanted:
            return dict
        answer = self._heads_ahead(sorted(set(wanted)))
        answers: list[dict[str, int]] = []

        def versions() -> dict[str, int]:
            if not answers:
                found = dict(answer())
                answers.append({stream_id: found.get(stream_id, 0) for stream_id in wanted})
            return answers[0]

        return versions

    def _heads_ahead(self, stream_ids: list[str]) -> Callable[[], list[tuple[str, int]]]:
        """Read them now (an adapter may send it with the next statement)."""
        found = self._heads(stream_ids)
        return lambda: found

    def read_ahead(self, queries: Sequence[tuple[str, Sequence[Any]]]) -> None:
        """Independent queries a `query_all` of exactly these will ask for next, before
        this transaction writes anything but an append: a store may send them with the
        next statement (PostgreSQL: after it, in its round trip) and answer that
        `query_all` from them; a store without that ignores this."""
        self._check_usable()

    @property
    def sends_reads_ahead(self) -> bool:
        """Whether `read_ahead` sends anything here (not by default)."""
        return False

    def function_comment(self, signature: str) -> str | None:
        """The comment of the server-side function `signature` ("" if it has none), or
        None when the database has no such function (SQLite has none at all)."""
        self._check_usable()
        return self._function_comment(signature)

    def call(self, function: str, args: Sequence[Any] = ()) -> Any:
        """Call the server-side function `function` with `args` and return its value.
        Lock waits inside it are bounded like `lock` (LockTimeout)."""
        self._check_usable()
        if not isinstance(function, str) or not _SQL_NAME.fullmatch(function):
            raise InvalidInput(
                "function", "identifier", f"a function name is a-z 0-9 _, got {function!r}"
            )
        try:
            return self._call(function, args)
        except BaseException as exc:
            self.failure = exc
            raise

    # -- lifecycle ---------------------------------------------------------------------

    def _check_usable(self) -> None:
        if self.ended:
            raise StoreUsageError(
                "this transaction has ended; open a new one with store.transaction()"
            )
        if self.failure is not None:
            raise StoreUsageError(
                f"this transaction can only roll back: an append, lock or call in it failed "
                f"({type(self.failure).__name__}: {self.failure})"
            ) from self.failure
