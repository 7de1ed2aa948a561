"""Generation-bound execution plan (docs/DESIGN.md, "The execution plan").

A plan binds one Run to one immutable, digest-checked definition: publication,
materialized revision, workflow, the Task source digests and every StepRun id.
`build_plan` makes one from a publication and its revision (`plan_workflow` checks
what depends on those alone, once per Workflow; `bind_plan` binds a Run); `normalize` strictly
re-reads one (for example from a `workflow.admitted` event) and recomputes its
digest. Every refusal is a PlanError whose `rule` names the broken rule.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from domain.canonical import canonical_bytes, digest_of_canonical, domain_digest
from domain.errors import PlanError
from domain.fields import (
    IDENTIFIER_PATTERN,
    check_digest,
    check_fields,
    check_id,
    check_list,
    check_mapping,
    check_name,
    check_positive_int,
    check_text,
    refuse_type,
)
from domain.flow import NO_FLOW, PlanFlow, bind_flow, plan_flow
from domain.ids import STEP_RUN_ID, derive_id
from domain.notify import NotifyRule, notify_document, plan_notify
from domain.params import bind_params
from domain.plan_binding import check_binding, check_revision_integrity, check_step_run_ids
from domain.plan_v2 import (
    PLAN_SCHEMA_V1,
    PLAN_SCHEMA_V2,
    V2_PLAN_FIELDS,
    V2_STEP_FIELDS,
    Params,
    check_schema,
    check_uses_v2,
    normalize_params,
    normalize_retry,
    refuse_v2_fields,
    retry_field,
    schema_for,
)
from domain.publication import PublicationRef, check_publication
from domain.revision import MaterializedRevision
from domain.start_guard import task_disabled, workflow_disabled
from domain.step_timeouts import timeout_problem
from domain.transitions import STEP_PENDING, STEP_READY
from domain.workflows import (
    MAX_WORKFLOW_STEPS,
    WorkflowDefinition,
    check_step_graph,
    check_workflow,
    workflow_semantic_digest,
)

PLAN_SCHEMA = PLAN_SCHEMA_V1
MAX_STEPS = MAX_WORKFLOW_STEPS
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
    max_attempts: int = 1  # plan v2: the retry policy (1: no retry)
    backoff_ms: int = 0
    # how long one Attempt may run (docs/DESIGN.md "Step timeouts"); in the step's
    # document only when set, in a plan of either schema, so other plans keep digests
    timeout_ms: int | None = None


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
    params: Params = ()  # plan v2: bound parameter values, sorted by name
    # the Workflow's notify rules; in the document only when there are some, so a
    # plan without them keeps its digest (docs/DESIGN.md "Notifications")
    notify: tuple[NotifyRule, ...] = ()
    # priority and the limits' slots (docs/DESIGN.md "Flow control"); in the document
    # only when not the default, so a plan without them keeps its digest
    flow: PlanFlow = NO_FLOW

    @property
    def is_v2(self) -> bool:
        return self.schema == PLAN_SCHEMA_V2

    @property
    def param_values(self) -> dict[str, str | int | bool]:
        """The bound parameter values as a dict (empty for a v1 plan)."""
        return dict(self.params)

    def step(self, key: str) -> PlanStep:
        for step in self.steps:
            if step.key == key:
                return step
        raise KeyError(key)

    @property
    def step_keys(self) -> tuple[str, ...]:
        """Step keys in plan order (sorted)."""
        return tuple(step.key for step in self.steps)


def task_ref(package: str, generation: int, task_id: str) -> str:
    """The generation-bound Task reference "<package>@<generation>#<task>"."""
    return f"{package}@{generation}#{task_id}"


def step_run_ids_for(run_id: str, step_keys: Iterable[str]) -> dict[str, str]:
    """Deterministic StepRun ids for a Run: derive_id(STEP_RUN_ID, run_id, key)."""
    check_id(run_id, "run_id", "run_id")
    return {key: derive_id(STEP_RUN_ID, run_id, key) for key in step_keys}


# --- building -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PlannedWorkflow:
    """One Workflow of a publication, checked against its revision: everything a plan
    of it binds but the Run (`plan_workflow`). The revision is immutable, so one
    PlannedWorkflow serves every Run of that Workflow of that publication."""

    publication: PublicationRef
    revision: MaterializedRevision
    workflow_key: str
    workflow: WorkflowDefinition
    workflow_digest: str


def build_plan(
    publication: PublicationRef,
    revision: MaterializedRevision,
    workflow_key: str,
    run_id: str,
    step_run_ids: Mapping[str, str],
    timeout_ms: int | None = None,
    params: Mapping[str, Any] | None = None,
    priority: int | None = None,
) -> ExecutionPlan:
    """Plan one Run of `workflow_key` from `publication` and the revision it names.

    `step_run_ids` maps every Step key to its StepRun id (see `step_run_ids_for`).
    `timeout_ms` overrides the Workflow's own timeout. `params` are the start's
    parameter values (InvalidInput for an unknown name, a wrong type or a missing
    required one). Raises PlanError naming the first rule the inputs break.
    (`plan_workflow` then `bind_plan`.)
    """
    return bind_plan(
        plan_workflow(publication, revision, workflow_key),
        run_id,
        step_run_ids,
        timeout_ms,
        params,
        priority,
    )


def plan_workflow(
    publication: PublicationRef, revision: MaterializedRevision, workflow_key: str
) -> PlannedWorkflow:
    """Check `workflow_key` of `publication` against its revision: the revision is what
    its digest says, the two agree on every bound field, the Workflow exists, is
    enabled, is well formed, its Tasks are enabled and its digest is the published
    one. Raises PlanError naming the first rule broken."""
    if not isinstance(publication, PublicationRef):
        refuse_type(publication, "publication", "a PublicationRef")
    if not isinstance(revision, MaterializedRevision):
        refuse_type(revision, "revision", "a MaterializedRevision")
    check_name(workflow_key, "workflow_key", "workflow_key")
    check_publication(publication)
    check_revision_integrity(revision)
    check_binding(publication, revision)

    workflow = revision.workflow(workflow_key)
    refusal = workflow_disabled(workflow_key, workflow)
    if refusal is not None:
        raise PlanError(refusal.reason, refusal.message)
    check_workflow(workflow, revision.tasks)
    refusal = task_disabled(workflow_key, workflow, revision.tasks)
    if refusal is not None:
        raise PlanError(refusal.reason, refusal.message)
    workflow_digest = workflow_semantic_digest(workflow, revision.tasks)
    published = publication.workflow_digests.get(workflow_key)
    if published != workflow_digest:
        raise PlanError(
            "workflow_digest",
            f"publication's digest of Workflow {workflow_key!r} is {published!r}, "
            f"the revision gives {workflow_digest!r}",
        )
    return PlannedWorkflow(publication, revision, workflow_key, workflow, workflow_digest)


def bind_plan(
    planned: PlannedWorkflow,
    run_id: str,
    step_run_ids: Mapping[str, str],
    timeout_ms: int | None = None,
    params: Mapping[str, Any] | None = None,
    priority: int | None = None,
) -> ExecutionPlan:
    """The plan of one Run of a checked Workflow (`plan_workflow`): its StepRun ids,
    timeout, bound parameters, priority (None: the Workflow's) and the slots of its
    limits, sealed with its digest (see `build_plan`)."""
    if not isinstance(planned, PlannedWorkflow):
        refuse_type(planned, "planned", "a PlannedWorkflow")
    _check_run_fields(run_id, timeout_ms)
    publication, revision, workflow = planned.publication, planned.revision, planned.workflow
    ids = check_step_run_ids(step_run_ids, [step.key for step in workflow.steps])
    bound = tuple(sorted(bind_params(workflow.params, params).items()))

    steps = tuple(
        PlanStep(
            key=step.key,
            step_run_id=ids[step.key],
            task_id=step.task,
            task_ref=task_ref(revision.package, revision.generation, step.task),
            source_digest=revision.tasks[step.task].source_digest,
            needs=tuple(sorted(step.needs)),
            initial_status=STEP_PENDING if step.needs else STEP_READY,
            max_attempts=step.retry.max_attempts if step.retry else 1,
            # a step that never retries has no backoff (so v1 and v2 read back equal)
            backoff_ms=step.retry.backoff_ms if step.retry and step.retry.retries else 0,
            timeout_ms=step.timeout_ms,
        )
        for step in sorted(workflow.steps, key=lambda step: step.key)
    )
    schema = schema_for(bound, (step.max_attempts for step in steps))
    document: dict[str, Any] = {
        "schema": schema,
        "project": revision.project,
        "package": revision.package,
        "installation": revision.installation,
        "lock_digest": revision.lock_digest,
        "generation": revision.generation,
        "revision_id": revision.revision_id,
        "revision_digest": revision.revision_digest,
        "publication_id": publication.publication_id,
        "publication_digest": publication.publication_digest,
        "workflow_key": planned.workflow_key,
        "workflow_digest": planned.workflow_digest,
        "run_id": run_id,
        "timeout_ms": timeout_ms if timeout_ms is not None else workflow.timeout_ms,
        "steps": [_step_document(step, schema) for step in steps],
    }
    if schema == PLAN_SCHEMA_V2:
        document["params"] = dict(bound)
    if workflow.notify:
        document["notify"] = notify_document(workflow.notify)
    flow = bind_flow(
        revision.package,
        planned.workflow_key,
        workflow.limit,
        {
            step.key: (step.task, limit)
            for step in workflow.steps
            if (limit := revision.tasks[step.task].concurrency) is not None
        },
        dict(bound),
        workflow.priority if priority is None else priority,
    )
    if not flow.is_default:
        document["flow"] = flow.document()
    return _seal(document, steps)


def _check_run_fields(run_id: str, timeout_ms: int | None) -> None:
    check_id(run_id, "run_id", "run_id")
    if timeout_ms is not None:
        check_positive_int(timeout_ms, "timeout_ms", "timeout_ms")


# --- encoding -------------------------------------------------------------------------


def _step_document(step: PlanStep, schema: str) -> dict[str, Any]:
    document: dict[str, Any] = {
        "key": step.key,
        "step_run_id": step.step_run_id,
        "task_id": step.task_id,
        "task_ref": step.task_ref,
        "source_digest": step.source_digest,
        "needs": list(step.needs),
        "initial_status": step.initial_status,
    }
    if schema == PLAN_SCHEMA_V2:
        document["retry"] = retry_field(step.max_attempts, step.backoff_ms)
    if step.timeout_ms is not None:
        document["timeout_ms"] = step.timeout_ms
    return document


def plan_to_dict(plan: ExecutionPlan) -> dict[str, Any]:
    """The plan as a JSON-able dict, `plan_digest` included; `normalize` reads it back."""
    document = {
        "schema": plan.schema,
        "project": plan.project,
        "package": plan.package,
        "installation": plan.installation,
        "lock_digest": plan.lock_digest,
        "generation": plan.generation,
        "revision_id": plan.revision_id,
        "revision_digest": plan.revision_digest,
        "publication_id": plan.publication_id,
        "publication_digest": plan.publication_digest,
        "workflow_key": plan.workflow_key,
        "workflow_digest": plan.workflow_digest,
        "run_id": plan.run_id,
        "timeout_ms": plan.timeout_ms,
        "steps": [_step_document(step, plan.schema) for step in plan.steps],
        "plan_digest": plan.plan_digest,
    }
    if plan.schema == PLAN_SCHEMA_V2:
        document["params"] = dict(plan.params)
    if plan.notify:
        document["notify"] = notify_document(plan.notify)
    if not plan.flow.is_default:
        document["flow"] = plan.flow.document()
    return document


def plan_digest(plan_without_digest: Mapping[str, Any]) -> str:
    """SHA-256 over the plan's schema string, a NUL and the canonical JSON of the plan
    without `plan_digest` (a `plan_digest` key, if present, is left out)."""
    document = {key: value for key, value in plan_without_digest.items() if key != "plan_digest"}
    return domain_digest(check_schema(document.get("schema")), document)


def _seal(document: dict[str, Any], steps: tuple[PlanStep, ...]) -> ExecutionPlan:
    encoded = canonical_bytes(document)
    digest = digest_of_canonical(document["schema"], encoded)
    # The stated digest adds one member, `,"plan_digest":"sha256:<64 hex>"`, to the encoding.
    size = len(encoded) + len(',"plan_digest":""') + len(digest)
    if size > MAX_PLAN_BYTES:
        raise PlanError("plan_size", f"encoded plan is {size} bytes; at most {MAX_PLAN_BYTES}")
    fields = {
        key: value
        for key, value in document.items()
        if key not in ("steps", "params", "notify", "flow")
    }
    params = tuple(sorted(document.get("params", {}).items()))
    notify = plan_notify(document["notify"]) if "notify" in document else ()
    flow = (
        plan_flow(document["flow"], tuple(s.key for s in steps)) if "flow" in document else NO_FLOW
    )
    return ExecutionPlan(
        **fields, steps=steps, plan_digest=digest, params=params, notify=notify, flow=flow
    )


# --- normalizing ----------------------------------------------------------------------

_PLAN_FIELDS = (
    "schema", "project", "package", "installation", "lock_digest", "generation",
    "revision_id", "revision_digest", "publication_id", "publication_digest",
    "workflow_key", "workflow_digest", "run_id", "timeout_ms", "steps",
)  # fmt: skip
_STEP_FIELDS = (
    "key", "step_run_id", "task_id", "task_ref", "source_digest", "needs", "initial_status",
)  # fmt: skip


def normalize(value: object) -> ExecutionPlan:
    """Strictly read a plan (a dict as decoded from JSON, or an ExecutionPlan).

    Refuses unknown or missing fields, wrong types (a bool is not an integer, a
    float never is), any structural rule of a plan, and a stated `plan_digest`
    that differs from the recomputed one. A plan without `plan_digest` gets the
    digest it would have had. Raises only PlanError.
    """
    if isinstance(value, ExecutionPlan):
        value = plan_to_dict(value)
    plan = check_mapping(value, "plan")
    if "schema" in plan:
        check_schema(plan["schema"])
    v2 = plan.get("schema") == PLAN_SCHEMA_V2
    if not v2:
        refuse_v2_fields(plan, V2_PLAN_FIELDS, "plan")
    check_fields(
        plan,
        (*_PLAN_FIELDS, *(V2_PLAN_FIELDS if v2 else ())),
        "plan",
        optional=("plan_digest", "notify", "flow"),
    )
    schema = check_schema(plan["schema"])
    package = check_name(plan["package"], "package", "package")
    generation = check_positive_int(plan["generation"], "generation", "generation")
    timeout_ms = plan["timeout_ms"]
    if timeout_ms is not None:
        check_positive_int(timeout_ms, "timeout_ms", "timeout_ms")
    document: dict[str, Any] = {
        "schema": schema,
        "project": check_text(plan["project"], IDENTIFIER_PATTERN, "project", "project"),
        "package": package,
        "installation": check_text(
            plan["installation"], IDENTIFIER_PATTERN, "installation", "installation"
        ),
        "lock_digest": check_digest(plan["lock_digest"], "lock_digest", "lock_digest"),
        "generation": generation,
        "revision_id": check_id(plan["revision_id"], "revision_id", "revision_id"),
        "revision_digest": check_digest(
            plan["revision_digest"], "revision_digest", "revision_digest"
        ),
        "publication_id": check_id(plan["publication_id"], "publication_id", "publication_id"),
        "publication_digest": check_digest(
            plan["publication_digest"], "publication_digest", "publication_digest"
        ),
        "workflow_key": check_name(plan["workflow_key"], "workflow_key", "workflow_key"),
        "workflow_digest": check_digest(
            plan["workflow_digest"], "workflow_digest", "workflow_digest"
        ),
        "run_id": check_id(plan["run_id"], "run_id", "run_id"),
        "timeout_ms": timeout_ms,
    }
    raw_steps = check_list(plan["steps"], "plan steps")
    if len(raw_steps) > MAX_STEPS:
        raise PlanError("too_many_steps", f"plan has {len(raw_steps)} Steps; at most {MAX_STEPS}")
    steps = tuple(
        _normalize_step(raw, index, package, generation, v2) for index, raw in enumerate(raw_steps)
    )
    _check_plan_steps(steps)
    document["steps"] = [_step_document(step, schema) for step in steps]
    if v2:
        params = normalize_params(plan["params"])
        check_uses_v2(schema, params, (step.max_attempts for step in steps))
        document["params"] = dict(params)
    if "notify" in plan:
        rules = plan_notify(plan["notify"])
        if not rules:  # absent when there are none: one document per plan
            raise PlanError("not_canonical", "plan states an empty notify")
        document["notify"] = notify_document(rules)
    if "flow" in plan:
        flow = plan_flow(plan["flow"], tuple(step.key for step in steps))
        document["flow"] = flow.document()
    normalized = _seal(document, steps)
    if "plan_digest" in plan:
        stated = plan["plan_digest"]
        if not isinstance(stated, str):
            refuse_type(stated, "plan_digest", "a digest string")
        if stated != normalized.plan_digest:
            raise PlanError(
                "plan_digest",
                f"plan states digest {stated!r} but its content gives {normalized.plan_digest!r}",
            )
    return normalized


def _normalize_step(raw: object, index: int, package: str, generation: int, v2: bool) -> PlanStep:
    what = f"plan step {index}"
    step = check_mapping(raw, what)
    if not v2:
        refuse_v2_fields(step, V2_STEP_FIELDS, what)
    check_fields(
        step, (*_STEP_FIELDS, *(V2_STEP_FIELDS if v2 else ())), what, optional=("timeout_ms",)
    )
    key = check_name(step["key"], "step_key", f"{what} key")
    what = f"plan step {key!r}"
    task_id = check_name(step["task_id"], "task_id", f"{what} task_id")
    needs = tuple(
        check_name(need, "step_key", f"{what} need")
        for need in check_list(step["needs"], f"{what} needs")
    )
    if list(needs) != sorted(needs):
        raise PlanError("needs_order", f"{what}: needs must be sorted")
    expected_ref = task_ref(package, generation, task_id)
    if step["task_ref"] != expected_ref:
        if not isinstance(step["task_ref"], str):
            refuse_type(step["task_ref"], f"{what} task_ref", "a string")
        raise PlanError("task_ref", f"{what}: task_ref must be {expected_ref!r}")
    status = step["initial_status"]
    expected_status = STEP_PENDING if needs else STEP_READY
    if status != expected_status:
        if not isinstance(status, str):
            refuse_type(status, f"{what} initial_status", "a string")
        raise PlanError(
            "initial_status", f"{what}: initial_status must be {expected_status!r}, not {status!r}"
        )
    max_attempts, backoff_ms = normalize_retry(step["retry"], what) if v2 else (1, 0)
    timeout_ms = step.get("timeout_ms")
    if timeout_ms is not None:
        problem = timeout_problem(timeout_ms, None)
        if problem is not None:
            raise PlanError("step_timeout", f"{what} timeout_ms {problem}")
    return PlanStep(
        key=key,
        step_run_id=check_id(step["step_run_id"], "step_run_id", f"{what} step_run_id"),
        task_id=task_id,
        task_ref=expected_ref,
        source_digest=check_digest(step["source_digest"], "source_digest", f"{what} source"),
        needs=needs,
        initial_status=expected_status,
        max_attempts=max_attempts,
        backoff_ms=backoff_ms,
        timeout_ms=timeout_ms,
    )


def _check_plan_steps(steps: tuple[PlanStep, ...]) -> None:
    check_step_graph([(step.key, step.needs) for step in steps], "plan")
    keys = [step.key for step in steps]
    if keys != sorted(keys):
        raise PlanError("step_order", "plan steps must be sorted by key")
    owners: dict[str, str] = {}
    for step in steps:
        if step.step_run_id in owners:
            raise PlanError(
                "step_run_id_duplicate",
                f"Steps {owners[step.step_run_id]!r} and {step.key!r} share StepRun id "
                f"{step.step_run_id!r}",
            )
        owners[step.step_run_id] = step.key
