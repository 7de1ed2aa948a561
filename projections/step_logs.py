"""Reading step logs by Run, step and Attempt: which Attempts a question names (from
the attempts read model), their chunks from the store's log tables
(`eventstore.logs`), a follower's next chunks, and the last lines of a log."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from domain.errors import InvalidInput, NotFound
from eventstore import logs
from eventstore.api import Reads

LAST_LINES = 10  # what `show` and `why` print of a failed step's log
_BYTES_PER_LINE = 200  # a first guess at how much to read for the last lines


@dataclass(frozen=True, slots=True)
class LogAttempt:
    """An Attempt whose log a question names, and what its log holds (None: no output)."""

    run_id: str
    step_key: str
    attempt_number: int
    attempt_id: str
    status: str
    log: logs.LogState | None


@dataclass(frozen=True, slots=True)
class LogChunk:
    """A piece of one Attempt's output: `stream` is stdout, stderr, qlflow (a note of the
    executor) or dropped (the marker where the middle of a long log was left out)."""

    run_id: str
    step_key: str
    attempt_number: int
    attempt_id: str
    seq: int
    at_ms: int
    stream: str
    data: bytes

    @property
    def text(self) -> str:
        """The bytes as text (UTF-8; anything else shown as U+FFFD)."""
        return self.data.decode("utf-8", "replace")


def attempts(
    reads: Reads, run_id: str, step_key: str | None = None, attempt: int | str | None = None
) -> list[LogAttempt]:
    """The Attempts of a Run in claim order: of one step, and one of them — its number
    in the step (1 is the first) or its id."""
    sql = (
        "SELECT run_id, step_key, attempt_number, attempt_id, status FROM attempts WHERE run_id = ?"
    )
    params: list[object] = [run_id]
    if step_key is not None:
        sql += " AND step_key = ?"
        params.append(step_key)
    if isinstance(attempt, str):
        sql += " AND attempt_id = ?"
        params.append(attempt)
    elif attempt is not None:
        if step_key is None:
            raise InvalidInput(
                "attempt", "step", "an attempt number counts within one step: name the step too"
            )
        sql += " AND attempt_number = ?"
        params.append(attempt)
    rows = reads.query(sql + " ORDER BY claimed_position", params)
    states = logs.states(reads, [row[3] for row in rows])
    found = [
        LogAttempt(run, step, number, attempt_id, status, states.get(attempt_id))
        for run, step, number, attempt_id, status in rows
    ]
    if not found and attempt is not None:
        raise NotFound(f"run {run_id!r} has no attempt {attempt!r} of step {step_key!r}")
    return found


def read(
    reads: Reads,
    named: Sequence[LogAttempt],
    after: Mapping[str, int] | None = None,
) -> list[LogChunk]:
    """The chunks of the named Attempts, Attempt by Attempt in their order, each in seq
    order; `after` maps an attempt id to the last seq already read (a follower's
    place). Attempts whose log did not move past it cost no read."""
    after = after or {}
    found: list[LogChunk] = []
    for attempt in named:
        seen = after.get(attempt.attempt_id, 0)
        if attempt.log is None or attempt.log.next_seq - 1 <= seen:
            continue
        for chunk in logs.chunks(reads, attempt.attempt_id, seen):
            found.append(_located(attempt, chunk))
    return found


def last_lines(reads: Reads, log: logs.LogState | None, count: int = LAST_LINES) -> list[str]:
    """The last `count` lines of an Attempt's log (stdout, stderr and notes together)."""
    if log is None or count < 1:
        return []
    want = count * _BYTES_PER_LINE
    while True:
        found = logs.last_chunks(reads, log.attempt_id, want)
        text = b"".join(c.data for c in found).decode("utf-8", "replace")
        lines = [line for line in text.splitlines() if line.strip()]
        if len(lines) > count or want >= log.stored_bytes:
            return lines[-count:]
        want *= 4


def _located(attempt: LogAttempt, chunk: logs.Chunk) -> LogChunk:
    return LogChunk(
        attempt.run_id,
        attempt.step_key,
        attempt.attempt_number,
        attempt.attempt_id,
        chunk.seq,
        chunk.at_ms,
        chunk.stream,
        chunk.data,
    )
