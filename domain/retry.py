"""A step's retry policy and the rule of when its next Attempt may start (plan v2).

`retry = { max_attempts, backoff_ms }`: at most `max_attempts` Attempts that a
worker reported failed (1 = no retry); after the n-th failure the StepRun goes
back to `ready` with `retry_at_ms` = completion time + backoff_ms * 2^(n-1),
capped at 10 minutes. A lost Attempt never counts and is never retried past the
start barrier (docs/DESIGN.md, "Retries").
"""

from __future__ import annotations

from dataclasses import dataclass

from domain.errors import PlanError

MIN_MAX_ATTEMPTS = 1
MAX_MAX_ATTEMPTS = 64
MAX_BACKOFF_MS = 600_000


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How often a step is tried (`max_attempts`) and how long the first wait is."""

    max_attempts: int = 1
    backoff_ms: int = 0

    def __post_init__(self) -> None:
        problem = retry_problem(self.max_attempts, self.backoff_ms)
        if problem is not None:
            raise PlanError("retry", problem)

    @property
    def retries(self) -> bool:
        """Whether the policy ever retries (max_attempts > 1)."""
        return self.max_attempts > 1


def retry_problem(max_attempts: object, backoff_ms: object) -> str | None:
    """Why the pair is not a retry policy, or None."""
    if type(max_attempts) is not int or not MIN_MAX_ATTEMPTS <= max_attempts <= MAX_MAX_ATTEMPTS:
        return (
            f"max_attempts must be an integer from {MIN_MAX_ATTEMPTS} to {MAX_MAX_ATTEMPTS}, "
            f"not {max_attempts!r}"
        )
    if type(backoff_ms) is not int or not 0 <= backoff_ms <= MAX_BACKOFF_MS:
        return f"backoff_ms must be an integer from 0 to {MAX_BACKOFF_MS}, not {backoff_ms!r}"
    return None


NO_RETRY = RetryPolicy()


def backoff_after(policy: RetryPolicy, failures: int) -> int:
    """The wait after the `failures`-th reported failure: backoff doubling each
    retry, capped at MAX_BACKOFF_MS."""
    if failures < 1:
        return 0
    doubled: int = policy.backoff_ms << min(failures - 1, 32)
    return min(doubled, MAX_BACKOFF_MS)


def retry_at_after(policy: RetryPolicy, failures: int, completed_at_ms: int) -> int | None:
    """When the next Attempt may start after `failures` reported failures ended at
    `completed_at_ms`, or None when the step has no attempts left (it fails)."""
    if failures >= policy.max_attempts:
        return None
    return completed_at_ms + backoff_after(policy, failures)


def admissible(retry_at_ms: int | None, now_ms: int) -> bool:
    """Whether a ready StepRun whose retry waits until `retry_at_ms` may get an
    Attempt at `now_ms` (attempt admission and the read model's index ask this)."""
    return retry_at_ms is None or now_ms >= retry_at_ms
