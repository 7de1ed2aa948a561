"""Input rules and byte-stable encoding shared by both store adapters.

An append is validated and encoded completely before any statement runs, so bad
input raises `InvalidInput` (naming the field and the rule) and writes nothing.
`data` and `metadata` are stored as the text of `orjson` with sorted keys: the same
mapping always encodes to the same bytes, which is what makes an exact replay
detectable by comparing stored text.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from domain.errors import IdempotencyConflict, InvalidInput
from domain.records import NewEvent, Record, StreamAppend

EVENT_ID_PATTERN = re.compile(r"[A-Za-z0-9:._-]{1,36}")
# Stream ids embed other ids (run ids, publisher names), so a few more characters are allowed.
STREAM_ID_PATTERN = re.compile(r"[A-Za-z0-9:._@/+-]{1,200}")
MAX_TYPE_LENGTH = 100
MAX_RECORD_BYTES = 256 * 1024  # encoded data + metadata of one record

_JSON_OPTIONS = orjson.OPT_SORT_KEYS


@dataclass(frozen=True, slots=True)
class EncodedEvent:
    """One validated event with its place decided and its payload encoded."""

    event_id: str
    stream_id: str
    stream_version: int
    type: str
    data: str
    metadata: str


@dataclass(frozen=True, slots=True)
class EncodedAppend:
    """One validated stream append: the CAS to perform and the events to insert."""

    stream_id: str
    expected_version: int
    events: tuple[EncodedEvent, ...]

    @property
    def new_version(self) -> int:
        return self.expected_version + len(self.events)


@dataclass(frozen=True, slots=True)
class EncodedBatch:
    """A whole append call, validated: streams in call order, events in call order."""

    appends: tuple[EncodedAppend, ...]
    events: tuple[EncodedEvent, ...]

    @property
    def event_ids(self) -> list[str]:
        return [event.event_id for event in self.events]


def encode_json(value: Any, field: str, where: str) -> bytes:
    """Encode a JSON object as sorted-key orjson bytes, or raise InvalidInput."""
    if not isinstance(value, Mapping):
        raise InvalidInput(
            field,
            "object",
            f"{where}.{field} must be a JSON object (a mapping), got {type(value).__name__}",
        )
    if not isinstance(value, dict):
        value = dict(value)
    try:
        return orjson.dumps(value, option=_JSON_OPTIONS)
    except (TypeError, orjson.JSONEncodeError) as exc:
        raise InvalidInput(
            field, "json", f"{where}.{field} is not encodable as JSON: {exc}"
        ) from exc


def encode_appends(appends: Sequence[StreamAppend]) -> EncodedBatch:
    """Validate one append call and encode it; raise InvalidInput on the first broken rule."""
    if isinstance(appends, StreamAppend | str | bytes) or not isinstance(appends, Sequence):
        raise InvalidInput(
            "appends", "sequence", "appends must be a sequence of StreamAppend (a list or tuple)"
        )
    if not appends:
        raise InvalidInput("appends", "non_empty", "an append call needs at least one StreamAppend")
    encoded: list[EncodedAppend] = []
    all_events: list[EncodedEvent] = []
    seen_streams: set[str] = set()
    seen_events: set[str] = set()
    for index, append in enumerate(appends):
        where = f"appends[{index}]"
        if not isinstance(append, StreamAppend):
            raise InvalidInput(
                "appends", "type", f"{where} must be a StreamAppend, got {type(append).__name__}"
            )
        stream_id = _check_stream_id(append.stream_id, where)
        if stream_id in seen_streams:
            raise InvalidInput(
                "stream_id",
                "unique_in_call",
                f"{where}: stream {stream_id!r} appears twice in one call; "
                "put all its events in one StreamAppend",
            )
        seen_streams.add(stream_id)
        expected = append.expected_version
        if isinstance(expected, bool) or not isinstance(expected, int) or expected < 0:
            raise InvalidInput(
                "expected_version",
                "non_negative",
                f"{where}.expected_version must be an int >= 0 (0 = the stream must not exist), "
                f"got {expected!r}",
            )
        events = append.events
        if isinstance(events, NewEvent) or not isinstance(events, Sequence) or not events:
            raise InvalidInput(
                "events", "non_empty", f"{where}.events must be a non-empty sequence of NewEvent"
            )
        stream_events = tuple(
            _encode_event(event, stream_id, expected + offset, f"{where}.events[{offset}]")
            for offset, event in enumerate(events, start=1)
        )
        for event in stream_events:
            if event.event_id in seen_events:
                raise InvalidInput(
                    "event_id",
                    "unique_in_call",
                    f"event id {event.event_id!r} appears twice in one call",
                )
            seen_events.add(event.event_id)
        encoded.append(EncodedAppend(stream_id, expected, stream_events))
        all_events.extend(stream_events)
    return EncodedBatch(tuple(encoded), tuple(all_events))


def _check_stream_id(stream_id: object, where: str) -> str:
    if not isinstance(stream_id, str) or not STREAM_ID_PATTERN.fullmatch(stream_id):
        raise InvalidInput(
            "stream_id",
            "format",
            f"{where}.stream_id must be 1..200 characters of [A-Za-z0-9:._@/+-], got {stream_id!r}",
        )
    return stream_id


def _encode_event(event: object, stream_id: str, version: int, where: str) -> EncodedEvent:
    if not isinstance(event, NewEvent):
        raise InvalidInput(
            "events", "type", f"{where} must be a NewEvent, got {type(event).__name__}"
        )
    event_id = event.event_id
    if not isinstance(event_id, str) or not EVENT_ID_PATTERN.fullmatch(event_id):
        raise InvalidInput(
            "event_id",
            "format",
            f"{where}.event_id must be 1..36 characters of [A-Za-z0-9:._-], got {event_id!r}",
        )
    event_type = event.type
    if not isinstance(event_type, str) or not 0 < len(event_type) <= MAX_TYPE_LENGTH:
        raise InvalidInput(
            "type",
            "format",
            f"{where}.type must be a string of 1..100 characters, got {event_type!r}",
        )
    data = encode_json(event.data, "data", where)
    metadata = encode_json(event.metadata, "metadata", where)
    size = len(data) + len(metadata)
    if size > MAX_RECORD_BYTES:
        raise InvalidInput(
            "record",
            "max_size",
            f"{where} ({event_id!r}): data and metadata encode to {size} bytes; "
            f"a record holds at most {MAX_RECORD_BYTES} bytes",
        )
    return EncodedEvent(event_id, stream_id, version, event_type, data.decode(), metadata.decode())


def record_from_row(row: Sequence[Any]) -> Record:
    """Build a Record from a row of (global_position, event_id, stream_id, stream_version,
    type, data, metadata) — the column order every adapter selects."""
    position, event_id, stream_id, version, event_type, data, metadata = row
    return Record(
        event_id=event_id,
        stream_id=stream_id,
        stream_version=version,
        global_position=position,
        type=event_type,
        data=orjson.loads(data),
        metadata=orjson.loads(metadata),
    )


def record_from_event(event: EncodedEvent, position: int) -> Record:
    """The Record an appended event becomes (payloads decoded from the stored text)."""
    return Record(
        event_id=event.event_id,
        stream_id=event.stream_id,
        stream_version=event.stream_version,
        global_position=position,
        type=event.type,
        data=orjson.loads(event.data),
        metadata=orjson.loads(event.metadata),
    )


def replay_or_conflict(batch: EncodedBatch, stored_rows: Sequence[Sequence[Any]]) -> list[Record]:
    """Decide a call some of whose event ids already exist (`stored_rows`, in the column
    order of `record_from_row`): the original Records if every event exists with identical
    content at the same place (an exact replay), else raise IdempotencyConflict."""
    stored = {row[1]: row for row in stored_rows}
    records: list[Record] = []
    for event in batch.events:
        row = stored.get(event.event_id)
        if row is None:
            raise IdempotencyConflict(
                event.event_id,
                "only in part: other event ids of this call are already stored but this one is not",
            )
        _, _, stream_id, version, event_type, data, metadata = row
        if (stream_id, version) != (event.stream_id, event.stream_version):
            raise IdempotencyConflict(
                event.event_id,
                f"at {stream_id!r} v{version}, not at {event.stream_id!r} v{event.stream_version}",
            )
        if event_type != event.type or data != event.data or metadata != event.metadata:
            raise IdempotencyConflict(event.event_id, "with different type, data or metadata")
        records.append(record_from_row(row))
    return records
