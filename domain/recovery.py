"""Recovery of Attempts whose lease ran out, for every running Run (docs/DESIGN.md,
"Recovery and the start barrier").

- A `claimed` Attempt whose lease expired before it started is `lost`
  (`lease_expired`), its lease released, and its StepRun requeued `ready → ready`
  (a new epoch, so a new Attempt can be admitted) — under cancel intent the
  StepRun is left `ready` for the cancellation phase.
- Past the start barrier there is no retry: a `starting | running` Attempt whose
  lease is no longer live is `lost`, its StepRun `running → lost → failed`
  (`lease_expired`) — under cancel intent left `lost` for the cancellation phase.
- A claimed Attempt that was never leased (or whose lease was released) is
  backlog: untouched.

Ids derive from the Attempt, its lease and the StepRun epoch — never from the
observation time — and a recovered Attempt is terminal, so a second recovery
over the result finds nothing.
"""

from __future__ import annotations

from domain.aggregate import AttemptState, RunAggregate, effective_intent
from domain.decision import EMPTY, Decision, DecisionBuilder, check_now
from domain.event_types import EventType, Family, of
from domain.ids import RECOVERY_EVENT, RECOVERY_MUTATION, derive_id
from domain.transitions import (
    ATTEMPT_CLAIMED,
    LEASE_EXPIRED,
    LEASE_LEASED,
    STEP_READY,
    STEP_RUNNING,
    Status,
)

RECOVERY_ACTOR = "cycle:recovery"


def needs_recovery(attempt: AttemptState, now_ms: int) -> bool:
    """True when `attempt` lost its lease: claimed with an expired lease, or
    started and no longer covered by the live lease it started under."""
    lease = attempt.lease
    if attempt.status == ATTEMPT_CLAIMED:
        return lease is not None and lease.status == LEASE_LEASED and now_ms >= lease.expires_at_ms
    if not attempt.is_active:
        return False
    return lease is None or lease.lease_id != attempt.started_lease_id or not lease.is_live(now_ms)


def decide_recovery(aggregate: RunAggregate, now_ms: int, *, probe: bool = False) -> Decision:
    """Mark every Attempt whose lease ran out `lost` and settle its StepRun (`probe`:
    see `DecisionBuilder.on`)."""
    check_now(now_ms)
    if aggregate.run.is_terminal:
        return EMPTY
    intent = effective_intent(aggregate, now_ms) is not None
    builder = DecisionBuilder.on(aggregate, now_ms, RECOVERY_ACTOR, probe=probe)
    for attempt in aggregate.attempts.values():
        if needs_recovery(attempt, now_ms):
            _recover(builder, aggregate, attempt, intent)
    if builder.is_empty:
        return EMPTY
    return builder.build()


def _recover(
    builder: DecisionBuilder, aggregate: RunAggregate, attempt: AttemptState, intent: bool
) -> None:
    lease = attempt.lease
    lease_id = lease.lease_id if lease is not None else None
    lease_version = lease.version if lease is not None else 0
    event_id = derive_id(RECOVERY_EVENT, attempt.attempt_id, Status.LOST, lease_id, lease_version)
    builder.event(
        event_id,
        of(Family.ATTEMPT, Status.LOST),
        {
            "attempt_id": attempt.attempt_id,
            "result_code": LEASE_EXPIRED,
            "reported_outcome": None,
            "output": None,
            "lease_id": lease_id,
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
    key = attempt.step_key
    status, epoch = builder.step(key)
    step_run_id = attempt.step_run_id
    if attempt.status == ATTEMPT_CLAIMED:
        if intent or status != STEP_READY or epoch != attempt.step_epoch:
            return  # cancellation owns the StepRun; a stale admission has nothing to requeue
        builder.change_step(
            key, STEP_READY, _ids(step_run_id, epoch, STEP_READY), attempt_id=attempt.attempt_id
        )
        return
    if status != STEP_RUNNING or epoch != attempt.step_epoch + 1:
        return  # the StepRun moved on without this Attempt: nothing of it to settle
    builder.change_step(
        key, Status.LOST, _ids(step_run_id, epoch, Status.LOST), attempt_id=attempt.attempt_id
    )
    if not intent:
        builder.change_step(
            key,
            Status.FAILED,
            _ids(step_run_id, epoch + 1, Status.FAILED),
            result_code=LEASE_EXPIRED,
            attempt_id=attempt.attempt_id,
        )


def _ids(step_run_id: str, epoch: int, to_status: str) -> tuple[str, str, tuple[str, int, str]]:
    return RECOVERY_EVENT, RECOVERY_MUTATION, (step_run_id, epoch, to_status)
