"""The root cause of a terminal Run: the cancel intent that ended it, the first step
that did not succeed (and what was skipped because of it), or success."""

from __future__ import annotations

from domain import event_types
from domain.aggregate import RunAggregate
from domain.event_types import EventType, Family
from domain.records import Record
from domain.transitions import STEP_TERMINAL, Status
from projections.audit.run_log import RunLog
from projections.audit.why_report import RootCause


def root_cause(log: RunLog, aggregate: RunAggregate) -> tuple[RootCause, int | None]:
    """Why the terminal Run ended as it did, and when it ended (the time of its last
    run record): its cancel intent, its first step that failed (timed out, was
    cancelled), or every step succeeding."""
    run = aggregate.run
    final = log.run[-1]
    ended_at = final.metadata.get("at_ms")
    first_terminal: dict[str, Record] = {}  # step key -> the event that ended it
    for record in log.run:
        if _ends_step(record):
            first_terminal.setdefault(record.data["step_key"], record)
    if run.cancel_reason is not None:
        request = next(r for r in log.run if r.type == EventType.WORKFLOW_CANCEL_REQUESTED)
        return (
            RootCause(
                status=run.status,
                kind="cancel_intent",
                position=request.global_position,
                at_ms=run.cancel_requested_at_ms,
                reason=run.cancel_reason,
                by=request.metadata.get("actor"),
                ended_by_cancel=tuple(
                    key
                    for key, r in first_terminal.items()
                    if r.global_position > request.global_position
                    and r.data["to"] in (Status.CANCELLED, Status.TIMED_OUT)
                ),
            ),
            ended_at,
        )
    if run.status == Status.SUCCEEDED:
        return RootCause(run.status, Status.SUCCEEDED, final.global_position, ended_at), ended_at
    wanted = {
        Status.FAILED.value: (Status.FAILED,),
        Status.TIMED_OUT.value: (Status.TIMED_OUT,),
        Status.CANCELLED.value: (Status.CANCELLED,),
    }
    culprits = [
        r
        for r in sorted(first_terminal.values(), key=lambda r: r.global_position)
        if r.data["to"] in wanted.get(run.status, ())
    ]
    if not culprits:  # a failed Run whose only non-successes are skips
        culprits = [
            r
            for r in sorted(first_terminal.values(), key=lambda r: r.global_position)
            if r.data["to"] != Status.SUCCEEDED
        ]
    first = culprits[0]
    key = first.data["step_key"]
    attempt = aggregate.attempts.get(first.data.get("attempt_id") or "")
    descendants = _descendants(aggregate, key)
    skipped = tuple(
        k
        for k in aggregate.topo_order
        if k in descendants and aggregate.steps[k].status == Status.SKIPPED
    )
    return (
        RootCause(
            status=run.status,
            kind=f"step_{first.data['to']}",
            position=first.global_position,
            at_ms=first.metadata.get("at_ms"),
            step_key=key,
            result_code=first.data.get("result_code"),
            attempt_id=attempt.attempt_id if attempt else None,
            worker_id=(attempt.lease.worker_id if attempt and attempt.lease else None),
            skipped=skipped,
            other_failures=tuple(r.data["step_key"] for r in culprits[1:]),
        ),
        ended_at,
    )


def _ends_step(record: Record) -> bool:
    """A step.* status change to a terminal status."""
    return (
        event_types.family(record.type) == Family.STEP
        and record.type != EventType.STEP_CREATED
        and record.data["to"] in STEP_TERMINAL
    )


def _descendants(aggregate: RunAggregate, key: str) -> set[str]:
    """Every step that needs `key`, directly or through others."""
    found: set[str] = set()
    frontier = [key]
    while frontier:
        current = frontier.pop()
        for step in aggregate.steps.values():
            if current in step.needs and step.key not in found:
                found.add(step.key)
                frontier.append(step.key)
    return found
