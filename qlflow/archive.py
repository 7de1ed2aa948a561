"""Retention archives: the Runs a batch removes, written first to a SQLite file a
person can open (docs/DESIGN.md, "Retention").

The file has `qlflow export`'s layout — `events` (one row per event, with its
category, `run_id`, `at_ms` and the data and metadata as JSON text), `runs`,
`step_runs`, `attempts`, `log_attempts`, `log_chunks` (text and bytes) — plus
`archive_info` (the format and the store it belongs to) and `archive_batches` (per
batch: the retention record's stream version, the events' digest, the archive
digest). It is written with sqlite-utils and fsync'd before the store deletes
anything; a batch written again after a crash replaces its own rows, so the archive
never holds a Run twice.

A store is named by the id of its first `publication.published` event: a Run needs
a publication, so that event is older than every Run and retention never removes it.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

from domain import streams
from domain.aggregate import RunAggregate, fold
from domain.errors import AmbiguousId, InvalidInput, NotFound
from domain.event_types import EventType
from domain.records import Record
from qlflow.export_layout import EVENT_COLUMNS, event_row

FORMAT = "qlflow retention archive 1"
_RUN_TABLES = {"runs": ("run_id",), "step_runs": ("run_id", "step_key")}


def store_identity(reads: Any) -> str:
    """The id of the store's first `publication.published` event ("" before any)."""
    rows = reads.query(
        "SELECT event_id FROM events WHERE type = ? ORDER BY global_position LIMIT 1",
        (EventType.PUBLICATION_PUBLISHED,),
    )
    return rows[0][0] if rows else ""


def check_archive(path: Path, identity: str) -> Path:
    """`path` resolved; InvalidInput when it exists and is not an archive of the store
    named `identity` (nothing is written to it)."""
    target = Path(path).expanduser().resolve()
    if not target.parent.is_dir():
        raise InvalidInput("archive", "path", f"folder {target.parent} does not exist")
    if not target.exists():
        return target
    info = _info(target)
    if info is None:
        raise InvalidInput(
            "archive", "not_an_archive", f"{target} exists and is not a qlflow retention archive"
        )
    if info.get("store") != identity:
        raise InvalidInput(
            "archive",
            "other_store",
            f"{target} is a retention archive of another store ({info.get('store')!r}, this "
            f"store is {identity!r}); give a new file",
        )
    return target


_MAGIC = b"SQLite format 3\x00"


def _rows(path: Path, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
    """One query against the archive file (through sqlite-utils: only the event store
    opens database drivers itself)."""
    import sqlite_utils

    db = sqlite_utils.Database(path)
    try:
        return list(db.execute(sql, params).fetchall())
    finally:
        db.close()


def _info(path: Path) -> dict[str, Any] | None:
    with open(path, "rb") as file:
        if file.read(len(_MAGIC)) != _MAGIC:
            return None
    try:
        rows = _rows(path, "SELECT format, store FROM archive_info")
    except Exception:  # a damaged database or one without the table: not an archive
        return None
    if len(rows) != 1 or rows[0][0] != FORMAT:
        return None
    return {"format": rows[0][0], "store": rows[0][1]}


class Archiver:
    """Writes each batch of a `retain` call to one archive file."""

    def __init__(self, path: Path, identity: str, source: str) -> None:
        self.path = path
        self.identity = identity
        self.source = source

    def __call__(
        self, tx: Any, runs: Sequence[dict[str, Any]], rows: Sequence[Sequence[Any]]
    ) -> dict[str, Any]:
        """Write a batch's Runs, their rows, events and logs; fsync; say its digest."""
        import sqlite_utils  # only here: it pulls numpy in (see qlflow/cli/export.py)

        check_archive(self.path, self.identity)  # nobody swapped the file meanwhile
        run_ids = [run["run_id"] for run in runs]
        attempts = dict(_pairs(tx, "attempt_id, run_id", "attempts", run_ids))
        db = sqlite_utils.Database(self.path)
        try:
            db.execute("PRAGMA synchronous = FULL")
            if not db["archive_info"].exists():
                db["archive_info"].insert(  # type: ignore[union-attr]
                    {"format": FORMAT, "store": self.identity, "source": self.source}
                )
                db["events"].create(EVENT_COLUMNS, pk="global_position")  # type: ignore[union-attr]
            events = [_event_row(row, attempts) for row in rows]
            db["events"].upsert_all(events, pk="global_position")  # type: ignore[union-attr]
            for table, key in _RUN_TABLES.items():
                db[table].upsert_all(_table_rows(tx, table, run_ids), pk=key)  # type: ignore[union-attr]
            db["attempts"].upsert_all(  # type: ignore[union-attr]
                _table_rows(tx, "attempts", run_ids), pk="attempt_id"
            )
            hasher = hashlib.sha256()
            for row in rows:
                hasher.update(orjson.dumps(list(row)))
            chunks = _log_rows(tx, sorted(attempts))
            for chunk in chunks:
                hasher.update(chunk["attempt_id"].encode() + b"\0" + chunk["bytes"])
            if chunks:
                db["log_chunks"].upsert_all(chunks, pk=("attempt_id", "seq"))  # type: ignore[union-attr]
            states = _table_rows(tx, "log_attempts", sorted(attempts), "attempt_id")
            if states:
                db["log_attempts"].upsert_all(states, pk="attempt_id")  # type: ignore[union-attr]
            digest = "sha256:" + hasher.hexdigest()
            db["archive_batches"].upsert(  # type: ignore[union-attr]
                {
                    "first_position": rows[0][0] if rows else None,
                    "runs": orjson.dumps(run_ids).decode(),
                    "events": len(rows),
                    "digest": digest,
                },
                pk="first_position",
            )
        finally:
            db.close()
        _fsync(self.path)
        return {"digest": digest, "path": str(self.path), "events": len(rows)}


def _fsync(path: Path) -> None:
    """The file and its folder on disk (the folder: a new file's name)."""
    for target, flags in ((path, os.O_RDONLY), (path.parent, os.O_RDONLY)):
        descriptor = os.open(target, flags)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)


def _pairs(tx: Any, columns: str, table: str, run_ids: Sequence[str]) -> list[tuple[Any, ...]]:
    found: list[tuple[Any, ...]] = []
    for start in range(0, len(run_ids), 500):
        chunk = list(run_ids[start : start + 500])
        marks = ", ".join("?" * len(chunk))
        found += tx.query(f"SELECT {columns} FROM {table} WHERE run_id IN ({marks})", chunk)
    return found


def _table_rows(
    tx: Any, table: str, keys: Sequence[str], column: str = "run_id"
) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    for start in range(0, len(keys), 500):
        chunk = list(keys[start : start + 500])
        marks = ", ".join("?" * len(chunk))
        cursor = tx.execute(f"SELECT * FROM {table} WHERE {column} IN ({marks})", chunk)
        names = [d[0] for d in cursor.description]
        found += [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
    return found


def _log_rows(tx: Any, attempt_ids: Sequence[str]) -> list[dict[str, Any]]:
    found = []
    for start in range(0, len(attempt_ids), 500):
        chunk = list(attempt_ids[start : start + 500])
        marks = ", ".join("?" * len(chunk))
        for attempt_id, seq, at_ms, stream, data in tx.query(
            "SELECT attempt_id, seq, at_ms, stream, bytes FROM log_chunks "
            f"WHERE attempt_id IN ({marks}) ORDER BY attempt_id, seq",
            chunk,
        ):
            data = bytes(data)
            found.append(
                {
                    "attempt_id": attempt_id,
                    "seq": seq,
                    "at_ms": at_ms,
                    "stream": stream,
                    "text": data.decode("utf-8", "replace"),
                    "bytes": data,
                }
            )
    return found


def _event_row(row: Sequence[Any], run_of_attempt: dict[str, str]) -> dict[str, Any]:
    position, event_id, stream, version, type_, data, metadata = row
    return event_row(
        global_position=position,
        event_id=event_id,
        stream_id=stream,
        stream_version=version,
        type=type_,
        metadata=orjson.loads(metadata),
        data_json=data,
        metadata_json=metadata,
        run_of_attempt=run_of_attempt,
    )


# --- reading -----------------------------------------------------------------------------


def archived_records(path: Path, run_id: str) -> list[Record]:
    """Every archived event of a Run (its Run, StepRun and lease streams), in position
    order; InvalidInput when `path` is not an archive, NotFound-like empty list when it
    does not hold the Run."""
    target = Path(path).expanduser().resolve()
    if not target.is_file() or _info(target) is None:
        raise InvalidInput(
            "archive", "not_an_archive", f"{target} is not a qlflow retention archive"
        )
    rows = _rows(
        target,
        "SELECT event_id, stream_id, stream_version, global_position, type, data, metadata "
        "FROM events WHERE run_id = ? ORDER BY global_position",
        (run_id,),
    )
    return [
        Record(event_id, stream, version, position, type_, orjson.loads(data), orjson.loads(meta))
        for event_id, stream, version, position, type_, data, meta in rows
    ]


def archived_run_ids(path: Path, prefix: str) -> list[str]:
    """Run ids in the archive that are or start with `prefix` (at most 11)."""
    target = Path(path).expanduser().resolve()
    rows = _rows(
        target,
        "SELECT DISTINCT run_id FROM events WHERE run_id >= ? AND run_id < ? "
        "ORDER BY run_id LIMIT 11",
        (prefix, prefix + "\U0010ffff"),
    )
    return [row[0] for row in rows]


def resolve_archived_run(path: Path, text: str) -> str:
    """The archived Run `text` names (its id or a unique prefix, `run:` optional)."""
    wanted = text.strip()
    _check_readable(path)
    found = archived_run_ids(path, wanted)
    if wanted in found:
        return wanted
    if not found and not wanted.startswith("run:"):
        found = archived_run_ids(path, "run:" + wanted)
    if not found:
        raise NotFound(f"the archive {path} holds no run that is or starts with {text!r}")
    if len(found) > 1:
        raise AmbiguousId("run", wanted, tuple(found[:10]), len(found) > 10)
    return found[0]


def archived_aggregate(path: Path, run_id: str) -> RunAggregate:
    """The archived Run folded from its archived streams (as the store folded it)."""
    records = archived_records(path, run_id)
    if not records:
        raise NotFound(f"the archive {path} does not hold run {run_id!r}")
    run = [r for r in records if streams.category(r.stream_id) == streams.RUN]
    steps = [r for r in records if streams.category(r.stream_id) == streams.STEPS]
    leases: dict[str, list[Record]] = {}
    for record in records:
        if streams.category(record.stream_id) == streams.LEASE:
            leases.setdefault(streams.entity_id(record.stream_id), []).append(record)
    by_version = lambda r: r.stream_version  # noqa: E731
    return fold(
        sorted(run, key=by_version),
        sorted(steps, key=by_version),
        {attempt: sorted(found, key=by_version) for attempt, found in leases.items()},
    )


def _check_readable(path: Path) -> None:
    target = Path(path).expanduser().resolve()
    if not target.is_file() or _info(target) is None:
        raise InvalidInput(
            "archive", "not_an_archive", f"{target} is not a qlflow retention archive"
        )
