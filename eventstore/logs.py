"""Step logs: each Attempt's output as numbered chunks beside the event log, not in it.

A writer (the local executor, while the process runs) appends pieces of output —
`(stream, at_ms, bytes)` — to an Attempt's log with `append`. Each Attempt's log is
capped: the first half of the cap (the head) is kept as it came, then a marker row,
then the most recent output up to the other half (the tail); whatever falls out of
the tail's front is dropped and the marker says how much. So a log never holds more
than `cap_bytes` of output, and it always holds how the step began and how it ended.

Two tables, both primary data (no read model: `rebuild` never touches them):

- `log_chunks (attempt_id, seq, at_ms, stream, bytes)`: the output in `seq` order
  (numbers only grow; dropping leaves gaps). `stream` is `stdout`, `stderr`,
  `qlflow` (notes of the executor itself) or `dropped` (the marker);
- `log_attempts`: one row per Attempt with a log — the next seq, the head, tail and
  dropped byte counts, where the marker sits, and when it was first and last
  written. It makes an append cost one key lookup, whatever the log's length, and
  lets a follower see which logs moved.

`prune` deletes whole logs whose last write is older than a time; events are
never touched. The SQL is the same on both stores; only the DDL differs.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from domain.errors import InvalidInput
from eventstore.api import MigrationStep, Reads, Row
from eventstore.grants import AUDIT, READ, RUNTIME

COMPONENT = "eventstore.logs"

STDOUT = "stdout"
STDERR = "stderr"
NOTE = "qlflow"  # a line of the executor's own (could not start, stopped by a signal)
DROPPED = "dropped"  # the marker between head and tail
WRITTEN_STREAMS = (STDOUT, STDERR, NOTE)  # what a writer may append
MAX_PIECE_BYTES = 16 * 1024  # a chunk row holds at most this much
MAX_APPEND_BYTES = 8 * 1024 * 1024  # one append call carries at most this much
_BATCH = 256  # tail rows looked at per query while dropping
LOCK_PREFIX = "qlflow-log:"

Piece = tuple[str, int, bytes]
"""(stream, at_ms, bytes): output of one stream read at one instant."""

_SQLITE: list[str] = [
    "CREATE TABLE log_chunks ("
    " attempt_id TEXT NOT NULL,"
    " seq INTEGER NOT NULL,"
    " at_ms INTEGER NOT NULL,"
    " stream TEXT NOT NULL,"
    " bytes BLOB NOT NULL,"
    " PRIMARY KEY (attempt_id, seq)) WITHOUT ROWID",
    "CREATE TABLE log_attempts ("
    " attempt_id TEXT PRIMARY KEY,"
    " next_seq INTEGER NOT NULL,"
    " head_bytes INTEGER NOT NULL,"
    " tail_bytes INTEGER NOT NULL,"
    " dropped_bytes INTEGER NOT NULL,"
    " marker_seq INTEGER,"
    " first_at_ms INTEGER NOT NULL,"
    " last_at_ms INTEGER NOT NULL) WITHOUT ROWID",
    "CREATE INDEX log_attempts_last_write ON log_attempts (last_at_ms)",
]
_POSTGRESQL: list[str] = [
    "CREATE TABLE log_chunks ("
    ' attempt_id TEXT COLLATE "C" NOT NULL,'
    " seq BIGINT NOT NULL,"
    " at_ms BIGINT NOT NULL,"
    " stream TEXT NOT NULL,"
    " bytes BYTEA NOT NULL,"
    " PRIMARY KEY (attempt_id, seq))",
    "CREATE TABLE log_attempts ("
    ' attempt_id TEXT COLLATE "C" PRIMARY KEY,'
    " next_seq BIGINT NOT NULL,"
    " head_bytes BIGINT NOT NULL,"
    " tail_bytes BIGINT NOT NULL,"
    " dropped_bytes BIGINT NOT NULL,"
    " marker_seq BIGINT,"
    " first_at_ms BIGINT NOT NULL,"
    " last_at_ms BIGINT NOT NULL)",
    "CREATE INDEX log_attempts_last_write ON log_attempts (last_at_ms)",
]
# Step 2: when a log was pruned, so a reader says "pruned on ..." rather than "no
# output" (docs/DESIGN.md, "Step logs"); the row goes when retention removes the Run
_PRUNES = (
    "CREATE TABLE log_prunes (attempt_id TEXT PRIMARY KEY, pruned_at_ms {integer} NOT NULL,"
    " last_at_ms {integer} NOT NULL)"
)
MIGRATIONS: tuple[MigrationStep, ...] = (
    {"sqlite": _SQLITE, "postgresql": _POSTGRESQL},
    {
        "sqlite": [_PRUNES.format(integer="INTEGER")],
        "postgresql": [_PRUNES.format(integer="BIGINT").replace("TEXT", 'TEXT COLLATE "C"', 1)],
    },
)

TABLES = ("log_chunks", "log_attempts", "log_prunes")
# the runtime writes logs (and trims their tails); the audit role reads them
WRITE_LOGS = ("SELECT", "INSERT", "UPDATE", "DELETE")
GRANTS = {table: {RUNTIME: WRITE_LOGS, AUDIT: READ} for table in TABLES}


class Writes(Reads, Protocol):
    """What `append` and `prune` need: reads and statements in one transaction."""

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Any: ...

    def executemany(self, sql: str, seq_of_params: Iterable[Sequence[Any]]) -> None: ...

    def lock(self, key: str) -> None: ...


@dataclass(frozen=True, slots=True)
class Chunk:
    """One stored piece of an Attempt's output."""

    attempt_id: str
    seq: int
    at_ms: int
    stream: str
    data: bytes


@dataclass(frozen=True, slots=True)
class LogState:
    """What an Attempt's log holds: bytes kept at the head and the tail, bytes dropped
    between them (after the marker at `marker_seq`), the next seq, first and last write."""

    attempt_id: str
    next_seq: int
    head_bytes: int
    tail_bytes: int
    dropped_bytes: int
    marker_seq: int | None
    first_at_ms: int
    last_at_ms: int

    @property
    def stored_bytes(self) -> int:
        """Output bytes stored (the marker's own text not counted)."""
        return self.head_bytes + self.tail_bytes

    @property
    def written_bytes(self) -> int:
        """Output bytes ever appended, dropped ones included."""
        return self.stored_bytes + self.dropped_bytes


@dataclass(frozen=True, slots=True)
class Pruned:
    """What `prune` deleted."""

    attempts: int
    chunks: int
    bytes: int


_STATE_COLUMNS = (
    "attempt_id, next_seq, head_bytes, tail_bytes, dropped_bytes, marker_seq, "
    "first_at_ms, last_at_ms"
)
_CHUNK_COLUMNS = "attempt_id, seq, at_ms, stream, bytes"


def marker_text(dropped: int, head_budget: int, tail_budget: int) -> bytes:
    """What the marker row says once output was dropped (empty while none was)."""
    if dropped <= 0:
        return b""
    return (
        f"\n[qlflow: {dropped} bytes of output dropped here; this log keeps the first "
        f"{head_budget} and the last {tail_budget} bytes]\n"
    ).encode()


# --- writing ---------------------------------------------------------------------------


def append(
    tx: Writes, attempt_id: str, pieces: Sequence[Piece], cap_bytes: int, *, left_out: int = 0
) -> LogState:
    """Append `pieces` to the Attempt's log in `tx`, keeping it within `cap_bytes`
    (half for the head, half for the tail); returns the log's state after it.
    `left_out` counts output the writer read but never sent (it could not keep up):
    the marker counts it with what the cap drops, so it says all that is missing."""
    _check_append(attempt_id, pieces, cap_bytes)
    if isinstance(left_out, bool) or not isinstance(left_out, int) or left_out < 0:
        raise InvalidInput(
            "left_out", "non_negative", f"left_out must be an int >= 0: {left_out!r}"
        )
    tx.lock(LOCK_PREFIX + attempt_id)  # one writer of a log at a time (its seqs, its counts)
    head_budget = cap_bytes // 2
    tail_budget = cap_bytes - head_budget
    before = state(tx, attempt_id)
    first_at = min(at for _stream, at, _data in pieces) if pieces else 0
    if before is None:
        before = LogState(attempt_id, 1, 0, 0, 0, None, first_at, first_at)
    if not pieces and not left_out:
        return before
    seq, head, tail, marker = before.next_seq, before.head_bytes, before.tail_bytes, None
    marker_seq = before.marker_seq
    head_rows: list[list[Any]] = []
    tail_rows: list[list[Any]] = []  # [seq, at_ms, stream, bytes], trimmed below if need be
    for stream, at_ms, data in pieces:
        for start in range(0, len(data), MAX_PIECE_BYTES):
            piece = data[start : start + MAX_PIECE_BYTES]
            if marker_seq is None:
                room = head_budget - head
                if len(piece) <= room:
                    head_rows.append([seq, at_ms, stream, piece])
                    head, seq = head + len(piece), seq + 1
                    continue
                if room > 0:
                    head_rows.append([seq, at_ms, stream, piece[:room]])
                    head, seq, piece = head_budget, seq + 1, piece[room:]
                marker_seq, marker, seq = seq, at_ms, seq + 1  # the head is full
            tail_rows.append([seq, at_ms, stream, piece])
            tail, seq = tail + len(piece), seq + 1
    dropped = before.dropped_bytes + left_out
    if left_out and marker_seq is None:  # what was left out came after all that is here
        marker_seq, marker, seq = seq, max(first_at, before.last_at_ms), seq + 1
    excess = tail - tail_budget
    if excess > 0:
        assert marker_seq is not None  # a tail exists only past a full head
        if marker is None:  # the marker is stored already: drop the stored tail first
            excess -= _drop_stored(tx, attempt_id, marker_seq, excess)
        while excess > 0 and tail_rows:
            data = tail_rows[0][3]
            if len(data) <= excess:
                tail_rows.pop(0)
                excess -= len(data)
            else:
                tail_rows[0][3] = data[excess:]
                excess = 0
        dropped += tail - tail_budget
        tail = tail_budget
    last_at = max([before.last_at_ms, *(at for _stream, at, _data in pieces)])
    text = marker_text(dropped, head_budget, tail_budget)
    rows = [(attempt_id, *row) for row in head_rows]
    if marker is not None:
        rows.append((attempt_id, marker_seq, marker, DROPPED, text))
    elif dropped != before.dropped_bytes:
        tx.execute(
            "UPDATE log_chunks SET bytes = ? WHERE attempt_id = ? AND seq = ?",
            (text, attempt_id, marker_seq),
        )
    rows += [(attempt_id, *row) for row in tail_rows]
    if rows:
        tx.executemany(f"INSERT INTO log_chunks ({_CHUNK_COLUMNS}) VALUES (?, ?, ?, ?, ?)", rows)
    after = LogState(attempt_id, seq, head, tail, dropped, marker_seq, before.first_at_ms, last_at)
    tx.execute(
        f"INSERT INTO log_attempts ({_STATE_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?) "
        "ON CONFLICT (attempt_id) DO UPDATE SET next_seq = excluded.next_seq, "
        "head_bytes = excluded.head_bytes, tail_bytes = excluded.tail_bytes, "
        "dropped_bytes = excluded.dropped_bytes, marker_seq = excluded.marker_seq, "
        "last_at_ms = excluded.last_at_ms",
        (
            attempt_id,
            after.next_seq,
            after.head_bytes,
            after.tail_bytes,
            after.dropped_bytes,
            after.marker_seq,
            after.first_at_ms,
            after.last_at_ms,
        ),
    )
    return after


def _drop_stored(tx: Writes, attempt_id: str, marker_seq: int, excess: int) -> int:
    """Drop up to `excess` bytes from the front of the stored tail; returns how many."""
    dropped = 0
    after = marker_seq
    while dropped < excess:
        rows = tx.query(
            "SELECT seq, length(bytes) FROM log_chunks WHERE attempt_id = ? AND seq > ? "
            "ORDER BY seq LIMIT ?",
            (attempt_id, after, _BATCH),
        )
        whole_until = None
        for seq, size in rows:
            if dropped + size <= excess:
                dropped += size
                whole_until = seq
                continue
            (data,) = tx.query(
                "SELECT bytes FROM log_chunks WHERE attempt_id = ? AND seq = ?", (attempt_id, seq)
            )[0]
            cut = excess - dropped
            tx.execute(
                "UPDATE log_chunks SET bytes = ? WHERE attempt_id = ? AND seq = ?",
                (bytes(data)[cut:], attempt_id, seq),
            )
            dropped = excess
            break
        if whole_until is not None:
            tx.execute(
                "DELETE FROM log_chunks WHERE attempt_id = ? AND seq > ? AND seq <= ?",
                (attempt_id, marker_seq, whole_until),
            )
            after = whole_until
        if len(rows) < _BATCH:
            break
    return dropped


def _check_append(attempt_id: object, pieces: object, cap_bytes: object) -> None:
    if not isinstance(attempt_id, str) or not attempt_id:
        raise InvalidInput(
            "attempt_id", "text", f"attempt_id must be a non-empty string, got {attempt_id!r}"
        )
    if isinstance(cap_bytes, bool) or not isinstance(cap_bytes, int) or cap_bytes < 2:
        raise InvalidInput("cap_bytes", "positive", f"cap_bytes must be an int >= 2: {cap_bytes!r}")
    if not isinstance(pieces, Sequence) or isinstance(pieces, (str, bytes)):
        raise InvalidInput(
            "pieces", "sequence", "pieces must be a sequence of (stream, at_ms, bytes)"
        )
    total = 0
    for piece in pieces:
        if not isinstance(piece, tuple) or len(piece) != 3:
            raise InvalidInput(
                "pieces", "shape", f"a piece is (stream, at_ms, bytes), got {piece!r}"
            )
        stream, at_ms, data = piece
        if stream not in WRITTEN_STREAMS:
            raise InvalidInput(
                "stream", "known", f"stream must be one of {', '.join(WRITTEN_STREAMS)}: {stream!r}"
            )
        if isinstance(at_ms, bool) or not isinstance(at_ms, int) or not 0 <= at_ms < 2**53:
            raise InvalidInput("at_ms", "instant", f"at_ms must be epoch milliseconds: {at_ms!r}")
        if not isinstance(data, bytes):
            raise InvalidInput("bytes", "bytes", f"a piece's output must be bytes: {type(data)}")
        total += len(data)
    if total > MAX_APPEND_BYTES:
        raise InvalidInput(
            "pieces", "size", f"one append carries at most {MAX_APPEND_BYTES} bytes, got {total}"
        )


def prune(tx: Writes, before_ms: int, at_ms: int | None = None) -> Pruned:
    """Delete every log whose last write is before `before_ms` (its chunks and its
    state row), noting when (`at_ms`, else `before_ms`) in `log_prunes`; events are
    never touched."""
    if isinstance(before_ms, bool) or not isinstance(before_ms, int) or before_ms < 0:
        raise InvalidInput("before_ms", "instant", f"before_ms must be epoch ms: {before_ms!r}")
    old = "SELECT attempt_id FROM log_attempts WHERE last_at_ms < ?"
    ((chunks, size),) = tx.query(
        f"SELECT COUNT(*), COALESCE(SUM(length(bytes)), 0) FROM log_chunks "
        f"WHERE attempt_id IN ({old})",
        (before_ms,),
    )
    tx.execute(
        "INSERT INTO log_prunes (attempt_id, pruned_at_ms, last_at_ms) "
        "SELECT attempt_id, ?, last_at_ms FROM log_attempts WHERE last_at_ms < ? "
        "ON CONFLICT (attempt_id) DO UPDATE SET pruned_at_ms = excluded.pruned_at_ms, "
        "last_at_ms = excluded.last_at_ms",
        (before_ms if at_ms is None else at_ms, before_ms),
    )
    tx.execute(f"DELETE FROM log_chunks WHERE attempt_id IN ({old})", (before_ms,))
    attempts = tx.execute("DELETE FROM log_attempts WHERE last_at_ms < ?", (before_ms,)).rowcount
    return Pruned(int(attempts), int(chunks), int(size))


def remove(tx: Writes, attempt_ids: Sequence[str]) -> Pruned:
    """Delete the logs of the named Attempts (retention removing their Runs)."""
    attempts = chunks_removed = size = 0
    ordered = sorted(set(attempt_ids))
    for start in range(0, len(ordered), 500):
        chunk = ordered[start : start + 500]
        marks = ", ".join("?" * len(chunk))
        ((found, found_size),) = tx.query(
            f"SELECT COUNT(*), COALESCE(SUM(length(bytes)), 0) FROM log_chunks "
            f"WHERE attempt_id IN ({marks})",
            chunk,
        )
        tx.execute(f"DELETE FROM log_chunks WHERE attempt_id IN ({marks})", chunk)
        tx.execute(f"DELETE FROM log_prunes WHERE attempt_id IN ({marks})", chunk)
        cursor = tx.execute(f"DELETE FROM log_attempts WHERE attempt_id IN ({marks})", chunk)
        attempts += max(cursor.rowcount, 0)
        chunks_removed += int(found)
        size += int(found_size)
    return Pruned(attempts, chunks_removed, size)


def pruned_at(reads: Reads, attempt_ids: Sequence[str]) -> dict[str, int]:
    """Attempt id -> when its log was pruned, for those of `attempt_ids` pruned."""
    found: dict[str, int] = {}
    ordered = sorted(set(attempt_ids))
    for start in range(0, len(ordered), 500):
        chunk = ordered[start : start + 500]
        marks = ", ".join("?" * len(chunk))
        found.update(
            reads.query(
                f"SELECT attempt_id, pruned_at_ms FROM log_prunes WHERE attempt_id IN ({marks})",
                chunk,
            )
        )
    return found


# --- reading ---------------------------------------------------------------------------


def state(reads: Reads, attempt_id: str) -> LogState | None:
    """The Attempt's log state, or None when it has no log."""
    return states(reads, [attempt_id]).get(attempt_id)


def states(reads: Reads, attempt_ids: Sequence[str]) -> dict[str, LogState]:
    """The log state of each named Attempt that has a log."""
    found: dict[str, LogState] = {}
    ids = sorted(set(attempt_ids))
    for start in range(0, len(ids), 500):
        part = ids[start : start + 500]
        rows = reads.query(
            f"SELECT {_STATE_COLUMNS} FROM log_attempts "
            f"WHERE attempt_id IN ({', '.join('?' * len(part))})",
            part,
        )
        found.update((row[0], LogState(*row)) for row in rows)
    return found


def chunks(
    reads: Reads, attempt_id: str, after_seq: int = 0, limit: int | None = None
) -> list[Chunk]:
    """The Attempt's chunks with seq > `after_seq`, in order (at most `limit`)."""
    sql = f"SELECT {_CHUNK_COLUMNS} FROM log_chunks WHERE attempt_id = ? AND seq > ? ORDER BY seq"
    params: list[Any] = [attempt_id, after_seq]
    if limit is not None:
        sql += " LIMIT ?"
        params.append(limit)
    return [_chunk(row) for row in reads.query(sql, params)]


def last_chunks(reads: Reads, attempt_id: str, at_least_bytes: int) -> list[Chunk]:
    """The newest chunks of the Attempt holding at least `at_least_bytes` of output (or
    all of it), in seq order: enough to show the last lines of a log."""
    found: list[Chunk] = []
    size = 0
    before: int | None = None
    while size < at_least_bytes:
        condition = "" if before is None else " AND seq < ?"
        params: list[Any] = [attempt_id] if before is None else [attempt_id, before]
        rows = reads.query(
            f"SELECT {_CHUNK_COLUMNS} FROM log_chunks WHERE attempt_id = ?{condition} "
            f"ORDER BY seq DESC LIMIT {_BATCH}",
            params,
        )
        for row in rows:
            chunk = _chunk(row)
            found.append(chunk)
            size += len(chunk.data) if chunk.stream != DROPPED else 0
            if size >= at_least_bytes:
                break
        if len(rows) < _BATCH:
            break
        before = found[-1].seq
    found.reverse()
    return found


def iter_chunks(reads: Reads, batch: int = 1000) -> Iterator[Chunk]:
    """Every stored chunk, by (attempt_id, seq), `batch` rows per query."""
    key: tuple[str, int] | None = None
    while True:
        if key is None:
            rows = reads.query(
                f"SELECT {_CHUNK_COLUMNS} FROM log_chunks ORDER BY attempt_id, seq LIMIT ?",
                (batch,),
            )
        else:
            rows = reads.query(
                f"SELECT {_CHUNK_COLUMNS} FROM log_chunks "
                "WHERE attempt_id > ? OR (attempt_id = ? AND seq > ?) "
                "ORDER BY attempt_id, seq LIMIT ?",
                (key[0], key[0], key[1], batch),
            )
        for row in rows:
            yield _chunk(row)
        if len(rows) < batch:
            return
        key = (rows[-1][0], rows[-1][1])


def all_states(reads: Reads) -> list[LogState]:
    """Every log's state, by attempt id."""
    rows = reads.query(f"SELECT {_STATE_COLUMNS} FROM log_attempts ORDER BY attempt_id")
    return [LogState(*row) for row in rows]


def _chunk(row: Row) -> Chunk:
    attempt_id, seq, at_ms, stream, data = row
    return Chunk(attempt_id, int(seq), int(at_ms), stream, bytes(data))
