"""Step timeouts: how long one Attempt of a step may run, and whether it has
(docs/DESIGN.md, "Step timeouts").

A step's `timeout_ms` (or its Task's) is bound into the plan at admission. Its clock
starts at the start barrier (`attempt.starting`, whose data then carries
`started_at_ms`); an Attempt still active at `started_at_ms + timeout_ms` is past
it. The domain answers that question — the renewal says so to the host
(`Decision.step_timed_out`), and a completion with the outcome `timed_out` is
accepted only then — and the host stops the process. A host that is gone cannot:
its lease expires and recovery records the Attempt lost, as for any vanished host.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the plan module checks timeouts too, and the aggregate holds a plan
    from domain.run_state import RunAggregate

MIN_STEP_TIMEOUT_MS = 1_000
MAX_STEP_TIMEOUT_MS = 2**53 - 1


def timeout_problem(timeout_ms: object, workflow_timeout_ms: int | None) -> str | None:
    """Why `timeout_ms` cannot be a step's timeout in a Workflow whose own timeout is
    `workflow_timeout_ms` (None: it has none), or None."""
    if type(timeout_ms) is not int or not MIN_STEP_TIMEOUT_MS <= timeout_ms <= MAX_STEP_TIMEOUT_MS:
        return (
            f"must be an integer of milliseconds from {MIN_STEP_TIMEOUT_MS} (1 s), "
            f"not {timeout_ms!r}"
        )
    if workflow_timeout_ms is not None and timeout_ms > workflow_timeout_ms:
        return (
            f"{timeout_ms} ms is above the Workflow's own timeout_ms ({workflow_timeout_ms}): "
            "the Run would end before the step could time out"
        )
    return None


def step_timeout_ms(aggregate: RunAggregate, step_key: str) -> int | None:
    """The timeout the plan binds for `step_key` (None: it has none)."""
    return aggregate.plan.step(step_key).timeout_ms


def step_deadline_ms(aggregate: RunAggregate, attempt_id: str) -> int | None:
    """The instant the Attempt passes its step's timeout: its start barrier plus the
    timeout. None when the step has none or the Attempt has not started."""
    attempt = aggregate.attempts.get(attempt_id)
    if attempt is None or attempt.started_at_ms is None:
        return None
    timeout = step_timeout_ms(aggregate, attempt.step_key)
    return None if timeout is None else attempt.started_at_ms + timeout


def past_step_timeout(aggregate: RunAggregate, attempt_id: str, now_ms: int) -> bool:
    """Whether the Attempt is still active at `now_ms` and past its step's timeout."""
    deadline = step_deadline_ms(aggregate, attempt_id)
    attempt = aggregate.attempts.get(attempt_id)
    return deadline is not None and attempt is not None and attempt.is_active and now_ms >= deadline
