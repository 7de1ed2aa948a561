"""Generation-bound execution plan (SPEC §3, ADR-0223).

A plan binds one Run to one immutable, digest-checked definition: publication,
materialized revision, workflow, the Task source digests and every StepRun id.
"""

from __future__ import annotations

from dataclasses import dataclass

PLAN_SCHEMA = "qinglong/plugin-package-workflow-execution-plan@v1"
MAX_STEPS = 128
MAX_PLAN_BYTES = 256 * 1024


@dataclass(frozen=True, slots=True)
class PlanStep:
    """One Step of a plan. `needs` is sorted; `initial_status` is ready | pending."""

    key: str
    step_run_id: str
    task_id: str
    task_ref: str  # "<package>@<generation>#<task>"
    source_digest: str
    needs: tuple[str, ...]
    initial_status: str


@dataclass(frozen=True, slots=True)
class ExecutionPlan:
    """The immutable plan a Run is admitted with. `steps` is sorted by key."""

    schema: str
    project: str
    package: str
    installation: str
    lock_digest: str
    generation: int
    revision_id: str
    revision_digest: str
    publication_id: str
    publication_digest: str
    workflow_key: str
    workflow_digest: str
    run_id: str
    timeout_ms: int | None
    steps: tuple[PlanStep, ...]
    plan_digest: str

    def step(self, key: str) -> PlanStep:
        for step in self.steps:
            if step.key == key:
                return step
        raise KeyError(key)
