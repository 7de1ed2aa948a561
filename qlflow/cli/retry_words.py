"""How `show`, `run` and the progress lines say a step's retries: "#1 failed, retry 2
of 3 at 03:50:01 (in 2s)" while it waits, "#3 succeeded after 2 failed" once done."""

from __future__ import annotations

from typing import Any

from domain.transitions import STEP_READY, Status
from projections.views import AttemptView, StepView
from qlflow.cli.times import when


def attempt_cell(step: StepView, attempt: AttemptView | None, now_ms: int) -> str:
    """The steps table's attempt cell."""
    if attempt is None:
        return "-"
    text = f"#{attempt.attempt_number} {attempt.status}"
    waiting = waiting_retry(step, now_ms)
    if waiting:
        return f"{text}, {waiting}"
    failed = step.failed_attempts - (1 if attempt.status == Status.FAILED else 0)
    if step.max_attempts > 1 and failed > 0:
        return f"{text} after {failed} failed"
    return text


def waiting_retry(step: StepView, now_ms: int) -> str:
    """ "retry 2 of 3 at <time>" for a ready step waiting for its retry, else ""."""
    if step.status != STEP_READY or step.retry_at_ms is None:
        return ""
    if step.attempts and step.attempts[-1].status in (
        Status.CLAIMED,
        Status.STARTING,
        Status.RUNNING,
    ):
        return ""
    return (
        f"retry {step.failed_attempts + 1} of {step.max_attempts} at "
        f"{when(step.retry_at_ms, now_ms)}"
    )


def params_text(params: dict[str, Any]) -> str:
    """A Run's parameters as `name=value, ...`."""
    return ", ".join(f"{name}={_value(value)}" for name, value in sorted(params.items()))


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
