"""Task Attempt admission (docs/DESIGN.md, "States" and "The cycle").

Each `ready` StepRun with no active Attempt gets a `claimed` Attempt admitted
against its exact ready epoch, with an immutable admission (plan digest, task
ref, task id, source digest, executor). The Attempt id and its event id derive
from (plan digest, StepRun id, epoch): a requeue (ready → ready, new epoch) makes
room for a new Attempt; the same epoch never gets two. A StepRun that has used
up its 64 Attempts (or a Run its 8,192) fails with `attempts_exhausted`.
"""

from __future__ import annotations

from domain.aggregate import RunAggregate, effective_intent
from domain.decision import EMPTY, Decision, DecisionBuilder, check_now, sibling_id
from domain.errors import InvalidInput
from domain.event_types import EventType
from domain.ids import FRONTIER_MUTATION, TASK_ATTEMPT, TASK_ATTEMPT_EVENT, derive_id
from domain.retries import waiting_retry
from domain.transitions import (
    ATTEMPTS_EXHAUSTED,
    EXECUTORS,
    MAX_ATTEMPTS_PER_RUN,
    MAX_ATTEMPTS_PER_STEP,
    STEP_READY,
    Status,
)

ATTEMPTS_ACTOR = "cycle:attempts"


def attempt_id_for(plan_digest: str, step_run_id: str, step_epoch: int) -> str:
    """The id of the Attempt admitted against `step_epoch` of a StepRun (its
    `attempt.claimed` event id shares the digest, prefix `wte:`)."""
    return derive_id(TASK_ATTEMPT, plan_digest, step_run_id, step_epoch)


def decide_attempt_claims(
    aggregate: RunAggregate,
    now_ms: int,
    executor: str = "local_process",
    actor: str = ATTEMPTS_ACTOR,
    *,
    probe: bool = False,
) -> Decision:
    """Claim one Attempt for every ready StepRun that has no active Attempt and is
    not waiting for its retry (`retry_at_ms` after `now_ms`); `actor` is the writer
    named in the records' metadata (`probe`: see `DecisionBuilder.on`)."""
    check_now(now_ms)
    if executor not in EXECUTORS:
        raise InvalidInput(
            "executor", "one_of", f"executor must be one of {EXECUTORS}, not {executor!r}"
        )
    if aggregate.run.is_terminal or effective_intent(aggregate, now_ms) is not None:
        return EMPTY
    if aggregate.run.queued:  # waits for its Workflow's slot (docs/DESIGN.md "Flow control")
        return EMPTY
    builder = DecisionBuilder.on(aggregate, now_ms, actor, probe=probe)
    plan = aggregate.plan
    digest = plan.plan_digest
    attempts = aggregate.attempts
    run_total = len(attempts)
    for key, step in aggregate.steps.items():
        if step.status != STEP_READY or waiting_retry(step, now_ms):
            continue
        if any(
            attempts[a].is_active or attempts[a].step_epoch == step.epoch for a in step.attempt_ids
        ):
            continue
        if len(step.attempt_ids) >= MAX_ATTEMPTS_PER_STEP or run_total >= MAX_ATTEMPTS_PER_RUN:
            parts = (digest, step.step_run_id, step.epoch, ATTEMPTS_EXHAUSTED)
            builder.change_step(
                key,
                Status.FAILED,
                (TASK_ATTEMPT_EVENT, FRONTIER_MUTATION, parts),
                result_code=ATTEMPTS_EXHAUSTED,
            )
            continue
        attempt_id = attempt_id_for(digest, step.step_run_id, step.epoch)
        run_total += 1
        builder.event(
            sibling_id(TASK_ATTEMPT_EVENT, attempt_id),
            EventType.ATTEMPT_CLAIMED,
            {
                "attempt_id": attempt_id,
                "step_run_id": step.step_run_id,
                "step_key": key,
                "step_epoch": step.epoch,
                "attempt_number": len(step.attempt_ids) + 1,
                "admission": {
                    "plan_digest": digest,
                    "task_ref": step.task_ref,
                    "task_id": step.task_id,
                    "source_digest": step.source_digest,
                    "executor": executor,
                },
            },
        )
    if builder.is_empty:
        return EMPTY
    return builder.build()
