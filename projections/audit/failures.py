"""Every step of a Run that failed, timed out or lost its Attempt — whatever ended
the Run — with its result code, exit code or signal, and the last lines of its log.
Read from the log (the Attempts' and steps' terminal events) and the step logs."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from domain import event_types
from domain import execution as execution_rules
from domain.aggregate import RunAggregate
from domain.event_types import EventType, Family
from domain.retries import counts_as_failure
from domain.transitions import STEP_TERMINAL, Status
from eventstore import logs
from eventstore.api import EventStore
from projections.audit.run_log import RunLog
from projections.audit.why_report import StepFailure
from projections.step_logs import last_lines

FAILED_ENDS = frozenset(
    {Status.FAILED, Status.TIMED_OUT, Status.LOST}
)  # what `why` names a failure


def failures(
    store: EventStore, log: RunLog, aggregate: RunAggregate, log_lines: int
) -> tuple[StepFailure, ...]:
    """The Run's failed, timed out and lost Attempts in log order, and the steps that
    failed or timed out without one (attempts exhausted, a timeout of a step that
    never ran); each with the last `log_lines` lines of its Attempt's log."""
    found: list[StepFailure] = []
    with_attempt: set[str] = set()
    retried = {  # attempt id -> the instant its step's retry may start
        record.data["attempt_id"]: record.data["retry_at_ms"]
        for record in log.run
        if record.type == event_types.of(Family.STEP, Status.READY) and "retry_at_ms" in record.data
    }
    reported: dict[str, int] = {}  # step key -> failures reported so far
    for record in log.run:
        family, end = event_types.family(record.type), event_types.name(record.type)
        data = record.data
        if family == Family.ATTEMPT and end in FAILED_ENDS:
            attempt = aggregate.attempts.get(data["attempt_id"])
            if attempt is None:
                continue
            ran: Mapping[str, Any] = execution_rules.split(data)[1] or {}
            with_attempt.add(attempt.step_key)
            if counts_as_failure(attempt):
                reported[attempt.step_key] = reported.get(attempt.step_key, 0) + 1
            retry_at = retried.get(attempt.attempt_id)
            found.append(
                StepFailure(
                    step_key=attempt.step_key,
                    status=end,
                    result_code=data.get("result_code"),
                    position=record.global_position,
                    at_ms=record.metadata.get("at_ms"),
                    attempt_id=attempt.attempt_id,
                    attempt_number=attempt.attempt_number,
                    worker_id=attempt.worker_id
                    or (attempt.lease.worker_id if attempt.lease else None),
                    exit_code=_int(ran.get("exit_code")),
                    signal=_text(ran.get("signal")),
                    retry=None if retry_at is None else reported[attempt.step_key] + 1,
                    max_attempts=aggregate.plan.step(attempt.step_key).max_attempts,
                    retry_at_ms=retry_at,
                )
            )
        elif (
            family == Family.STEP
            and record.type != EventType.STEP_CREATED
            and data.get("to") in STEP_TERMINAL & FAILED_ENDS
            and data["step_key"] not in with_attempt
        ):
            found.append(
                StepFailure(
                    step_key=data["step_key"],
                    status=data["to"],
                    result_code=data.get("result_code"),
                    position=record.global_position,
                    at_ms=record.metadata.get("at_ms"),
                )
            )
    if log_lines < 1:
        return tuple(found)
    attempt_ids = [f.attempt_id for f in found if f.attempt_id]
    states = logs.states(store, attempt_ids)
    pruned = logs.pruned_at(store, [a for a in attempt_ids if a not in states])
    return tuple(
        replace(failure, log_pruned_at_ms=pruned[failure.attempt_id])
        if failure.attempt_id in pruned
        else _with_lines(store, failure, states.get(failure.attempt_id or ""), log_lines)
        for failure in found
    )


def _with_lines(
    store: EventStore, failure: StepFailure, state: logs.LogState | None, count: int
) -> StepFailure:
    if failure.attempt_id is None or state is None:
        return failure
    return replace(failure, last_lines=tuple(last_lines(store, state, count)))


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None
