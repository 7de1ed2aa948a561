"""Why a Run is not terminal at some instant: which Attempts hold execution authority
(under which lease, held by whom, until when), which steps wait and for what, and
what the next cycle does. For a terminal Run: its root cause. Read from the log."""

from __future__ import annotations

from dataclasses import replace
from functools import partial

from domain.aggregate import AttemptState, RunAggregate, StepRunState, effective_intent, fold
from domain.decision import check_now
from domain.event_types import EventType
from domain.frontier import aggregate_outcome
from domain.retries import retry_number
from domain.step_timeouts import past_step_timeout, step_deadline_ms
from domain.transitions import (
    ATTEMPT_CLAIMED,
    ATTEMPT_INTERRUPTED,
    ATTEMPT_TERMINAL,
    STEP_LOST,
    STEP_PENDING,
    STEP_READY,
    STEP_RUNNING,
    STEP_TERMINAL,
    STEP_WAITING_APPROVAL,
    Status,
)
from eventstore.api import EventStore
from projections.audit.failures import failures
from projections.audit.root_cause import root_cause
from projections.audit.run_log import RunLog, read_run_log
from projections.audit.why_report import (
    INTERRUPTED_WORDS,
    AttemptBlock,
    Intent,
    StepWait,
    WhyReport,
    attempt_next,
    ending,
)
from projections.step_logs import LAST_LINES


def why(store: EventStore, run_id: str, now_ms: int, log_lines: int = LAST_LINES) -> WhyReport:
    """Explain the Run at `now_ms`: what keeps it from being terminal, or why it ended;
    and every step that failed, timed out or was lost, with the last `log_lines` lines
    of its log."""
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
        failures=failures(store, log, aggregate, log_lines),
        rerun_of=(log.run[0].data.get("rerun_of") or {}).get("run_id") if log.run else None,
        reused=tuple(
            (key, step.reused_from["run_id"])
            for key, step in sorted(aggregate.steps.items())
            if step.reused_from is not None
        ),
    )
    if run.is_terminal:
        cause, ended_at = root_cause(log, aggregate)
        return report(root_cause=cause, terminal_at_ms=ended_at)
    blocked: list[AttemptBlock] = []
    backlog: list[AttemptBlock] = []
    for attempt in aggregate.active_attempts():
        block = _attempt_block(aggregate, attempt, now_ms, intent)
        if _interrupted_last(aggregate, attempt.step_key):
            block = replace(block, interrupted=True)
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


def _interrupted_last(aggregate: RunAggregate, step_key: str) -> bool:
    """Whether the step's latest ended Attempt was interrupted by its host."""
    ended = [
        aggregate.attempts[a]
        for a in aggregate.steps[step_key].attempt_ids
        if aggregate.attempts[a].status in ATTEMPT_TERMINAL
    ]
    return bool(ended) and ended[-1].status == ATTEMPT_INTERRUPTED


def _intent(log: RunLog, aggregate: RunAggregate, now_ms: int) -> Intent | None:
    effective = effective_intent(aggregate, now_ms)
    if effective is None:
        return None
    reason, at_ms = effective
    for record in log.run:
        if record.type == EventType.WORKFLOW_CANCEL_REQUESTED:
            return Intent(reason, at_ms, record.metadata.get("actor"), recorded=True)
    return Intent(reason, at_ms, None, recorded=False)


def _attempt_block(
    aggregate: RunAggregate, attempt: AttemptState, now_ms: int, intent: Intent | None
) -> AttemptBlock:
    lease = attempt.lease
    block = AttemptBlock(
        attempt_id=attempt.attempt_id,
        step_key=attempt.step_key,
        attempt_number=attempt.attempt_number,
        status=attempt.status,
        lease_id=lease.lease_id if lease else None,
        lease_version=lease.version if lease else None,
        lease_status=lease.status if lease else None,
        worker_id=lease.worker_id if lease else attempt.worker_id,
        expires_at_ms=lease.expires_at_ms if lease else None,
        lease_live=attempt.has_live_lease(now_ms),
        next="",
        step_deadline_ms=step_deadline_ms(aggregate, attempt.attempt_id),
        past_step_timeout=past_step_timeout(aggregate, attempt.attempt_id, now_ms),
    )
    return replace(block, next=attempt_next(block, intent))


def _step_wait(aggregate: RunAggregate, step: StepRunState, intent: Intent | None) -> StepWait:
    ending_as = ending(intent)
    waiting_on: tuple[str, ...] = ()
    if step.status == STEP_PENDING:
        waiting_on = tuple(n for n in step.needs if aggregate.steps[n].status != Status.SUCCEEDED)
        if intent:
            next_step = "the next cycle's cancellation cancels it (it never ran)"
        elif any(aggregate.steps[n].status in STEP_TERMINAL for n in waiting_on):
            next_step = "a need did not succeed: the next cycle's frontier skips it"
        elif waiting_on:
            described = ", ".join(f"{n} ({aggregate.steps[n].status})" for n in waiting_on)
            next_step = f"it waits for {described} to succeed"
        else:
            next_step = "every need succeeded: the next cycle's frontier makes it ready"
    elif step.status == STEP_READY and step.retry_at_ms is not None:
        number, limit = retry_number(aggregate, step.key)
        next_step = (
            f"the next cycle's cancellation ends it as {ending_as} (it waits for no retry)"
            if intent
            else "the first cycle from then on claims its next Attempt"
        )
        return StepWait(step.key, step.status, (), next_step, number, limit, step.retry_at_ms)
    elif step.status in (STEP_READY, STEP_WAITING_APPROVAL):
        next_step = (
            f"the next cycle's cancellation ends it as {ending_as}"
            if intent
            else "the next cycle's attempt admission claims an Attempt for it"
        )
        if _interrupted_last(aggregate, step.key):
            next_step = f"{INTERRUPTED_WORDS}; {next_step}"
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
                f"the Run ends as {ending(intent)} once no Attempt holds authority "
                "(the worker completes or recovery ends its lease)"
            )
        return (
            "nothing holds authority: the next cycle's cancellation ends the Run as "
            f"{ending(intent)}"
        )
    outcome = aggregate_outcome(statuses)
    if outcome is not None:
        return f"every step is terminal: the next cycle's frontier ends the Run as {outcome[0]}"
    return None
