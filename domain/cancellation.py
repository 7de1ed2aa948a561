"""Cancel intent and whole-workflow cancellation convergence (docs/DESIGN.md,
"Cancellation convergence").

`request_cancel` records the intent on the parent Run. `decide_cancellation`
is the pure state machine of cancellation convergence: given the exact Run, every StepRun, the
Attempts with their immutable admissions and leases, and the observation time,
it ends what no worker holds and blocks the rest:

- an Attempt `claimed` with no active lease, at its exact admitted ready epoch
  → `cancelled` (`timed_out` for reason timeout); a stale lease still marked
  `leased` is released (`lease_expired`);
- StepRuns `pending` and `lost` → `cancelled` (also under timeout: they never
  ran); `ready` and `waiting_approval` → `cancelled`, or `timed_out` under
  timeout;
- blocked: Attempts claimed with a live lease, `starting`, `running`, stale
  admissions; `running` StepRuns (even with no visible Attempt) and the StepRun
  of any blocked Attempt — they wait for the worker or recovery;
- the parent `workflow.cancelled | workflow.timed_out` last, only when every
  projected StepRun is terminal and nothing is blocked.

Ids derive from (run id, cancel time, target kind, target id, durable epoch),
so a cycle after an unknown commit outcome recomputes the same records.
"""

from __future__ import annotations

from domain.aggregate import AttemptState, RunAggregate, effective_intent
from domain.decision import EMPTY, Decision, DecisionBuilder, check_now
from domain.errors import InvalidInput
from domain.event_types import EventType, Family, of
from domain.ids import (
    CANCEL_ATTEMPT_EVENT,
    CANCEL_INTENT_EVENT,
    CANCEL_RUN_EVENT,
    CANCEL_STEP_EVENT,
    CANCEL_STEP_MUTATION,
    derive_id,
)
from domain.transitions import (
    ATTEMPT_CLAIMED,
    CANCEL_REASONS,
    EXECUTION_CANCELLED,
    EXECUTION_TIMED_OUT,
    LEASE_EXPIRED,
    LEASE_LEASED,
    STEP_READY,
    STEP_RUNNING,
    STEP_TERMINAL,
    STEP_WAITING_APPROVAL,
    WORKFLOW_CANCELLED,
    WORKFLOW_TIMED_OUT,
    Status,
)

__all__ = ["check_cancel_reason", "decide_cancellation", "effective_intent", "request_cancel"]

CANCELLATION_ACTOR = "cycle:cancellation"
REQUEST_ACTOR = "user"


def check_cancel_reason(reason: object) -> str:
    """`reason` if it is a cancel reason (`CANCEL_REASONS`), else InvalidInput."""
    if not isinstance(reason, str) or reason not in CANCEL_REASONS:
        raise InvalidInput(
            "reason", "one_of", f"cancel reason must be one of {CANCEL_REASONS}, not {reason!r}"
        )
    return reason


def request_cancel(aggregate: RunAggregate, reason: str, now_ms: int) -> Decision:
    """Record `workflow.cancel_requested` at `now_ms`.

    Idempotent: a terminal Run, or one that already has (effective) intent, gives
    an empty decision — the first intent, or a reached deadline, keeps its reason.
    """
    check_now(now_ms)
    check_cancel_reason(reason)
    if aggregate.run.is_terminal or effective_intent(aggregate, now_ms) is not None:
        return EMPTY
    builder = DecisionBuilder.on(aggregate, now_ms, REQUEST_ACTOR)
    builder.event(
        derive_id(CANCEL_INTENT_EVENT, aggregate.run_id, reason, now_ms),
        EventType.WORKFLOW_CANCEL_REQUESTED,
        {"reason": reason, "requested_at_ms": now_ms},
    )
    return builder.build()


def decide_cancellation(
    aggregate: RunAggregate, now_ms: int, actor: str = CANCELLATION_ACTOR, *, probe: bool = False
) -> Decision:
    """Converge a running Run that has (effective) cancel intent, as far as is safe;
    `actor` is the writer named in the records' metadata (`probe`: see
    `DecisionBuilder.on`)."""
    check_now(now_ms)
    run = aggregate.run
    intent = effective_intent(aggregate, now_ms)
    if run.is_terminal or intent is None:
        return EMPTY
    reason, cancel_at = intent
    run_id = aggregate.run_id
    timeout = reason == "timeout"
    builder = DecisionBuilder.on(aggregate, now_ms, actor, probe=probe)
    if run.cancel_reason is None:
        builder.event(
            derive_id(CANCEL_INTENT_EVENT, run_id, reason, cancel_at),
            EventType.WORKFLOW_CANCEL_REQUESTED,
            {"reason": reason, "requested_at_ms": cancel_at},
        )

    blocked_attempts: list[str] = []
    blocked_steps: set[str] = set()
    for attempt in sorted(aggregate.active_attempts(), key=lambda a: a.attempt_id):
        step = aggregate.steps[attempt.step_key]
        if _may_end(attempt, step.status, step.epoch, now_ms):
            _end_attempt(builder, attempt, run_id, cancel_at, timeout)
        else:
            blocked_attempts.append(attempt.attempt_id)
            blocked_steps.add(attempt.step_key)

    for key, step in aggregate.steps.items():
        status = step.status
        if status in STEP_TERMINAL or key in blocked_steps:
            continue
        if status == STEP_RUNNING:
            blocked_steps.add(key)
            continue
        to_status = Status.CANCELLED
        if timeout and status in (STEP_READY, STEP_WAITING_APPROVAL):
            to_status = Status.TIMED_OUT
        parts = (run_id, cancel_at, "step", step.step_run_id, step.epoch)
        builder.change_step(
            key,
            to_status,
            (CANCEL_STEP_EVENT, CANCEL_STEP_MUTATION, parts),
            result_code=WORKFLOW_TIMED_OUT if to_status == Status.TIMED_OUT else WORKFLOW_CANCELLED,
        )

    blocked = (
        *blocked_attempts,
        *sorted(aggregate.steps[key].step_run_id for key in blocked_steps),
    )
    run_terminal = None
    if not blocked and builder.all_steps_terminal():
        run_terminal = Status.TIMED_OUT if timeout else Status.CANCELLED
        builder.end_run(
            derive_id(CANCEL_RUN_EVENT, run_id, cancel_at, "run", run_id, builder.run_version),
            run_terminal,
            {
                "result_code": WORKFLOW_TIMED_OUT if timeout else WORKFLOW_CANCELLED,
                "error_code": "EXECUTION_TIMED_OUT" if timeout else "EXECUTION_CANCELLED",
            },
            aggregate.plan.notify,
            aggregate.plan.workflow_key,
        )
    if builder.is_empty:
        return Decision(blocked=blocked)
    return builder.build(blocked=blocked, run_terminal=run_terminal)


def _may_end(attempt: AttemptState, step_status: str, step_epoch: int, now_ms: int) -> bool:
    """Only a claim no worker holds, still at its exact admitted ready epoch."""
    return (
        attempt.status == ATTEMPT_CLAIMED
        and not attempt.has_live_lease(now_ms)
        and step_status == STEP_READY
        and step_epoch == attempt.step_epoch
    )


def _end_attempt(
    builder: DecisionBuilder, attempt: AttemptState, run_id: str, cancel_at: int, timeout: bool
) -> None:
    lease = attempt.lease
    to_status = Status.TIMED_OUT if timeout else Status.CANCELLED
    event_id = derive_id(
        CANCEL_ATTEMPT_EVENT, run_id, cancel_at, "attempt", attempt.attempt_id, attempt.step_epoch
    )
    builder.event(
        event_id,
        of(Family.ATTEMPT, to_status),
        {
            "attempt_id": attempt.attempt_id,
            "result_code": EXECUTION_TIMED_OUT if timeout else EXECUTION_CANCELLED,
            "reported_outcome": None,
            "output": None,
            "lease_id": lease.lease_id if lease is not None else None,
        },
    )
    builder.settled_attempts += 1
    if lease is not None and lease.status == LEASE_LEASED:
        builder.lease_event(
            attempt.attempt_id,
            EventType.LEASE_RELEASED,
            {"lease_id": lease.lease_id, "reason": LEASE_EXPIRED},
            born_with=event_id,
        )
