"""PostgreSQL adapter: psycopg 3 with a connection pool; one short transaction per call.

Gap safety. A reader tailing `read_all(after_position)` remembers the last position it
saw and asks for more. If positions came from a sequence, a transaction could take
position 10, stall, and commit after another took 11 and committed: the reader would
see 11, move past 10, and never see it. So positions are allocated from the one-row
table `qlflow_position` by `UPDATE ... SET last = last + n` as the LAST step of an
append (after the version CAS, just before the insert). The row lock is held until
COMMIT, so the next appender gets its positions only after this one has committed and
become visible: positions are assigned in commit order, and any event a reader can see
has every lower position already visible. The price is that appends are serialised
from their position allocation to COMMIT — keep that part short: do the projection
updates right after the append and commit (taking row locks after the append also
keeps every appender's lock order the same: stream heads, counter, rows).

Appends. Every append is one call of the server-side `qlflow_append`
(`eventstore.pg_append`): shape and stream-rights checks, the CAS per stream in stream
id order, the counter, the insert — one statement, one round trip, for any number of
streams. A conflict never raises inside PostgreSQL (the function answers which stream
refused), so it never aborts the transaction by itself. It is also the only way a
least-privilege role writes events (`eventstore.grants`). `append_at_commit` queues
its twin `qlflow_append_or_abort` instead, sent with what follows it and COMMIT: there
a conflict raises and aborts the lot (docs/DESIGN.md "Two round trips").

Round trips. A write transaction runs on an autocommit connection and sends its own
BEGIN in the pipeline of its first statement (psycopg's implicit BEGIN waits for its
answer: one round trip more). `executemany` answers nothing, so a write transaction
queues those statements (the read models' upserts after an append) and sends them in
the pipeline of its next statement or of COMMIT. Every lock wait of a connection is bounded
by the session's `lock_timeout` (`bounded_session`).

Plans. Statements are planned at each execution, except the key lookups of the hot
path, which are prepared (psycopg prepares a statement on its fifth execution on a
connection; the server keeps a generic plan when it is no worse than the custom
ones): the append's own call, the locks, the events and stream-head reads by key,
and the reads by key their callers mark (`query_all(..., prepared=True)`: the read
models' upkeep, read ahead or not, and a step's inputs). Unprepared they cost the
server a parse and a plan each, a quarter of its CPU on the per-call loop
(docs/DESIGN.md "Round trips of a write on PostgreSQL"). A generic plan made while a
table was small may scan it; it lasts until the table's next ANALYZE (autovacuum's,
at most 10% of growth later) or the pooled connection's end, and every other
statement stays planned at each execution.

The URL is passed to libpq as is, so `?options=-c%20search_path%3D<schema>` works;
tables are created unqualified, in the first schema of the search_path.
"""

from __future__ import annotations

import functools
import logging
import math
import select
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import psycopg
import psycopg_pool
from psycopg import errors as pg_errors
from psycopg.conninfo import conninfo_to_dict
from psycopg.pq import TransactionStatus

from domain.errors import (
    IdempotencyConflict,
    LockTimeout,
    NotFound,
    SchemaError,
    StartGuardError,
    StoreUnavailable,
    VersionConflict,
)
from domain.records import Record
from eventstore import pg_statistics
from eventstore.api import PENDING_POSITION, LockJoin, Row
from eventstore.locks import (
    DEFAULT_LOCK_TIMEOUT_MS,
    LOCK_TABLE,
    MIGRATION_LOCK,
    advisory_key,
    lock_bucket,
)
from eventstore.pg_append import (
    APPEND_OR_ABORT_SQL,
    APPEND_SQL,
    BATCH_MARKS,
    GUARD_SQLSTATE,
    LOCK_HEADS,
    REFUSED_SQLSTATE,
)
from eventstore.pg_arrays import JSON_COLUMN_TYPES, Int8Array, JsonRows, TextArray, column_array
from eventstore.pg_unavailable import bounded_session, unavailable
from eventstore.replay import BaseReplaySession
from eventstore.store import BaseStore
from eventstore.transaction import EVENT_COLUMNS, BaseTransaction, Refused
from eventstore.validation import EncodedBatch, EncodedEvent, record_from_event

log = logging.getLogger(__name__)

_PIPELINE = psycopg.Pipeline.is_supported()
T = TypeVar("T")
_IDLE = TransactionStatus.IDLE
DEFAULT_POOL_MAX_SIZE = 10
DEFAULT_CONNECT_TIMEOUT_S = 10.0
POOL_FIRST_WAIT_S = 0.5  # before `_take` asks whether the pool can make a connection
CLOCK_SQL = "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint"
# rows in bucket order, each locked as it comes: one order for every waiter
# `= ANY (ARRAY(...))`, not `IN (SELECT ...)`: the plan's estimates then do not depend
# on the keys given, so the server keeps one plan instead of planning every call (an
# index scan in bucket order: the lock order)
LOCK_ALL_SQL = (
    f"SELECT count(*) FROM (SELECT 1 FROM {LOCK_TABLE} l WHERE l.bucket = ANY (ARRAY("
    f"SELECT {lock_bucket('k')} FROM unnest(%b::text[]) k)) "
    "ORDER BY l.bucket FOR UPDATE OF l) x"
)
# each lock on its own, never waiting: the names whose row this transaction now holds
# (`try_lock`, all or nothing, is "all of them"); `= ANY (ARRAY(...))` as above
TRY_LOCK_EACH_SQL = (
    f"WITH k AS (SELECT k, {lock_bucket('k')} AS bucket FROM unnest(%b::text[]) k), "
    f"l AS MATERIALIZED (SELECT l.bucket FROM {LOCK_TABLE} l WHERE l.bucket = ANY "
    "(ARRAY(SELECT bucket FROM k)) FOR UPDATE OF l SKIP LOCKED) "
    "SELECT k.k FROM k JOIN l USING (bucket)"
)
# The tail of each stream after a version, in one statement for any number of streams:
# for each (stream, version) pair a range of the (stream_id, stream_version) index, not
# an OR per stream. The lateral subquery (OFFSET 0 keeps it one) leaves the planner no
# join to choose, so a plan kept from when events was small never scans the table.
TAIL_SQL = (
    f"SELECT {', '.join(f'e.{c}' for c in EVENT_COLUMNS.split(', '))} "
    "FROM unnest(%b::text[], %b::bigint[]) AS w(stream_id, after) "
    "CROSS JOIN LATERAL (SELECT * FROM events e WHERE e.stream_id = w.stream_id "
    "AND e.stream_version > w.after OFFSET 0) e "
    "ORDER BY e.stream_id, e.stream_version"
)
_HEADS_SQL = "SELECT stream_id, version FROM streams WHERE stream_id = ANY(%b)"
_LOCK_HEADS_SQL = f"SELECT stream_id, version FROM {LOCK_HEADS}(%b, %s)"


def quote_ident(name: str) -> str:
    """A table name as an SQL identifier."""
    return '"' + name.replace('"', '""') + '"'


@functools.lru_cache(maxsize=512)
def _native(sql: str) -> str:
    """`?` placeholders -> psycopg's `%s` (our SQL never holds a literal `?` or `%`)."""
    return sql.replace("?", "%s")


@dataclass(slots=True)
class _UpsertGroup:
    """Upserts of distinct tables queued as one statement (`_queue_upsert`)."""

    entry: tuple[str, list[Sequence[Any]], psycopg.Cursor | None]
    tables: set[str]
    statements: list[str]
    params: list[Any]


class PostgresTransaction(BaseTransaction):
    """A transaction (or read session) on one pooled connection."""

    dialect = "postgresql"

    def __init__(
        self,
        conn: psycopg.Connection,
        lock_timeout_ms: int = DEFAULT_LOCK_TIMEOUT_MS,
        explicit_begin: bool = False,
        column_types: dict[str, dict[str, str]] | None = None,
    ) -> None:
        super().__init__()
        self._conn = conn
        # table -> column -> type, as the catalog says (`upsert`); shared by the store
        self._column_types = column_types if column_types is not None else {}
        self._cursor = conn.cursor()
        self._lock_timeout_ms = lock_timeout_ms
        # on an autocommit connection the transaction's BEGIN is sent by us, in the
        # pipeline of its first statement (psycopg's implicit BEGIN waits for its answer)
        self._begin_pending = explicit_begin
        self.begun = False
        # executemany answers nothing, so a store transaction queues its statements
        # and sends them in the pipeline of the next statement or of COMMIT: the read
        # models' writes after an append cost no round trip of their own
        self._defers = explicit_begin and _PIPELINE
        # (sql, params of each execution, the cursor that keeps its answer or None)
        self._queued: list[tuple[str, list[Sequence[Any]], psycopg.Cursor | None]] = []
        # append_at_commit: each batch, its records as returned (positions pending) and
        # the cursor its positions come back on
        self._at_commit: list[tuple[list[Record], EncodedBatch, psycopg.Cursor]] = []
        # try_lock_each_ahead and the like: statements whose answer is read later, each
        # on its cursor
        self._answered: list[tuple[str, Sequence[Any], psycopg.Cursor]] = []
        # the server's clock, asked for in the pipeline of the transaction's first
        # statement (read when first needed) or, asked for before any, on its own
        self._clock_cursor: psycopg.Cursor | None = None
        self._clock: int | None = None
        # locks queued by lock_ahead, not yet answered (their LockTimeout is due)
        self._locks_queued = False
        # read_ahead: queries to send after the next statement, then their rows
        self._ahead: list[tuple[str, Sequence[Any]]] = []
        self._ahead_rows: dict[tuple[str, tuple[Any, ...]], list[Row]] = {}
        # the queued upserts the next one of another table joins (_queue_upsert)
        self._upserts: _UpsertGroup | None = None
        # append_at_commit: the pipeline its append went out in, open until the next
        # statement that waits for an answer (or COMMIT) syncs it
        self._open_pipeline: AbstractContextManager[psycopg.Pipeline] | None = None

    def clock_ms(self) -> int:
        """The server's `clock_timestamp()` as the transaction's first statement left
        it (docs/DESIGN.md, "One clock per store")."""
        if self._clock is None:
            if self._clock_cursor is not None:
                row = self._clock_cursor.fetchone()
            else:  # asked for before any statement: a round trip of its own
                row = self._send(self._conn.cursor(), CLOCK_SQL, None).fetchone()
            assert row is not None
            self._clock = int(row[0])
            if self.clock_of is not None:
                self.clock_of.saw_clock(self._clock)
        return self._clock

    def _ask_clock(self) -> None:
        """Inside the pipeline of the first statement (after it): the server's clock."""
        if self._clock_cursor is None and self._clock is None:
            self._clock_cursor = self._conn.cursor()
            self._clock_cursor.execute(CLOCK_SQL, prepare=False)

    def _rows(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        return self._send(self._cursor, _native(sql), params or None).fetchall()

    def _try_lock_join(self, name_sql: str) -> LockJoin:
        # the lock rows, not the rows read, are locked: a writer takes a lock row before
        # its append and holds it to COMMIT, so no wait it meets after the append is on
        # a row locked here (the append's position lock then could deadlock)
        return LockJoin(
            f"JOIN {LOCK_TABLE} qlflow_lock ON qlflow_lock.bucket = {lock_bucket(name_sql)}",
            "FOR UPDATE OF qlflow_lock SKIP LOCKED",
        )

    def _rows_all(
        self, queries: Sequence[tuple[str, Sequence[Any]]], prepared: bool = False
    ) -> list[list[Row]]:
        if self._ahead_rows:
            keys = [(sql, tuple(params)) for sql, params in queries]
            if all(key in self._ahead_rows for key in keys):  # read ahead (read_ahead)
                return [self._ahead_rows.pop(key) for key in keys]
        if not _PIPELINE:
            return [self._rows(sql, params) for sql, params in queries]
        cursors = []
        conn = self._conn
        self.round_trips += 1
        # BEGIN (if due), what waits, and every query in one round trip
        with self._pipeline():
            begins = self._begin_pending
            self._send_prelude()
            prepare = None if prepared else False  # None: psycopg's own threshold
            for sql, params in queries:
                cursor = conn.cursor()
                cursor.execute(_native(sql), params or None, prepare=prepare)
                cursors.append(cursor)
            if begins:
                self._ask_clock()
        return [cursor.fetchall() for cursor in cursors]

    @contextmanager
    def _pipeline(self) -> Iterator[None]:
        """A pipeline; a lock queued by `lock_ahead` that times out in it is a
        LockTimeout (and the transaction can only roll back)."""
        locks, self._locks_queued = self._locks_queued, False
        opened, self._open_pipeline = self._open_pipeline, None
        try:
            if opened is None:
                with self._conn.pipeline():
                    yield
            else:
                # what follows goes in the pipeline the append opened, and its sync
                # answers the append too: no round trip of its own
                try:
                    yield
                except BaseException as exc:
                    opened.__exit__(type(exc), exc, exc.__traceback__)
                    raise
                opened.__exit__(None, None, None)
        except pg_errors.LockNotAvailable as exc:
            if not locks:
                raise
            error = LockTimeout(
                f"locks: not granted within {self._lock_timeout_ms} ms, another session "
                "holds one; nothing was written — try again"
            )
            self.failure = error
            raise error from exc
        except psycopg.Error as exc:
            if exc.sqlstate != REFUSED_SQLSTATE:
                raise
            refused = self._refusal(exc)
            self.failure = refused
            raise refused from None

    def _refusal(self, exc: psycopg.Error) -> VersionConflict | IdempotencyConflict:
        """What `qlflow_append_or_abort` refused, as `append` would say it (the
        transaction is aborted: nothing of it is written)."""
        stream_id, head = exc.diag.message_primary or "", exc.diag.message_detail or ""
        for _pending, batch, _cursor in self._at_commit:
            for append in batch.appends:
                if append.stream_id == stream_id:
                    return VersionConflict(stream_id, append.expected_version, int(head or 0))
        first = self._at_commit[0][1].events[0].event_id if self._at_commit else "?"
        return IdempotencyConflict(first, "elsewhere in the log (an id of this batch)")

    def _lock_ahead(self, keys: list[str], stream_ids: list[str]) -> None:
        if not self._defers:
            super()._lock_ahead(keys, stream_ids)
            return
        # sent with the next statement, in this order (docs/DESIGN.md "Locks")
        if keys:
            self._queued.append((LOCK_ALL_SQL, [(keys,)], None))
        if stream_ids:
            self._queued.append((_LOCK_HEADS_SQL, [(stream_ids, True)], None))
        self._locks_queued = True

    def _try_lock_each_ahead(self, keys: list[str]) -> Callable[[], frozenset[str]]:
        if not self._defers:
            return super()._try_lock_each_ahead(keys)
        return self._answer_later(
            TRY_LOCK_EACH_SQL, (keys,), lambda rows: frozenset(row[0] for row in rows)
        )

    def _lock_heads_each_ahead(self, stream_ids: list[str]) -> Callable[[], dict[str, int]]:
        if not self._defers:
            return super()._lock_heads_each_ahead(stream_ids)
        return self._answer_later(
            _LOCK_HEADS_SQL, (stream_ids, False), lambda rows: self._heads_taken(stream_ids, rows)
        )

    def _answer_later(
        self, sql: str, params: Sequence[Any], shape: Callable[[list[Row]], T]
    ) -> Callable[[], T]:
        """`sql` queued to go with the next statement; `shape` of its rows when first
        asked for, the same answer after (asked before that statement, it is sent
        alone)."""
        cursor = self._conn.cursor()
        self._answered.append((sql, params, cursor))
        answers: list[T] = []

        def answer() -> T:
            if not answers:
                if any(queued is cursor for _sql, _params, queued in self._answered):
                    self._flush()  # asked before the next statement took it along
                answers.append(shape(cursor.fetchall()))
            return answers[0]

        return answer

    def _heads_ahead(self, stream_ids: list[str]) -> Callable[[], list[tuple[str, int]]]:
        if not self._defers:
            return super()._heads_ahead(stream_ids)
        return self._answer_later(
            _HEADS_SQL, (stream_ids,), lambda rows: [(s, int(version)) for s, version in rows]
        )

    def _flush(self) -> None:
        """Send what waits (BEGIN, queued statements) in one round trip of its own."""
        self.round_trips += 1
        with self._pipeline():
            self._send_prelude()

    def read_ahead(self, queries: Sequence[tuple[str, Sequence[Any]]]) -> None:
        self._check_usable()
        if self._defers:
            # what a guess read ahead already (`read_ahead_of_runs`) is not sent again
            answered = self._ahead_rows
            self._ahead = [q for q in queries if (q[0], tuple(q[1])) not in answered]

    @property
    def sends_reads_ahead(self) -> bool:
        return self._defers

    def _wrote(self) -> None:
        """A statement that may write: what was read ahead may no longer hold."""
        self._ahead = []
        self._ahead_rows = {}

    def _run(self, sql: str, params: Sequence[Any] = (), prepared: bool = False) -> psycopg.Cursor:
        self._wrote()
        return self._send(self._conn.cursor(), _native(sql), params or None, prepared)

    def _run_many(self, sql: str, seq_of_params: Iterable[Sequence[Any]]) -> None:
        self._wrote()
        if self._defers:
            params = list(seq_of_params)
            if params:
                self._queued.append((_native(sql), params, None))
            return
        # psycopg pipelines the executions: one round trip for the lot, not one each
        with self._conn.cursor() as cursor:
            if self._begin_pending:
                self._send_begin()
                self.round_trips += 1
            self.round_trips += 1
            cursor.executemany(_native(sql), seq_of_params)

    def _upsert(
        self,
        table: str,
        columns: list[str],
        key: list[str],
        rows: Sequence[Sequence[Any]],
        stored: Sequence[Sequence[Any] | None] | None,
    ) -> None:
        # one statement for every row: each column an array (binary), unnested; a
        # statement per row costs the client more than the server's work on it.
        # `stored` is not needed: PostgreSQL compares an update's values itself (an
        # unchanged indexed column keeps the update HOT)
        self._wrote()
        types = self._types_of(table)
        if not set(columns) <= types.keys():  # the table changed since it was looked at
            self._column_types.pop(table, None)
            types = self._types_of(table)
        updates = ", ".join(f"{c} = excluded.{c}" for c in columns if c not in key)
        upsert = f"INSERT INTO {table} ({', '.join(columns)}) SELECT "
        conflict = f"ON CONFLICT ({', '.join(key)}) DO UPDATE SET {updates}"
        params: list[Any]
        if all(types[column] in JSON_COLUMN_TYPES for column in columns):
            # the rows as one JSON array of arrays (one orjson call): a tenth of the
            # client's time of a binary array per column (eventstore.pg_arrays)
            picks = ", ".join(f"(r->>{i})::{types[c]}" for i, c in enumerate(columns))
            sql = f"{upsert}{picks} FROM jsonb_array_elements(%b::jsonb) r {conflict}"
            params = [JsonRows(rows)]
        else:
            arrays = ", ".join(f"%b::{types[column]}[]" for column in columns)
            sql = f"{upsert}* FROM unnest({arrays}) {conflict}"
            params = [
                column_array(types[column], list(values))
                for column, values in zip(columns, zip(*rows, strict=True), strict=True)
            ]
        if self._defers:
            self._queue_upsert(table, sql, params)
            return
        with self._conn.cursor() as cursor:
            if self._begin_pending:
                self._send_begin()
                self.round_trips += 1
            self.round_trips += 1
            cursor.execute(sql, params)

    def _queue_upsert(self, table: str, sql: str, params: list[Any]) -> None:
        """Queue an upsert; one that follows queued upserts of other tables joins
        them in one statement (a data-modifying WITH): the read models' writes of a
        transaction cost one statement, not one per table. Upserts of one table are
        never joined (a row updated twice in one statement is an error), nor is
        anything else (a statement in a WITH does not see the others' rows)."""
        group = self._upserts
        queued_last = group is not None and self._queued and self._queued[-1] is group.entry
        if group is not None and queued_last and table not in group.tables:
            group.tables.add(table)
            group.statements.append(sql)
            group.params.extend(params)
            *joined, last = group.statements
            with_sql = ", ".join(f"u{i} AS ({s})" for i, s in enumerate(joined))
            group.entry = (f"WITH {with_sql} {last}", [group.params], None)
            self._queued[-1] = group.entry
            return
        entry: tuple[str, list[Sequence[Any]], psycopg.Cursor | None] = (sql, [params], None)
        self._queued.append(entry)
        self._upserts = _UpsertGroup(entry, {table}, [sql], list(params))

    def _types_of(self, table: str) -> dict[str, str]:
        """Each column's type, from the catalog (once per table and store)."""
        found = self._column_types.get(table)
        if found is None:
            rows = self._send(
                self._conn.cursor(),
                "SELECT a.attname, format_type(a.atttypid, a.atttypmod) FROM pg_attribute a "
                "WHERE a.attrelid = to_regclass(%s) AND a.attnum > 0 AND NOT a.attisdropped",
                (table,),
            ).fetchall()
            found = self._column_types[table] = dict(rows)
        return found

    def _send_begin(self) -> None:
        self._begin_pending = False
        self.begun = True
        self._conn.execute("BEGIN", prepare=False)

    def _send_prelude(self) -> None:
        """Inside an open pipeline: BEGIN if not sent yet, then the queued statements."""
        if self._begin_pending:
            self._send_begin()
        queued, self._queued = self._queued, []
        if queued:
            cursor = self._conn.cursor()
            for sql, many, own in queued:
                for params in many:
                    (own or cursor).execute(sql, params)
        answered, self._answered = self._answered, []
        for sql, params, own in answered:
            own.execute(sql, params)

    def _send(
        self, cursor: psycopg.Cursor, sql: str, params: Any, prepared: bool = False
    ) -> psycopg.Cursor:
        prepare = None if prepared else False
        conn = self._conn
        self.round_trips += 1
        if (
            self._begin_pending
            or self._queued
            or self._answered
            or self._ahead
            or self._open_pipeline is not None
        ):
            if not _PIPELINE:
                self._send_begin()
                self.round_trips += 1
                return cursor.execute(sql, params, prepare=prepare)
            # BEGIN, what waits, this statement and what is read ahead in one round trip
            ahead, self._ahead = self._ahead, []
            cursors = []
            with self._pipeline():
                self._send_prelude()
                cursor.execute(sql, params, prepare=prepare)
                for query, values in ahead:  # key lookups of the read models: prepared
                    cursors.append(conn.cursor())
                    cursors[-1].execute(_native(query), values or None)
                self._ask_clock()
            self._ahead_rows = {
                (query, tuple(values)): found.fetchall()
                for (query, values), found in zip(ahead, cursors, strict=True)
            }
            return cursor
        if _PIPELINE and not conn.autocommit and conn.pgconn.transaction_status == _IDLE:
            # (a replay session's connection) the implicit BEGIN in a pipeline
            with conn.pipeline():
                cursor.execute(sql, params, prepare=prepare)
            return cursor
        return cursor.execute(sql, params, prepare=prepare)

    def finish(self, commit: bool) -> None:
        """COMMIT (with what is still queued, in one round trip) or ROLLBACK."""
        conn = self._conn
        if self.begun or self._queued:
            self.round_trips += 1  # COMMIT (with what waits) or ROLLBACK
        if not commit:
            self._close_pipeline()
        if commit and (self._queued or self._open_pipeline is not None):
            try:
                with self._pipeline():
                    self._send_prelude()
                    conn.execute("COMMIT", prepare=False)
            except (VersionConflict, IdempotencyConflict):
                conn.execute("ROLLBACK", prepare=False)  # an append at COMMIT refused
                raise
            finally:
                self._close_pipeline()  # a failure before its sync left it open
        elif commit and self.begun:
            conn.execute("COMMIT", prepare=False)
        elif self.begun and not conn.broken:  # a lost connection has nothing to roll back
            self._queued = []
            self._at_commit = []
            conn.execute("ROLLBACK", prepare=False)
        if commit:
            for pending, _batch, cursor in self._at_commit:
                [(positions,)] = cursor.fetchall()
                self.appended += [
                    Record(r.event_id, r.stream_id, r.stream_version, p, r.type, r.data, r.metadata)
                    for r, p in zip(pending, positions, strict=True)
                ]
            self._at_commit = []

    def append_at_commit(self, batch: EncodedBatch) -> list[Record]:
        """Queued (PostgreSQL write transactions): the append goes with the next
        statement or with COMMIT, through `qlflow_append_or_abort`, so that a refusal
        aborts what follows it (docs/DESIGN.md "Two round trips")."""
        self._check_usable()
        if not self._defers or self._through is not None:
            return super().append_at_commit(batch)
        cursor = self._conn.cursor()
        self._queued.append((APPEND_OR_ABORT_SQL, [self._batch_params(batch)], cursor))
        pending = [record_from_event(event, PENDING_POSITION) for event in batch.events]
        self._at_commit.append((pending, batch, cursor))
        if not self._begin_pending and not self._answered:
            self._send_unsynced()
        return pending

    def _send_unsynced(self) -> None:
        """Send what waits (the append last) in a pipeline left open, without a sync:
        the server works on it while this process folds the read models' rows, and the
        statement that next waits for an answer (or COMMIT) goes in the same pipeline
        (docs/DESIGN.md "Two round trips"). Only statements whose answers are read
        after a sync go this way: a fetch in a pipeline whose append was refused would
        wait for rows the server never sends."""
        if self._open_pipeline is None:
            opened = self._conn.pipeline()
            opened.__enter__()
            self._open_pipeline = opened
        self._send_prelude()

    def _close_pipeline(self) -> None:
        """End a pipeline `append_at_commit` left open that nothing synced (the
        transaction rolls back: its answers, an error among them, are not wanted)."""
        opened, self._open_pipeline = self._open_pipeline, None
        if opened is not None and not self._conn.broken:
            try:
                opened.__exit__(None, None, None)
            except psycopg.Error as exc:
                log.debug("the pipeline of a transaction rolled back ended with: %s", exc)

    def _rows_by_event_id(self, event_ids: Sequence[str]) -> list[Row]:
        return self._send(
            self._cursor,
            f"SELECT {EVENT_COLUMNS} FROM events WHERE event_id = ANY(%b)",
            (list(event_ids),),
            prepared=True,
        ).fetchall()

    def _rows_by_stream(self, stream_ids: Sequence[str]) -> list[Row]:
        return self._send(
            self._cursor,
            f"SELECT {EVENT_COLUMNS} FROM events WHERE stream_id = ANY(%b) "
            "ORDER BY stream_id, stream_version",
            (list(stream_ids),),
            prepared=True,
        ).fetchall()

    def _rows_after(self, stream_ids: Sequence[str], versions: Sequence[int]) -> list[Row]:
        return self._send(
            self._cursor,
            TAIL_SQL,
            (TextArray(stream_ids), Int8Array(versions)),
            prepared=True,
        ).fetchall()

    def _heads(self, stream_ids: Sequence[str]) -> list[tuple[str, int]]:
        return self._send(
            self._cursor,
            _HEADS_SQL,
            (list(stream_ids),),
            prepared=True,
        ).fetchall()

    # -- locks ---------------------------------------------------------------------------

    def _lock(self, key: str) -> None:
        if key == MIGRATION_LOCK:  # taken before qlflow_locks exists (eventstore.locks)
            sql = f"SELECT pg_advisory_xact_lock({advisory_key('%s')})"
        else:
            sql = f"SELECT 1 FROM {LOCK_TABLE} WHERE bucket = {lock_bucket('%s')} FOR UPDATE"
        self._waiting(sql, (key,), repr(key))

    def _lock_all(self, keys: list[str]) -> None:
        # rows in bucket order, each locked as it comes: one order for every waiter
        self._waiting(LOCK_ALL_SQL, (keys,), f"{len(keys)} lock(s)")

    def _try_lock_each(self, keys: list[str]) -> frozenset[str]:
        return frozenset(row[0] for row in self._send(self._cursor, TRY_LOCK_EACH_SQL, (keys,)))

    def _lock_heads_each(self, stream_ids: list[str]) -> dict[str, int]:
        rows = self._send(self._cursor, _LOCK_HEADS_SQL, (stream_ids, False)).fetchall()
        return self._heads_taken(stream_ids, rows)

    def _lock_heads(self, stream_ids: list[str], wait: bool) -> dict[str, int] | None:
        # through qlflow_lock_heads: FOR UPDATE needs an UPDATE grant no runtime role has.
        # Waiting, rows are locked in stream id order: every waiting locker takes the
        # same order, so two of them cannot deadlock on heads
        sql = _LOCK_HEADS_SQL
        if not wait:
            taken = self._lock_heads_each(stream_ids)
            return taken if len(taken) == len(stream_ids) else None
        versions = dict.fromkeys(stream_ids, 0)
        versions.update(self._waiting(sql, (stream_ids, True), "stream heads"))
        return versions

    def _heads_taken(self, stream_ids: list[str], rows: list[Row]) -> dict[str, int]:
        """The heads `qlflow_lock_heads(..., wait=false)` locked, and the streams that
        do not exist (version 0): a stream it did not answer exists only when another
        transaction holds its head."""
        taken: dict[str, int] = dict(rows)
        unseen = [stream_id for stream_id in stream_ids if stream_id not in taken]
        if unseen:
            exist = {stream_id for stream_id, version in self._heads(unseen) if version}
            taken.update((stream_id, 0) for stream_id in unseen if stream_id not in exist)
        return taken

    def _function_comment(self, signature: str) -> str | None:
        rows = self._rows(
            "SELECT coalesce(obj_description(p, 'pg_proc'), '') "
            "FROM to_regprocedure(?) AS p WHERE p IS NOT NULL",
            (signature,),
        )
        return rows[0][0] if rows else None

    def _call(self, function: str, args: Sequence[Any]) -> Any:
        marks = ", ".join(["%s"] * len(args))
        rows = self._waiting(f"SELECT {function}({marks})", tuple(args), f"{function}()")
        return rows[0][0]

    def _waiting(self, sql: str, params: Sequence[Any], what: str) -> list[Row]:
        """Run `sql`, whose lock waits are bounded by the session's lock timeout (set on
        every connection: `bounded_session`), as LockTimeout."""
        try:
            return self._send(self._conn.cursor(), sql, params).fetchall()
        except pg_errors.LockNotAvailable as exc:
            raise LockTimeout(
                f"{what}: not granted within {self._lock_timeout_ms} ms, another session "
                "holds it; nothing was written — try again"
            ) from exc

    # -- append ----------------------------------------------------------------------------

    def _write(self, batch: EncodedBatch) -> list[int] | Refused:
        # CAS, position allocation and insert in one function call: one round trip
        params = self._batch_params(batch)
        sql = APPEND_SQL
        if self._through is not None:
            function, args = self._through
            marks = ", ".join(["%s"] * len(args) + [BATCH_MARKS])
            sql = f"SELECT positions, refused, moved FROM {function}({marks})"
            params = [*args, *params]
        # a function call only: a cached generic plan stays right at any table size
        try:
            [(positions, refused, moved)] = self._send(
                self._cursor, sql, params, prepared=self._through is None
            ).fetchall()
        except psycopg.Error as exc:
            if exc.sqlstate != GUARD_SQLSTATE:
                raise
            message = str(exc).strip().splitlines()[0]
            error = StartGuardError(message)
            error.reason = message.partition(":")[0]
            raise error from None
        if positions is not None:
            return list(positions)
        stream = next((a for a in batch.appends if a.stream_id == refused), None)
        return Refused(stream, heads_moved=bool(moved))

    @staticmethod
    def _batch_params(batch: EncodedBatch) -> list[Any]:
        """The append functions' batch arguments (binary arrays)."""
        events = batch.events
        return [
            TextArray([a.stream_id for a in batch.appends]),
            Int8Array([a.expected_version for a in batch.appends]),
            Int8Array([a.new_version for a in batch.appends]),
            TextArray([e.event_id for e in events]),
            TextArray([e.stream_id for e in events]),
            Int8Array([e.stream_version for e in events]),
            TextArray([e.type for e in events]),
            TextArray([e.data for e in events]),
            TextArray([e.metadata for e in events]),
        ]

    def _insert(self, events: Sequence[EncodedEvent]) -> list[int] | None:
        raise AssertionError("PostgreSQL appends go through qlflow_append (_write)")


class PostgresStore(BaseStore):
    """The event store on one PostgreSQL database (schema chosen by the search_path)."""

    dialect = "postgresql"
    single_writer = False

    def __init__(
        self,
        url: str,
        pool_max_size: int = DEFAULT_POOL_MAX_SIZE,
        connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
        lock_timeout_ms: int = DEFAULT_LOCK_TIMEOUT_MS,
        read_only: bool = False,
    ) -> None:
        super().__init__(url, read_only)
        self.lock_timeout_ms = lock_timeout_ms
        self._column_types: dict[str, dict[str, str]] = {}  # see PostgresTransaction.upsert
        self.connect_timeout_s = connect_timeout_s  # also how long a call waits for a connection
        self._own: set[int] = set()  # connections `_take` made itself (see there)
        self._growth = pg_statistics.GrowthMarks(0)  # until the log's size is read below
        self._pool = psycopg_pool.ConnectionPool(
            url,
            min_size=1,
            max_size=pool_max_size,
            kwargs={"autocommit": False},
            # a pooled connection the server closed (restart, idle_session_timeout,
            # pg_terminate_backend) is replaced when taken, not handed out dead
            check=_check_when_spoken_to,
            configure=functools.partial(bounded_session, lock_timeout_ms, read_only),
            open=False,
            name="qlflow-eventstore",
        )
        try:
            try:
                self._pool.open(wait=True, timeout=connect_timeout_s)
            except psycopg_pool.PoolTimeout as exc:
                raise StoreUnavailable(
                    "unreachable",
                    f"cannot connect to PostgreSQL ({_describe(url)}) within "
                    f"{connect_timeout_s:g}s: is it running, and is the URL right?",
                ) from exc
            if read_only:
                self._refuse_missing()
            self._migrate_own_schema()
            with self._reading() as session:  # the server's time, until a write reads it
                self.saw_clock(int(session.query(CLOCK_SQL)[0][0]))
                events = session.query(pg_statistics.EVENTS_ESTIMATE_SQL)
            self._growth = pg_statistics.GrowthMarks(int(events[0][0]) if events else 0)
        except BaseException:
            self._pool.close()
            raise

    def _take(self) -> psycopg.Connection:
        """A connection for one unit: the pool's — or, while the pool cannot make one
        and is not full, one of the store's own, closed after use. After connections
        failed (a server restart, a storm of terminated backends) the pool waits longer
        and longer before it tries again (seconds), so the first writes after the
        server answers again would otherwise fail for no reason but that wait."""
        first_wait_s = min(POOL_FIRST_WAIT_S, self.connect_timeout_s)
        try:
            return self._pool.getconn(timeout=first_wait_s)
        except psycopg_pool.PoolTimeout:
            if self._pool.get_stats().get("pool_size", 0) >= self._pool.max_size:
                # every connection is in use: wait for one, as long as the store waits
                return self._pool.getconn(timeout=self.connect_timeout_s - first_wait_s)
        conn = psycopg.connect(
            self.url, autocommit=False, connect_timeout=max(1, int(self.connect_timeout_s))
        )
        try:
            bounded_session(self.lock_timeout_ms, self.read_only, conn)
        except BaseException:
            conn.close()
            raise
        self._own.add(id(conn))
        return conn

    def _give_back(self, conn: psycopg.Connection) -> None:
        if id(conn) in self._own:
            self._own.discard(id(conn))
            conn.close()
        else:  # the pool rolls back or discards a connection left in a transaction
            self._pool.putconn(conn)

    def _begin(self) -> PostgresTransaction:
        conn = self._take()
        try:
            conn.autocommit = True  # the transaction sends its own BEGIN (see _send)
            tx = PostgresTransaction(
                conn, self.lock_timeout_ms, explicit_begin=True, column_types=self._column_types
            )
            # the pool's check of this connection, if it had to ask the server
            tx.round_trips = _CHECKED.pop(conn, 0)
            return tx
        except BaseException:
            self._give_back(conn)
            raise

    def _finish(self, tx: BaseTransaction, commit: bool) -> None:
        assert isinstance(tx, PostgresTransaction)
        tx.ended = True
        conn = tx._conn
        try:
            tx.finish(commit)
        finally:
            self._give_back(conn)

    def _after_appending(self, position: int) -> None:
        """A commit that crossed a growth mark of the log gathers the tables'
        statistics again, so that kept plans are made again for their size
        (`eventstore.pg_statistics`). The commit is done: a failure here is logged,
        never the caller's."""
        if not self._growth.crossed(position):
            return
        try:
            self._analyse("")
        except Exception as exc:  # best effort after the commit (see above)
            log.warning("analysing the grown tables failed (autovacuum will): %s", exc)

    @contextmanager
    def _session(self) -> Iterator[PostgresTransaction]:
        conn = self._take()
        try:
            conn.autocommit = True  # a read is one statement: no BEGIN / COMMIT round trips
            session = PostgresTransaction(
                conn, self.lock_timeout_ms, column_types=self._column_types
            )
            try:
                yield session
            finally:
                session.ended = True
                conn.autocommit = False
        finally:
            self._give_back(conn)

    def _prepare_versions_table(self, tx: BaseTransaction) -> None:
        tx.lock(MIGRATION_LOCK)  # bounded: a lock held elsewhere is a LockTimeout
        # A role without CREATE on the schema (the runtime role of actors.roles)
        # may open a migrated store: CREATE TABLE IF NOT EXISTS would still be refused.
        exists = tx.query(
            "SELECT 1 FROM pg_tables WHERE schemaname = current_schema() "
            "AND tablename = 'schema_versions'"
        )
        if exists:
            return
        try:
            tx.execute(
                "CREATE TABLE IF NOT EXISTS schema_versions "
                "(component TEXT PRIMARY KEY, version INTEGER NOT NULL)"
            )
        except pg_errors.InvalidSchemaName as exc:
            raise SchemaError(
                "no schema to create tables in: the search_path of the URL names no "
                f"existing schema ({exc})"
            ) from exc

    def _after_migrating(self) -> None:
        # the planner knows nothing of a table never analysed (reltuples -1) until
        # autovacuum gets to it, and guesses badly for the first thousands of rows:
        # an empty table analysed is known empty, its estimates then follow its size
        # (docs/DESIGN.md "A fresh store")
        self._analyse(pg_statistics.NEVER_ANALYSED)

    def _analyse(self, condition: str) -> None:
        """ANALYZE the tables of the schema this role owns that meet `condition`."""
        with self._reading() as session:
            tables = session.query(f"{pg_statistics.OWNED_TABLES_SQL}{condition} ORDER BY 1")
            if tables:
                session.execute(pg_statistics.analyse_sql([quote_ident(n) for (n,) in tables]))

    def _reclaim(self) -> list[str]:
        # VACUUM runs outside a transaction: a read session's connection is in
        # autocommit and sends no BEGIN; a table another role owns would be skipped
        # with a warning, so only the owned ones are named
        with self._reading() as session:
            owned = [
                str(name)
                for (name,) in session.query(
                    "SELECT c.relname FROM pg_class c WHERE c.relnamespace = "
                    "current_schema()::regnamespace AND c.relkind = 'r' "
                    "AND pg_has_role(c.relowner, 'USAGE') ORDER BY 1"
                )
            ]
            if owned:
                session.execute(f"VACUUM {', '.join(quote_ident(name) for name in owned)}")
            if "events" in owned:
                _rebuild_sparse_indexes(session)
        return owned

    def _recorded_version(self, session: BaseTransaction, component: str) -> int | None:
        if session.query("SELECT to_regclass('schema_versions')")[0][0] is None:
            return None
        rows = session.query(
            "SELECT version FROM schema_versions WHERE component = ?", (component,)
        )
        return int(rows[0][0]) if rows else 0

    def _refuse_missing(self) -> None:
        """A read-only open finds a qlflow store or says where it looked."""
        with self._reading() as session:
            [(schema, database)] = session.query("SELECT current_schema(), current_database()")
            found = self._recorded_version(session, "eventstore")
        if not found:
            where = f"schema {schema}" if schema else "the search_path (no existing schema)"
            raise NotFound(
                f"no qlflow store in {where} of database {database} ({_describe(self.url)}); "
                "a read command never creates one — check --db"
            )

    def _unavailable(self, error: BaseException) -> StoreUnavailable | None:
        return unavailable(error, _describe(self.url))

    def _replay_session(self) -> PostgresReplaySession:
        return PostgresReplaySession(self.url, self.lock_timeout_ms)

    def _close(self) -> None:
        self._pool.close()


class PostgresReplaySession(BaseReplaySession):
    """A replay session on a connection of its own (outside the pool); the copies live
    in its `pg_temp` schema and are filled by COPY."""

    temp_schema = "pg_temp"
    null_safe_equal = "IS NOT DISTINCT FROM"
    reads_ahead = True  # the server reads the next batch while this process folds

    def __init__(self, url: str, lock_timeout_ms: int) -> None:
        self._url, self._lock_timeout_ms = url, lock_timeout_ms
        self._conn = psycopg.connect(url, autocommit=False)
        try:
            bounded_session(lock_timeout_ms, False, self._conn)
            self.tx = PostgresTransaction(self._conn, lock_timeout_ms)
            self.live_schema = self.tx.query("SELECT current_schema()")[0][0]
            self._conn.commit()
        except BaseException:
            self._conn.close()
            raise

    def columns(self, table: str) -> list[str]:
        rows = self.tx.query(
            "SELECT column_name FROM information_schema.columns "
            "WHERE table_schema = ? AND table_name = ? ORDER BY ordinal_position",
            (self.live_schema, table),
        )
        return [row[0] for row in rows]

    def insert(self, table: str, columns: Sequence[str], rows: Sequence[Row]) -> None:
        sql = f"COPY {self.copy(table)} ({', '.join(columns)}) FROM STDIN"
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

    def reading(self) -> AbstractContextManager[None]:
        return self._transaction(None, commit=True)

    def exclusive(self) -> AbstractContextManager[None]:
        # every append holds this row lock from its position allocation to COMMIT
        return self._transaction("SELECT last FROM qlflow_position FOR UPDATE", commit=True)

    def snapshot(self) -> AbstractContextManager[None]:
        return self._transaction("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ", commit=False)

    def close(self) -> None:
        self._conn.close()

    def _log_reader(self) -> PostgresTransaction:
        conn = psycopg.connect(self._url, autocommit=True)
        try:
            bounded_session(self._lock_timeout_ms, False, conn)
        except BaseException:
            conn.close()
            raise
        return PostgresTransaction(conn, self._lock_timeout_ms)

    def _close_reader(self, reader: BaseTransaction) -> None:
        assert isinstance(reader, PostgresTransaction)
        reader._conn.close()


def _check_when_spoken_to(conn: psycopg.Connection) -> None:
    """The pool's check of a connection it is about to hand out, without a round trip
    when it can: an idle connection the server has said nothing to is alive as far as
    anything here can tell. A server that ends a session (restart, idle timeout,
    pg_terminate_backend) sends a FATAL notice and closes the socket, which makes it
    readable: only then is the connection asked (and, dead, replaced)."""
    if conn.closed or conn.broken:
        raise psycopg.OperationalError("the connection is closed")
    readable, _, _ = select.select([conn.fileno()], [], [], 0)
    if readable:
        psycopg_pool.ConnectionPool.check_connection(conn)
        _CHECKED[conn] = 1  # a round trip the next transaction on it counts


# connections whose last check asked the server (eventstore.observers: round trips)
_CHECKED: weakref.WeakKeyDictionary[psycopg.Connection, int] = weakref.WeakKeyDictionary()


def _describe(url: str) -> str:
    """Where a URL points, without its password."""
    try:
        info = conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        return "unparsable URL"
    return ", ".join(
        f"{key}={info[key]}" for key in ("host", "port", "dbname", "user") if key in info
    )


# The events' indexes after retention (docs/DESIGN.md, "Retention"). Positions only
# increase, so a leaf page whose positions retention removed is never filled again
# while a few events kept on it (a schedule's fires, retention records) keep it from
# being freed; event ids and stream ids fall at random places, and new inserts split
# full pages before they fill the room removals freed in others. A fresh
# leaf page, filled to the default fillfactor of 90, holds FILLED_PAGE_BYTES of
# entries: the key, aligned, after an 8-byte tuple header, and a 4-byte line pointer
# (366 positions). An index is rebuilt once it holds under half what fresh pages would,
# and is at least SPARSE_MIN_PAGES big; the others are left at their fill (a random-
# keyed index rebuilt at 90% only splits its pages back to where it was).
FILLED_PAGE_BYTES = (8192 - 24 - 16) * 0.9  # a page, less its header and btree special
SPARSE_MIN_PAGES = 128


def index_entry_bytes(key_bytes: float) -> float:
    """What one entry of a btree whose keys take `key_bytes` costs a leaf page."""
    return math.ceil((8 + key_bytes) / 8) * 8 + 4


def sparse_index(pages: int, rows: float, key_bytes: float) -> bool:
    """Whether an index of `pages` pages over `rows` rows, its keys `key_bytes` wide
    on average, is sparse enough to be rebuilt."""
    fresh_per_page = FILLED_PAGE_BYTES / index_entry_bytes(key_bytes)
    return pages >= SPARSE_MIN_PAGES and rows < pages * fresh_per_page / 2


def sparse_indexes(facts: Sequence[tuple[str, int, float, bool, float | None]]) -> list[str]:
    """The valid indexes among `facts` (name, pages, table rows, valid, key width; a
    width None is unknown) sparse enough to be rebuilt, each on its own."""
    return [
        name
        for name, pages, rows, valid, width in facts
        if valid and width is not None and sparse_index(pages, rows, float(width))
    ]


# each index of events: its pages, the table's live rows, whether it is valid, and its
# key's average width (fixed-width columns by their type, the others by the table's
# statistics: NULL while the table has none)
_EVENTS_INDEXES = """
SELECT c.relname, c.relpages, t.reltuples, i.indisvalid,
       (SELECT CASE WHEN bool_and(w IS NOT NULL) THEN sum(w) END
          FROM (SELECT CASE WHEN ty.typlen > 0 THEN ty.typlen ELSE st.avg_width END AS w
                  FROM unnest(i.indkey::int2[]) AS k(attnum)
                  JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
                  JOIN pg_type ty ON ty.oid = a.atttypid
                  LEFT JOIN pg_stats st ON st.schemaname = current_schema()
                       AND st.tablename = 'events' AND st.attname = a.attname) AS widths)
  FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
  JOIN pg_class t ON t.oid = i.indrelid
 WHERE i.indrelid = to_regclass('events')
"""


def _rebuild_sparse_indexes(session: Any) -> None:
    # Run after the VACUUM, which counted the indexes' pages and the table's live rows.
    # The rows are what an index must hold: an index's own count keeps the entries of
    # rows another session's snapshot may still see (a rebuild then keeps them too, and
    # a later reclaim makes it again). The widths of text keys come from the table's
    # statistics, gathered once here where there are none (autovacuum may be off).
    # CONCURRENTLY, so appends go on; one that failed leaves its new copies invalid
    # (and kept up to date by every insert): they are dropped before another is made.
    indexes = session.query(_EVENTS_INDEXES)
    if any(valid and width is None for _name, _pages, _rows, valid, width in indexes):
        session.execute("ANALYZE events")
        indexes = session.query(_EVENTS_INDEXES)
    sparse = sparse_indexes(indexes)
    if not sparse:
        return
    for name, _pages, _rows, valid, _width in indexes:
        if not valid and "_ccnew" in name:
            session.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {quote_ident(name)}")
    for name in sparse:  # one at a time: an index at its steady fill is left alone
        session.execute(f"REINDEX INDEX CONCURRENTLY {quote_ident(name)}")
