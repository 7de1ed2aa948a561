"""Retries on a folded Run: how many reported failures a step has had, whether a
failure is retried and when, and the earliest instant a waiting retry may start.

The attempt admission decision, the worker's completion and the read model's
admission index all ask these, so the rule lives here once (docs/DESIGN.md,
"Retries").
"""

from __future__ import annotations

from domain.aggregate import AttemptState, RunAggregate, StepRunState
from domain.retry import RetryPolicy, retry_at_after
from domain.transitions import STEP_READY, STEP_TIMEOUT, Status


def policy_of(aggregate: RunAggregate, step_key: str) -> RetryPolicy:
    """The retry policy the plan binds for `step_key` (no retry in a v1 plan)."""
    planned = aggregate.plan.step(step_key)
    return RetryPolicy(planned.max_attempts, planned.backoff_ms)


def reported_failures(aggregate: RunAggregate, step_key: str) -> int:
    """Attempts of the step a worker completed `failed`, or `timed_out` at the step's
    timeout (`step_timeout`); lost ones never count."""
    step = aggregate.steps[step_key]
    return sum(1 for a in step.attempt_ids if counts_as_failure(aggregate.attempts[a]))


def counts_as_failure(attempt: AttemptState) -> bool:
    """Whether the ended Attempt counts against its step's max_attempts."""
    return attempt.status == Status.FAILED or attempt.result_code == STEP_TIMEOUT


def retry_after_failure(aggregate: RunAggregate, step_key: str, now_ms: int) -> int | None:
    """When the step's next Attempt may start if the running Attempt is reported
    failed at `now_ms`; None when it has no attempts left (the step fails)."""
    failures = reported_failures(aggregate, step_key) + 1
    return retry_at_after(policy_of(aggregate, step_key), failures, now_ms)


def waiting_retry(step: StepRunState, now_ms: int) -> bool:
    """Whether a ready StepRun still waits for its retry at `now_ms`."""
    return step.status == STEP_READY and step.retry_at_ms is not None and now_ms < step.retry_at_ms


def next_retry_at_ms(aggregate: RunAggregate) -> int | None:
    """The earliest `retry_at_ms` of the Run's ready StepRuns waiting for a retry."""
    waits = [
        step.retry_at_ms
        for step in aggregate.steps.values()
        if step.status == STEP_READY and step.retry_at_ms is not None
    ]
    return min(waits) if waits else None


def retry_number(aggregate: RunAggregate, step_key: str) -> tuple[int, int]:
    """(the number of the next Attempt counted in reported failures + 1,
    max_attempts): "retry 2 of 3"."""
    return reported_failures(aggregate, step_key) + 1, policy_of(aggregate, step_key).max_attempts
