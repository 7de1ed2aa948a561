"""Record shapes shared by the pure core and the event store (docs/DESIGN.md, "Streams").

Decisions return `StreamAppend`s; the store turns them into `Record`s.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class NewEvent:
    """An event to append: the store assigns stream_version and global_position."""

    event_id: str
    type: str
    data: Mapping[str, Any]
    metadata: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class StreamAppend:
    """Events for one stream, appended only if the stream is at `expected_version`
    (0 = the stream must not exist yet)."""

    stream_id: str
    expected_version: int
    events: tuple[NewEvent, ...]


@dataclass(frozen=True, slots=True)
class Record:
    """A committed event as read back from the store."""

    event_id: str
    stream_id: str
    stream_version: int
    global_position: int
    type: str
    data: Mapping[str, Any]
    metadata: Mapping[str, Any]
