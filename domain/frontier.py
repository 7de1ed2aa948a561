"""Frontier and terminal aggregation (docs/DESIGN.md, "The cycle").

A `pending` StepRun whose needs all `succeeded` becomes `ready`; one with any
need `failed | cancelled | timed_out | skipped` becomes `skipped`
(`dependency_not_succeeded`). Steps are visited in topological order over the
projected statuses, so a skip reaches every descendant in one decision. When
every StepRun is then terminal, the Run ends in the same decision, last.
A Run that is terminal or has (effective) cancel intent is left alone: the
cancellation phase owns it.
"""

from __future__ import annotations

from collections.abc import Iterable

from domain.aggregate import RunAggregate, effective_intent
from domain.decision import EMPTY, Decision, DecisionBuilder, check_now
from domain.ids import FRONTIER_EVENT, FRONTIER_MUTATION, WORKFLOW_TERMINAL, derive_id
from domain.transitions import (
    DEPENDENCY_NOT_SUCCEEDED,
    STEP_NOT_SUCCEEDED,
    STEP_PENDING,
    STEP_TERMINAL,
    Status,
)

FRONTIER_ACTOR = "cycle:frontier"
_TERMINAL_ERROR_CODES = {
    Status.SUCCEEDED.value: None,
    Status.FAILED.value: "workflow_step_failed",
    Status.TIMED_OUT.value: "workflow_step_timed_out",
    Status.CANCELLED.value: "workflow_step_cancelled",
}


def aggregate_outcome(statuses: Iterable[str]) -> tuple[str, str | None] | None:
    """The Run's (terminal status, error code) from its StepRuns' statuses, or None
    while any StepRun is not terminal: any failed or skipped → failed; else any
    timed_out → timed_out; else any cancelled → cancelled; else succeeded."""
    seen = set(statuses)
    if not seen <= STEP_TERMINAL:
        return None
    if Status.FAILED in seen or Status.SKIPPED in seen:
        status = Status.FAILED
    elif Status.TIMED_OUT in seen:
        status = Status.TIMED_OUT
    elif Status.CANCELLED in seen:
        status = Status.CANCELLED
    else:
        status = Status.SUCCEEDED
    return status, _TERMINAL_ERROR_CODES[status]


def decide_frontier(
    aggregate: RunAggregate, now_ms: int, actor: str = FRONTIER_ACTOR, *, probe: bool = False
) -> Decision:
    """Advance pending StepRuns and aggregate the Run's outcome when all are terminal.

    `actor` names the writer in the records' metadata (a completion that carries
    its consequences names its worker); nothing else depends on it (`probe`: see
    `DecisionBuilder.on`)."""
    check_now(now_ms)
    if aggregate.run.is_terminal or effective_intent(aggregate, now_ms) is not None:
        return EMPTY
    builder = DecisionBuilder.on(aggregate, now_ms, actor, probe=probe)
    digest = aggregate.plan.plan_digest
    statuses = builder.step_statuses()
    for key in aggregate.topo_order:
        if statuses[key] != STEP_PENDING:
            continue
        step = aggregate.steps[key]
        need_statuses = [statuses[need] for need in step.needs]
        if any(status in STEP_NOT_SUCCEEDED for status in need_statuses):
            target, result_code = Status.SKIPPED, DEPENDENCY_NOT_SUCCEEDED
        elif all(status == Status.SUCCEEDED for status in need_statuses):
            target, result_code = Status.READY, None
        else:
            continue
        parts = (digest, step.step_run_id, step.epoch, target)
        builder.change_step(
            key, target, (FRONTIER_EVENT, FRONTIER_MUTATION, parts), result_code=result_code
        )
        statuses[key] = target
    outcome = aggregate_outcome(statuses.values())
    run_terminal = None
    if outcome is not None:
        run_terminal, error_code = outcome
        builder.end_run(
            derive_id(WORKFLOW_TERMINAL, digest, "terminal", builder.run_version, run_terminal),
            run_terminal,
            {"result_code": error_code, "error_code": error_code},
            aggregate.plan.notify,
            aggregate.plan.workflow_key,
        )
    if builder.is_empty:
        return EMPTY
    return builder.build(run_terminal=run_terminal)
