"""`verify`'s check of the log itself, before it trusts a replay of it.

A replay proves the read models equal the log; it cannot say the log is sound. So in
one snapshot this reads every event in position order (in batches) and every stream
head, and names each problem by stream, version and position:

- a stream's versions are contiguous from 1 (a deleted event leaves a gap);
- within a stream, positions increase with the version;
- a stream's head equals its last version (a head moved back or forward), every
  stream with events has a head and every head has events;
- every event has a type, and its data and metadata decode to JSON objects;
- every event decodes for its fold (`domain.event_shapes`): its stream is of a known
  category and names an entity, its type is one docs/EVENTS.md names for that
  category, its data has the fields the fold needs and names the stream's entity.

It never raises for what it finds: a broken row is a problem in the list.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import orjson

from domain.event_shapes import SHAPES, shape_problem, stream_problem

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


def check_log(tx: Any, events: str, streams: str) -> list[LogProblem]:
    """Every problem of the log in the tables `events` and `streams` (qualified names),
    read through `tx` inside one snapshot the caller holds."""
    problems: list[LogProblem] = []
    last: dict[str, tuple[int, int]] = {}  # stream -> (version, position) of its last event
    for position, stream, version, type_, data, metadata in _events(tx, events):
        problems += _document_problems(stream, version, position, type_, data, metadata)
        previous = last.get(stream)
        expected = 1 if previous is None else previous[0] + 1
        if version != expected:
            gap = (
                f"versions {expected} to {version - 1} are missing"
                if version > expected
                else f"version {version} comes after version {expected - 1}"
            )
            problems.append(LogProblem(stream, version, position, f"not contiguous: {gap}"))
        if previous is not None and version < previous[0]:
            problems.append(
                LogProblem(
                    stream,
                    version,
                    position,
                    f"positions do not increase with versions (version {previous[0]} is at "
                    f"position {previous[1]})",
                )
            )
        if previous is None or version > previous[0]:
            last[stream] = (version, position)
        if len(problems) >= MAX_PROBLEMS:
            return problems[:MAX_PROBLEMS]
    heads = dict(tx.query(f"SELECT stream_id, version FROM {streams}"))
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


def _events(tx: Any, events: str) -> Iterator[tuple[Any, ...]]:
    after = None
    while True:
        where, params = ("", ()) if after is None else ("WHERE global_position > ?", (after,))
        rows = tx.query(
            f"SELECT global_position, stream_id, stream_version, type, data, metadata "
            f"FROM {events} {where} ORDER BY global_position LIMIT {BATCH}",
            params,
        )
        yield from rows
        if len(rows) < BATCH:
            return
        after = rows[-1][0]


def _document_problems(
    stream: str, version: int, position: int, type_: Any, data: Any, metadata: Any
) -> list[LogProblem]:
    found = []
    if not isinstance(type_, str) or not type_:
        found.append(LogProblem(stream, version, position, "has no type", DOCUMENT))
    decoded: dict[str, Any] = {}
    for name, text in (("data", data), ("metadata", metadata)):
        try:
            value = orjson.loads(text)
        except (orjson.JSONDecodeError, TypeError) as exc:
            found.append(
                LogProblem(stream, version, position, f"{name} is not valid JSON ({exc})", DOCUMENT)
            )
            continue
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
            continue
        decoded[name] = value
    problem = stream_problem(stream)
    if problem is None and isinstance(type_, str) and type_ and "data" in decoded:
        if type_ not in SHAPES:
            problem = f"type {type_!r} is not one docs/EVENTS.md names"
        else:
            problem = shape_problem(stream, type_, decoded["data"])
    if problem is not None:
        found.append(LogProblem(stream, version, position, problem, DOCUMENT))
    return found
