"""`verify`'s check of the log itself, before it trusts a replay of it.

A replay proves the read models equal the log; it cannot say the log is sound. So
every event is looked at in position order, and every stream head, and each problem
is named by stream, version and position:

- a stream's versions are contiguous from 1 (a deleted event leaves a gap);
- within a stream, positions increase with the version;
- a stream's head equals its last version (a head moved back or forward), every
  stream with events has a head and every head has events;
- every event has a type, and its data and metadata decode to JSON objects;
- every event decodes for its fold (`domain.event_shapes`): its stream is of a known
  category and names an entity, its type is one docs/EVENTS.md names for that
  category, its data has the fields the fold needs and names the stream's entity;
- global positions are contiguous from 1 except where retention removed events, and
  the missing positions are exactly the ranges the retention records name
  (`domain.retention.uncovered`; docs/DESIGN.md, "Retention").

`LogCheck` looks at the events batch by batch as the replay reads them (`rows`),
decoding each document to check it; `check_log` reads the log on its own, in
one snapshot the caller holds. Neither raises for what it finds: a broken row is a
problem in the list.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from domain import retention
from domain.event_shapes import SHAPES, shape_problem, stream_problem
from domain.streams import retention_stream
from eventstore.transaction import EVENT_COLUMNS

DOCUMENT = "document"  # the kind of a problem with an event's own fields
BATCH = 5000
MAX_PROBLEMS = 1000


@dataclass(frozen=True, slots=True)
class LogProblem:
    """One thing wrong with the log: where (stream, version, position; None where it has
    none) and what."""

    stream: str
    version: int | None
    position: int | None
    problem: str
    kind: str = "stream"  # or DOCUMENT

    def line(self) -> str:
        where = [f"stream {self.stream}"]
        if self.version is not None:
            where.append(f"version {self.version}")
        if self.position is not None:
            where.append(f"position {self.position}")
        return f"log: {', '.join(where)}: {self.problem}"


_REMOVED = retention.REMOVED.value  # a plain str compares faster than the StrEnum member


class LogCheck:
    """The log check over events handed in position order, batch by batch (`rows`),
    then the stream heads (`finish`). It holds each stream's last version and position."""

    def __init__(self) -> None:
        self.problems: list[LogProblem] = []
        self.broken_at: int | None = None  # the position of the first undecodable document
        self._last: dict[str, tuple[int, int]] = {}  # stream -> (version, position)
        self._position = 0  # the last position seen
        self._gaps: list[retention.Range] = []  # positions missing from the log
        self._removed: list[retention.Range] = []  # positions retention records name
        self._bad_streams: set[str] = set()  # stream ids `stream_problem` names

    def rows(self, rows: Sequence[tuple[Any, ...]]) -> Sequence[tuple[Any, ...]]:
        """Check stored rows (EVENT_COLUMNS), handed back as they are: each document
        is decoded here to check it, and dropped (a fold that reads a record decodes
        its data again: cheaper than holding the decoded documents of every held
        record, docs/DESIGN.md "Rebuild")."""
        last, problems, bad_streams = self._last, self.problems, self._bad_streams
        loads, removed = orjson.loads, _REMOVED
        for row in rows:
            position, _event_id, stream, version, type_, data, metadata = row
            previous = last.get(stream)
            if previous is None and stream_problem(stream) is not None:
                bad_streams.add(stream)  # a stream id is checked once, when first seen
            try:
                decoded = (loads(data), loads(metadata))
                sound = type(decoded[0]) is dict and type(decoded[1]) is dict and type_
            except (orjson.JSONDecodeError, TypeError):
                sound = False
            if (
                not sound
                or type(type_) is not str
                or type_ not in SHAPES
                or stream in bad_streams
                or shape_problem(stream, type_, decoded[0]) is not None
            ):
                decoded = self._documents(stream, version, position, type_, data, metadata)
            if isinstance(position, int):
                if position > self._position + 1:
                    self._gaps.append((self._position + 1, position - 1))
                if position > self._position:
                    self._position = position
            if type_ == removed and isinstance(decoded[0], dict):
                self._removed += retention.removed_ranges(decoded[0])
            expected = 1 if previous is None else previous[0] + 1
            if version != expected:
                problems.append(_gap(stream, version, position, expected))
            if previous is not None and version < previous[0]:
                problems.append(_backwards(stream, version, position, previous))
            if previous is None or version > previous[0]:
                last[stream] = (version, position)
        del problems[MAX_PROBLEMS:]
        return rows

    def finish(self, tx: Any, streams: str) -> list[LogProblem]:
        """Every problem, the stream heads in the table `streams` (a qualified name)
        compared with the events checked, read through `tx`."""
        problems = self.problems
        gaps, unnamed = retention.uncovered(self._gaps, self._removed)
        stream = retention_stream()
        for first, last_position in gaps:
            problems.append(
                LogProblem(
                    stream,
                    None,
                    first,
                    f"positions {first} to {last_position} are missing and no retention "
                    "record names them",
                )
            )
        for first, last_position in unnamed:
            problems.append(
                LogProblem(
                    stream,
                    None,
                    first,
                    f"a retention record names positions {first} to {last_position} "
                    "but the log still has events there",
                )
            )
        heads = dict(tx.query(f"SELECT stream_id, version FROM {streams}"))
        last = self._last
        for stream in sorted(last.keys() | heads.keys()):
            head = heads.get(stream)
            event = last.get(stream)
            if head is None:
                problems.append(
                    LogProblem(stream, event[0] if event else None, None, "has events but no head")
                )
            elif event is None:
                problems.append(
                    LogProblem(stream, head, None, f"head says {head} but it has no events")
                )
            elif head != event[0]:
                problems.append(
                    LogProblem(
                        stream,
                        event[0],
                        event[1],
                        f"head says {head}, the last event is version {event[0]}",
                    )
                )
        return problems[:MAX_PROBLEMS]

    def _documents(
        self, stream: str, version: int, position: int, type_: Any, data: Any, metadata: Any
    ) -> tuple[Any, Any]:
        """Note each problem of an event's own fields; its documents, decoded (None:
        does not decode)."""
        found = []
        if not isinstance(type_, str) or not type_:
            found.append(LogProblem(stream, version, position, "has no type", DOCUMENT))
        decoded = []
        for name, text in (("data", data), ("metadata", metadata)):
            try:
                value = orjson.loads(text)
            except (orjson.JSONDecodeError, TypeError) as exc:
                found.append(
                    LogProblem(
                        stream, version, position, f"{name} is not valid JSON ({exc})", DOCUMENT
                    )
                )
                value = None
            else:
                if not isinstance(value, dict):
                    found.append(
                        LogProblem(
                            stream,
                            version,
                            position,
                            f"{name} is {type(value).__name__}, not an object",
                            DOCUMENT,
                        )
                    )
            decoded.append(value)
        problem = stream_problem(stream)
        data_value = decoded[0]
        if problem is None and isinstance(type_, str) and type_ and isinstance(data_value, dict):
            if type_ not in SHAPES:
                problem = f"type {type_!r} is not one docs/EVENTS.md names"
            else:
                problem = shape_problem(stream, type_, data_value)
        if problem is not None:
            found.append(LogProblem(stream, version, position, problem, DOCUMENT))
        if found and self.broken_at is None:
            self.broken_at = position
        self.problems += found
        return decoded[0], decoded[1]


def check_log(tx: Any, events: str, streams: str) -> list[LogProblem]:
    """Every problem of the log in the tables `events` and `streams` (qualified names),
    read through `tx` inside one snapshot the caller holds."""
    check = LogCheck()
    for rows in _events(tx, events):
        check.rows(rows)
    return check.finish(tx, streams)


def _gap(stream: str, version: int, position: int, expected: int) -> LogProblem:
    gap = (
        f"versions {expected} to {version - 1} are missing"
        if version > expected
        else f"version {version} comes after version {expected - 1}"
    )
    return LogProblem(stream, version, position, f"not contiguous: {gap}")


def _backwards(stream: str, version: int, position: int, previous: tuple[int, int]) -> LogProblem:
    return LogProblem(
        stream,
        version,
        position,
        f"positions do not increase with versions (version {previous[0]} is at "
        f"position {previous[1]})",
    )


def _events(tx: Any, events: str) -> Iterator[list[Any]]:
    """The rows (EVENT_COLUMNS) of `events` in position order, a batch at a time."""
    after = None
    while True:
        where, params = ("", ()) if after is None else ("WHERE global_position > ?", (after,))
        rows = tx.query(
            f"SELECT {EVENT_COLUMNS} FROM {events} {where} ORDER BY global_position LIMIT {BATCH}",
            params,
        )
        yield rows
        if len(rows) < BATCH:
            return
        after = rows[-1][0]
