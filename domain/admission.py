"""The initial records of an admitted Run (docs/DESIGN.md, "Durable admission").

`workflow.admitted` (carrying the plan) at version 1, then one `step.created`
per Step in key order, each with its StepRunMutation: a plan of n Steps gives
n + 1 RunEvents, n mutations, and a Run at version n + 1.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from domain.decision import Decision, DecisionBuilder, check_now, sibling_id
from domain.errors import InvalidInput
from domain.event_types import EventType
from domain.ids import ADMISSION_EVENT, ADMISSION_MUTATION, derive_id
from domain.plan import ExecutionPlan, plan_to_dict
from domain.rerun import Reuse

ADMISSION_ACTOR = "admission"


def admission_records(
    plan: ExecutionPlan,
    admission_key: str,
    now_ms: int,
    rerun_of: Mapping[str, Any] | None = None,
    reuses: Sequence[Reuse] = (),
    *,
    queued: bool = False,
) -> Decision:
    """Records that admit `plan` under `admission_key` at `now_ms` (streams must not exist).

    The plan must already be normalized (`domain.plan.normalize`); ids derive from
    its digest, so the same plan always yields the same records. A rerun
    (docs/DESIGN.md "Reruns") names its source in `rerun_of` ({"run_id", "reason"})
    and adds one `step.reused` per reused step after the `step.created` events.
    `queued`: the Run waits in its Workflow's queue for a slot (docs/DESIGN.md "Flow
    control"; `domain.slots.takes_slot_at_admission` decides).
    """
    if not isinstance(plan, ExecutionPlan):
        raise InvalidInput(
            "plan", "type", f"plan must be an ExecutionPlan, got {type(plan).__name__}"
        )
    if not isinstance(admission_key, str) or not admission_key:
        raise InvalidInput("admission_key", "non_empty", "admission_key must be a non-empty string")
    check_now(now_ms)
    digest = plan.plan_digest
    admitted_id = derive_id(ADMISSION_EVENT, digest, EventType.WORKFLOW_ADMITTED)
    builder = DecisionBuilder(
        run_id=plan.run_id,
        run_version=0,
        steps_version=0,
        steps={},
        lease_versions={},
        now_ms=now_ms,
        actor=ADMISSION_ACTOR,
        causation_id=None,
    )
    admitted: dict[str, Any] = {
        "plan": plan_to_dict(plan),
        "admission_key": admission_key,
        "admitted_at_ms": now_ms,
    }
    if rerun_of is not None:
        admitted["rerun_of"] = dict(rerun_of)
    if queued:
        if plan.flow.run_slot is None:
            raise InvalidInput("queued", "run_slot", "only a Run of a limited Workflow queues")
        admitted["queued"] = True
    builder.event(admitted_id, EventType.WORKFLOW_ADMITTED, admitted)
    builder.causation_id = admitted_id  # every StepRun is created by the admission
    for step in sorted(plan.steps, key=lambda s: s.key):
        event_id = derive_id(ADMISSION_EVENT, digest, step.step_run_id, 1)
        builder.create_step(
            step.key,
            step.step_run_id,
            step.initial_status,
            event_id,
            sibling_id(ADMISSION_MUTATION, event_id),
        )
    planned = {step.key: step for step in plan.steps}
    for reuse in reuses:
        origin = {"run_id": reuse.run_id, "attempt_id": reuse.attempt_id}
        output = None if reuse.output is None else dict(reuse.output)
        parts = (digest, planned[reuse.step_key].step_run_id, EventType.STEP_REUSED)
        builder.reuse_step(
            reuse.step_key, origin, output, (ADMISSION_EVENT, ADMISSION_MUTATION, parts)
        )
    return builder.build()
