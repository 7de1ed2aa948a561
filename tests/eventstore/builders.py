"""Small builders for event store tests."""

from __future__ import annotations

from domain.records import NewEvent, StreamAppend
from eventstore import BaseStore


def event(event_id: str, type: str = "thing.happened", **data) -> NewEvent:
    """A NewEvent with `data` and fixed metadata."""
    return NewEvent(event_id, type, data, {"actor": "test", "at_ms": 1})


def stream(stream_id: str, expected: int, *events: NewEvent) -> StreamAppend:
    """A StreamAppend of `events` at `expected`."""
    return StreamAppend(stream_id, expected, tuple(events))


def snapshot(store: BaseStore) -> tuple:
    """Everything the store holds: to assert that a failed call wrote nothing."""
    return (
        store.read_all(),
        store.query("SELECT stream_id, version FROM streams ORDER BY stream_id"),
    )
