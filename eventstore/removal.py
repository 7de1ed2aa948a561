"""Removing whole streams from the log: retention's one exception to append-only
(docs/DESIGN.md, "Retention").

A stream goes whole (its events and its head), inside the caller's transaction, which
must also append the record that names what went: positions are never reused
because that record is appended first and is never removed (SQLite takes the next
position as the highest plus one; PostgreSQL's counter row does not move back).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from eventstore.in_lists import chunks, marks
from eventstore.transaction import EVENT_COLUMNS

Row = tuple[Any, ...]


def stream_rows(tx: Any, stream_ids: Sequence[str]) -> list[Row]:
    """The stored rows (EVENT_COLUMNS: position, event id, stream, version, type, data
    text, metadata text) of every event of the named streams, in position order."""
    rows: list[Row] = []
    for chunk in chunks(sorted(set(stream_ids))):
        rows += tx.query(
            f"SELECT {EVENT_COLUMNS} FROM events WHERE stream_id IN ({marks(chunk)})", chunk
        )
    rows.sort(key=lambda row: row[0])
    return rows


def remove_streams(tx: Any, stream_ids: Sequence[str]) -> int:
    """Delete every event and the head of each named stream; the events removed."""
    removed = 0
    for chunk in chunks(sorted(set(stream_ids))):
        cursor = tx.execute(f"DELETE FROM events WHERE stream_id IN ({marks(chunk)})", chunk)
        removed += max(cursor.rowcount, 0)
        tx.execute(f"DELETE FROM streams WHERE stream_id IN ({marks(chunk)})", chunk)
    return removed
