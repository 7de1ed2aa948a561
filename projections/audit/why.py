"""Why a Run is not terminal at some instant: which Attempts hold execution authority
(under which lease, held by whom, until when), which steps wait and for what, and
what the next cycle does. For a terminal Run: its root cause. Read from the log."""

from __future__ import annotations

from functools import partial

from domain import event_types
from domain.aggregate import AttemptState, RunAggregate, StepRunState, effective_intent, fold
from domain.decision import check_now
from domain.frontier import aggregate_outcome
from domain.transitions import (
    ATTEMPT_CLAIMED,
    LEASE_LEASED,
    STEP_LOST,
    STEP_PENDING,
    STEP_READY,
    STEP_RUNNING,
    STEP_TERMINAL,
    STEP_WAITING_APPROVAL,
)
from eventstore.api import EventStore
from projections.audit.root_cause import root_cause
from projections.audit.run_log import RunLog, read_run_log
from projections.audit.why_report import AttemptBlock, Intent, StepWait, WhyReport


def why(store: EventStore, run_id: str, now_ms: int) -> WhyReport:
    """Explain the Run at `now_ms`: what keeps it from being terminal, or why it ended."""
    check_now(now_ms)
    log = read_run_log(store, run_id)
    aggregate = fold(log.run, log.steps, {a: list(rs) for a, rs in log.leases.items()})
    run = aggregate.run
    intent = _intent(log, aggregate, now_ms)
    report = partial(
        WhyReport,
        run_id=run.run_id,
        status=run.status,
        version=run.version,
        now_ms=now_ms,
        deadline_ms=run.deadline_ms,
        deadline_passed=run.deadline_ms is not None and now_ms >= run.deadline_ms,
        intent=intent,
    )
    if run.is_terminal:
        cause, ended_at = root_cause(log, aggregate)
        return report(root_cause=cause, terminal_at_ms=ended_at)
    blocked: list[AttemptBlock] = []
    backlog: list[AttemptBlock] = []
    for attempt in aggregate.active_attempts():
        block = _attempt_block(attempt, now_ms, intent)
        (backlog if block.status == ATTEMPT_CLAIMED and not block.lease_live else blocked).append(
            block
        )
    holding = {a.step_key for a in aggregate.active_attempts()}
    steps = tuple(
        _step_wait(aggregate, aggregate.steps[key], intent)
        for key in aggregate.topo_order
        if key not in holding and not aggregate.steps[key].is_terminal
    )
    return report(
        blocked=tuple(blocked),
        backlog=tuple(backlog),
        steps=steps,
        next_cycle=_next_cycle(aggregate, intent, bool(blocked)),
    )


def _intent(log: RunLog, aggregate: RunAggregate, now_ms: int) -> Intent | None:
    effective = effective_intent(aggregate, now_ms)
    if effective is None:
        return None
    reason, at_ms = effective
    for record in log.run:
        if record.type == event_types.WORKFLOW_CANCEL_REQUESTED:
            return Intent(reason, at_ms, record.metadata.get("actor"), recorded=True)
    return Intent(reason, at_ms, None, recorded=False)


def _ending(intent: Intent | None) -> str:
    """How cancel intent ends what it stops: timed_out for a timeout, else cancelled."""
    return "timed_out" if intent is not None and intent.reason == "timeout" else "cancelled"


def _attempt_block(attempt: AttemptState, now_ms: int, intent: Intent | None) -> AttemptBlock:
    lease = attempt.lease
    live = attempt.has_live_lease(now_ms)
    held = lease is not None and lease.status == LEASE_LEASED
    if attempt.status == ATTEMPT_CLAIMED:
        if live:
            assert lease is not None
            after = (
                f"cancellation then ends it as {_ending(intent)}"
                if intent
                else "its step is requeued for a new Attempt"
            )
            next_step = (
                f"worker {lease.worker_id} holds lease {lease.lease_id} v{lease.version} until "
                f"{lease.expires_at_ms}; if it expires before the worker starts, recovery marks "
                f"the Attempt lost and {after}"
            )
        elif held:
            assert lease is not None
            next_step = (
                f"lease {lease.lease_id} of worker {lease.worker_id} expired at "
                f"{lease.expires_at_ms}: the next cycle's recovery marks the Attempt lost and "
                + (f"cancellation ends it as {_ending(intent)}" if intent else "requeues its step")
                + ("" if intent else " (unless a worker leases it again first)")
            )
        elif intent:
            next_step = f"the next cycle's cancellation ends it as {_ending(intent)}"
        else:
            next_step = "it waits for a worker to lease it (lease_attempts)"
    else:
        after = (
            "its step is left lost and cancellation ends it as cancelled"
            if intent
            else "its step fails (lease_expired): it is never run twice"
        )
        if live:
            assert lease is not None
            next_step = (
                f"worker {lease.worker_id} holds lease {lease.lease_id} v{lease.version} until "
                f"{lease.expires_at_ms}; it ends when the worker completes"
                + (" (as " + _ending(intent) + ": the Run has cancel intent)" if intent else "")
                + f"; if the lease expires first, recovery marks the Attempt lost and {after}"
            )
        else:
            gone = (
                f"lease {lease.lease_id} of worker {lease.worker_id} expired at "
                f"{lease.expires_at_ms}"
                if lease is not None
                else "it has no lease"
            )
            next_step = f"{gone}: the next cycle's recovery marks the Attempt lost and {after}"
    return AttemptBlock(
        attempt_id=attempt.attempt_id,
        step_key=attempt.step_key,
        attempt_number=attempt.attempt_number,
        status=attempt.status,
        lease_id=lease.lease_id if lease else None,
        lease_version=lease.version if lease else None,
        lease_status=lease.status if lease else None,
        worker_id=lease.worker_id if lease else attempt.worker_id,
        expires_at_ms=lease.expires_at_ms if lease else None,
        lease_live=live,
        next=next_step,
    )


def _step_wait(aggregate: RunAggregate, step: StepRunState, intent: Intent | None) -> StepWait:
    ending = _ending(intent)
    waiting_on: tuple[str, ...] = ()
    if step.status == STEP_PENDING:
        waiting_on = tuple(n for n in step.needs if aggregate.steps[n].status != "succeeded")
        if intent:
            next_step = "the next cycle's cancellation cancels it (it never ran)"
        elif any(aggregate.steps[n].status in STEP_TERMINAL for n in waiting_on):
            next_step = "a need did not succeed: the next cycle's frontier skips it"
        elif waiting_on:
            described = ", ".join(f"{n} ({aggregate.steps[n].status})" for n in waiting_on)
            next_step = f"it waits for {described} to succeed"
        else:
            next_step = "every need succeeded: the next cycle's frontier makes it ready"
    elif step.status in (STEP_READY, STEP_WAITING_APPROVAL):
        next_step = (
            f"the next cycle's cancellation ends it as {ending}"
            if intent
            else "the next cycle's attempt admission claims an Attempt for it"
        )
    elif step.status == STEP_LOST:
        next_step = (
            "its Attempt lost its lease after starting; cancellation ends it as cancelled"
            if intent
            else "its Attempt lost its lease after starting; it fails (lease_expired)"
        )
    elif step.status == STEP_RUNNING:
        next_step = "it is running without an active Attempt: it waits for recovery"
    else:
        next_step = "it waits"
    return StepWait(step.key, step.status, waiting_on, next_step)


def _next_cycle(aggregate: RunAggregate, intent: Intent | None, blocked: bool) -> str | None:
    statuses = [s.status for s in aggregate.steps.values()]
    if intent is not None:
        if blocked:
            return (
                f"the Run ends as {_ending(intent)} once no Attempt holds authority "
                "(the worker completes or recovery ends its lease)"
            )
        return (
            "nothing holds authority: the next cycle's cancellation ends the Run as "
            f"{_ending(intent)}"
        )
    outcome = aggregate_outcome(statuses)
    if outcome is not None:
        return f"every step is terminal: the next cycle's frontier ends the Run as {outcome[0]}"
    return None
