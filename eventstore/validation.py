"""Input rules and byte-stable encoding shared by both store adapters.

An append is validated and encoded completely before any statement runs, so bad
input raises `InvalidInput` (naming the field and the rule) and writes nothing. That
includes what the folds need (`domain.event_shapes`): a stream of a known category
with an entity id, and for every type docs/EVENTS.md names its stream category, its
required data fields and the id that must name the stream's entity.
`data` and `metadata` are stored as the text of `orjson` with sorted keys: the same
mapping always encodes to the same bytes, which is what makes an exact replay
detectable by comparing stored text.

This is the append hot path, so checks test exact types first and build error
messages only when a rule is broken.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import orjson

from domain.errors import IdempotencyConflict, InvalidInput
from domain.event_shapes import shape_problem, stream_problem
from domain.records import NewEvent, Record, StreamAppend

EVENT_ID_PATTERN = re.compile(r"[A-Za-z0-9:._-]{1,36}")
# Stream ids embed other ids (run ids, publisher names), so a few more characters are allowed.
STREAM_ID_PATTERN = re.compile(r"[A-Za-z0-9:._@/+-]{1,200}")
MAX_TYPE_LENGTH = 100
MAX_RECORD_BYTES = 256 * 1024  # encoded data + metadata of one record

_JSON_OPTIONS = orjson.OPT_SORT_KEYS
_event_id_ok = EVENT_ID_PATTERN.fullmatch
_stream_id_ok = STREAM_ID_PATTERN.fullmatch


class EncodedEvent(NamedTuple):
    """One validated event with its place decided and its payload encoded
    (field order = the events table's columns after global_position)."""

    event_id: str
    stream_id: str
    stream_version: int
    type: str
    data: str
    metadata: str


class EncodedAppend(NamedTuple):
    """One validated stream append: the CAS to perform and the events to insert."""

    stream_id: str
    expected_version: int
    events: tuple[EncodedEvent, ...]

    @property
    def new_version(self) -> int:
        return self.expected_version + len(self.events)


class EncodedBatch(NamedTuple):
    """A whole append call, validated: streams in call order, events in call order."""

    appends: tuple[EncodedAppend, ...]
    events: tuple[EncodedEvent, ...]

    @property
    def event_ids(self) -> list[str]:
        return [event.event_id for event in self.events]


def encode_json(value: Any, field: str, where: str) -> bytes:
    """Encode a JSON object as sorted-key orjson bytes, or raise InvalidInput."""
    if type(value) is not dict:
        if not isinstance(value, Mapping):
            raise InvalidInput(
                field,
                "object",
                f"{where}.{field} must be a JSON object (a mapping), got {type(value).__name__}",
            )
        value = dict(value)
    try:
        return orjson.dumps(value, option=_JSON_OPTIONS)
    except (TypeError, orjson.JSONEncodeError) as exc:
        raise InvalidInput(
            field, "json", f"{where}.{field} is not encodable as JSON: {exc}"
        ) from exc


def encode_appends(appends: Sequence[StreamAppend]) -> EncodedBatch:
    """Validate one append call and encode it; raise InvalidInput on the first broken rule."""
    if type(appends) not in (list, tuple) and (
        isinstance(appends, StreamAppend | str | bytes) or not isinstance(appends, Sequence)
    ):
        raise InvalidInput(
            "appends", "sequence", "appends must be a sequence of StreamAppend (a list or tuple)"
        )
    if not appends:
        raise InvalidInput("appends", "non_empty", "an append call needs at least one StreamAppend")
    encoded: list[EncodedAppend] = []
    all_events: list[EncodedEvent] = []
    seen_events: set[str] = set()
    seen_streams: set[str] = set()
    for index, append in enumerate(appends):
        if type(append) is not StreamAppend and not isinstance(append, StreamAppend):
            raise InvalidInput(
                "appends",
                "type",
                f"appends[{index}] must be a StreamAppend, got {type(append).__name__}",
            )
        stream_id, expected, events = append.stream_id, append.expected_version, append.events
        _check_stream(index, stream_id, expected, events, seen_streams)
        seen_streams.add(stream_id)
        stream_events = []
        for offset, event in enumerate(events):
            version = expected + offset + 1
            encoded_event = _encode_event(event, stream_id, version) or _encode_event_slowly(
                event, stream_id, version, f"appends[{index}].events[{offset}]"
            )
            problem = shape_problem(stream_id, event.type, event.data)
            if problem is not None:
                raise InvalidInput(
                    "data",
                    "shape",
                    f"appends[{index}].events[{offset}] ({encoded_event.event_id!r}): {problem}",
                )
            if encoded_event.event_id in seen_events:
                raise InvalidInput(
                    "event_id",
                    "unique_in_call",
                    f"event id {encoded_event.event_id!r} appears twice in one call",
                )
            seen_events.add(encoded_event.event_id)
            stream_events.append(encoded_event)
        encoded.append(EncodedAppend(stream_id, expected, tuple(stream_events)))
        all_events.extend(stream_events)
    return EncodedBatch(tuple(encoded), tuple(all_events))


def _check_stream(
    index: int, stream_id: object, expected: object, events: object, seen_streams: set[str]
) -> None:
    where = f"appends[{index}]"
    if type(stream_id) is not str or not _stream_id_ok(stream_id):
        raise InvalidInput(
            "stream_id",
            "format",
            f"{where}.stream_id must be 1..200 characters of [A-Za-z0-9:._@/+-], got {stream_id!r}",
        )
    problem = stream_problem(stream_id)
    if problem is not None:
        raise InvalidInput("stream_id", "category", f"{where}: {problem}")
    if stream_id in seen_streams:
        raise InvalidInput(
            "stream_id",
            "unique_in_call",
            f"{where}: stream {stream_id!r} appears twice in one call; "
            "put all its events in one StreamAppend",
        )
    if type(expected) is not int or expected < 0:
        raise InvalidInput(
            "expected_version",
            "non_negative",
            f"{where}.expected_version must be an int >= 0 (0 = the stream must not exist), "
            f"got {expected!r}",
        )
    if type(events) not in (tuple, list) and (
        isinstance(events, NewEvent | str | bytes) or not isinstance(events, Sequence)
    ):
        events = None
    if not events:
        raise InvalidInput(
            "events", "non_empty", f"{where}.events must be a non-empty sequence of NewEvent"
        )


def _encode_event(event: object, stream_id: str, version: int) -> EncodedEvent | None:
    """The encoded event for the common case (exact types), else None."""
    if type(event) is not NewEvent:
        return None
    event_id, event_type = event.event_id, event.type
    if type(event_id) is not str or not _event_id_ok(event_id):
        return None
    if not isinstance(event_type, str) or not 0 < len(event_type) <= MAX_TYPE_LENGTH:
        return None
    if type(event_type) is not str:
        # the domain names types with StrEnum members: stored and folded as the plain
        # str a replay reads back (a member compares several times slower)
        event_type = str.__str__(event_type)
    data, metadata = event.data, event.metadata
    if type(data) is not dict or type(metadata) is not dict:
        return None
    try:
        data_bytes = orjson.dumps(data, option=_JSON_OPTIONS)
        metadata_bytes = orjson.dumps(metadata, option=_JSON_OPTIONS)
    except TypeError:
        return None
    if len(data_bytes) + len(metadata_bytes) > MAX_RECORD_BYTES:
        return None
    return EncodedEvent(
        event_id, stream_id, version, event_type, data_bytes.decode(), metadata_bytes.decode()
    )


def _encode_event_slowly(event: object, stream_id: str, version: int, where: str) -> EncodedEvent:
    """Check an event the fast path declined, rule by rule: raise the rule it breaks, or
    encode it (a NewEvent subclass, mappings that are not dicts)."""
    if not isinstance(event, NewEvent):
        raise InvalidInput(
            "events", "type", f"{where} must be a NewEvent, got {type(event).__name__}"
        )
    event_id = event.event_id
    if not isinstance(event_id, str) or not _event_id_ok(event_id):
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
    return EncodedEvent(
        event_id, stream_id, version, str.__str__(event_type), data.decode(), metadata.decode()
    )


def record_from_row(row: Sequence[Any]) -> Record:
    """Build a Record from a row of (global_position, event_id, stream_id, stream_version,
    type, data, metadata) — the column order every adapter selects."""
    position, event_id, stream_id, version, event_type, data, metadata = row
    return Record(
        event_id,
        stream_id,
        version,
        position,
        event_type,
        orjson.loads(data),
        orjson.loads(metadata),
    )


def record_from_event(event: EncodedEvent, position: int) -> Record:
    """The Record an appended event becomes (payloads decoded from the stored text)."""
    event_id, stream_id, version, event_type, data, metadata = event
    return Record(
        event_id,
        stream_id,
        version,
        position,
        event_type,
        orjson.loads(data),
        orjson.loads(metadata),
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
                "only in part: other event ids of this call are stored, this one is not",
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
