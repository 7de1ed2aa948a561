"""A materialized revision: one installation's package content at one generation.

Its Tasks (with source digests) and Workflows, the lock digest of that content,
and an id and digest computed from all of it. Publishing again with an equal lock
digest changes nothing; `revision_to_json` / `revision_from_json` round-trip it
exactly, refusing any id or digest its content does not give.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, TypeVar

from domain.canonical import DIGEST_PREFIX, PLACEHOLDER_DIGEST, domain_digest
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
    check_same,
    check_text,
    load_json,
    refuse_type,
)
from domain.flow import DEFAULT_PRIORITY, Concurrency, FlowError, parse_concurrency
from domain.ids import REVISION_ID
from domain.notify import NotifyRule, notify_document, plan_notify
from domain.params import params_document, params_from_document
from domain.retry import RetryPolicy
from domain.schedule_spec import (
    STORED_OVERLAP,
    ScheduleSpec,
    ScheduleSpecError,
    validate_schedules,
)
from domain.tasks import ON_INTERRUPT_DEFAULT, TaskDefinition
from domain.workflows import (
    WorkflowDefinition,
    WorkflowStepDefinition,
    check_workflow,
    retry_document,
)

REVISION_SCHEMA = "qlflow/materialized-revision@v1"
LOCK_DOMAIN = "qlflow/package-lock@v1"

_Item = TypeVar("_Item")


def _frozen_by_key(
    value: object, kind: type[_Item], key_of: str, duplicate_rule: str, what: str
) -> Mapping[str, _Item]:
    """A read-only mapping sorted by key, from a mapping or a list of `kind` items."""
    if isinstance(value, Mapping):
        pairs = list(value.items())
    else:
        pairs = [(getattr(item, key_of, None), item) for item in check_list(value, what)]
    result: dict[str, _Item] = {}
    for key, item in pairs:
        if not isinstance(item, kind):
            refuse_type(item, f"{what} entry", f"a {kind.__name__}")
        if key != getattr(item, key_of):
            raise PlanError("type", f"{what} key {key!r} differs from {getattr(item, key_of)!r}")
        if key in result:
            raise PlanError(duplicate_rule, f"{what} has {key!r} twice")
        result[key] = item
    return MappingProxyType(dict(sorted(result.items())))


@dataclass(frozen=True, slots=True, init=False)
class MaterializedRevision:
    """One installation's package content at one generation. Build it with
    `materialize_revision` (or `revision_from_json`), which compute its lock digest,
    id and digest; `tasks` and `workflows` are read-only mappings sorted by key
    (the constructor takes mappings by key or lists of definitions)."""

    project: str
    package: str
    installation: str
    lock_digest: str
    generation: int
    revision_id: str
    revision_digest: str
    tasks: Mapping[str, TaskDefinition]
    workflows: Mapping[str, WorkflowDefinition]

    def __init__(
        self,
        project: str,
        package: str,
        installation: str,
        lock_digest: str,
        generation: int,
        revision_id: str,
        revision_digest: str,
        tasks: Mapping[str, TaskDefinition] | Sequence[TaskDefinition],
        workflows: Mapping[str, WorkflowDefinition] | Sequence[WorkflowDefinition],
    ) -> None:
        check_text(project, IDENTIFIER_PATTERN, "project", "project")
        check_name(package, "package", "package")
        check_text(installation, IDENTIFIER_PATTERN, "installation", "installation")
        check_digest(lock_digest, "lock_digest", "lock_digest")
        check_positive_int(generation, "generation", "generation")
        check_id(revision_id, "revision_id", "revision_id")
        check_digest(revision_digest, "revision_digest", "revision_digest")
        by_task = _frozen_by_key(tasks, TaskDefinition, "task_id", "duplicate_task", "tasks")
        by_key = _frozen_by_key(
            workflows, WorkflowDefinition, "key", "duplicate_workflow", "workflows"
        )
        object.__setattr__(self, "project", project)
        object.__setattr__(self, "package", package)
        object.__setattr__(self, "installation", installation)
        object.__setattr__(self, "lock_digest", lock_digest)
        object.__setattr__(self, "generation", generation)
        object.__setattr__(self, "revision_id", revision_id)
        object.__setattr__(self, "revision_digest", revision_digest)
        object.__setattr__(self, "tasks", by_task)
        object.__setattr__(self, "workflows", by_key)

    def __hash__(self) -> int:
        return hash((self.revision_id, self.revision_digest))

    def task(self, task_id: str) -> TaskDefinition:
        """The Task `task_id`; PlanError("unknown_task") if the revision has none."""
        try:
            return self.tasks[task_id]
        except KeyError:
            raise PlanError("unknown_task", f"revision has no Task {task_id!r}") from None

    def workflow(self, key: str) -> WorkflowDefinition:
        """The Workflow `key`; PlanError("unknown_workflow") if the revision has none."""
        try:
            return self.workflows[key]
        except KeyError:
            raise PlanError("unknown_workflow", f"revision has no Workflow {key!r}") from None


def _task_document(task: TaskDefinition) -> dict[str, Any]:
    document: dict[str, Any] = {
        "command": list(task.command),
        "enabled": task.enabled,
        "env": dict(task.env),
        "files": list(task.files),
        "source_digest": task.source_digest,
    }
    # only where declared: a command Task's revision keeps its digest
    if task.python is not None:
        document["python"] = task.python
    if task.isolation is not None:
        document["isolation"] = task.isolation
    if task.on_interrupt != ON_INTERRUPT_DEFAULT:  # only where declared: digests stay
        document["on_interrupt"] = task.on_interrupt
    if task.concurrency is not None:  # likewise
        document["concurrency"] = task.concurrency.document()
    return document


def _workflow_document(workflow: WorkflowDefinition) -> dict[str, Any]:
    # params and retry appear only where declared: content without them keeps its digests
    document: dict[str, Any] = {
        "enabled": workflow.enabled,
        "timeout_ms": workflow.timeout_ms,
        "steps": [_step_document(step) for step in workflow.steps],
    }
    if workflow.params:
        document["params"] = params_document(workflow.params)
    # only when there are some, so a revision without schedules keeps its digest
    if workflow.schedules:
        document["schedules"] = [schedule_document(spec) for spec in workflow.schedules]
    if workflow.notify:  # likewise
        document["notify"] = notify_document(workflow.notify)
    if workflow.limit is not None:  # likewise (docs/DESIGN.md "Flow control")
        field = "max_running" if workflow.limit.key is None else "concurrency"
        document[field] = workflow.limit.document()
    if workflow.priority != DEFAULT_PRIORITY:
        document["priority"] = workflow.priority
    return document


def _step_document(step: WorkflowStepDefinition) -> dict[str, Any]:
    document: dict[str, Any] = {"key": step.key, "task": step.task, "needs": list(step.needs)}
    if step.retry is not None:
        document["retry"] = retry_document(step.retry)
    if step.timeout_ms is not None:  # only where declared: other revisions keep digests
        document["timeout_ms"] = step.timeout_ms
    return document


def _content_document(
    tasks: Mapping[str, TaskDefinition], workflows: Mapping[str, WorkflowDefinition]
) -> dict[str, Any]:
    return {
        "tasks": {task_id: _task_document(task) for task_id, task in tasks.items()},
        "workflows": {key: _workflow_document(wf) for key, wf in workflows.items()},
    }


def package_lock_digest(
    tasks: Mapping[str, TaskDefinition], workflows: Mapping[str, WorkflowDefinition]
) -> str:
    """Digest of a package's content, whatever its project, installation or
    generation. Equal lock digests mean publishing again changes nothing."""
    return domain_digest(LOCK_DOMAIN, _content_document(tasks, workflows))


def revision_digest(revision: MaterializedRevision) -> str:
    """Recompute the digest of `revision` from its content (ignores the stated
    `revision_id` and `revision_digest`)."""
    document = revision_to_json(revision)
    del document["revision_id"], document["revision_digest"]
    return domain_digest(REVISION_SCHEMA, document)


def revision_id_for(digest: str) -> str:
    """The revision id named by a revision digest: "rev:" and 32 hex digits."""
    check_digest(digest, "revision_digest", "revision_digest")
    return REVISION_ID + digest[len(DIGEST_PREFIX) : len(DIGEST_PREFIX) + 32]


def materialize_revision(
    project: str,
    package: str,
    installation: str,
    generation: int,
    tasks: Mapping[str, TaskDefinition] | Iterable[TaskDefinition],
    workflows: Mapping[str, WorkflowDefinition] | Iterable[WorkflowDefinition],
) -> MaterializedRevision:
    """Build a revision, refusing Workflows that break a structural rule
    (see `check_workflow`), and compute its lock digest, id and digest."""
    draft = MaterializedRevision(
        project=project,
        package=package,
        installation=installation,
        lock_digest=PLACEHOLDER_DIGEST,
        generation=generation,
        revision_id=REVISION_ID + "0" * 32,
        revision_digest=PLACEHOLDER_DIGEST,
        tasks=tasks if isinstance(tasks, Mapping) else tuple(tasks),
        workflows=workflows if isinstance(workflows, Mapping) else tuple(workflows),
    )
    for workflow in draft.workflows.values():
        check_workflow(workflow, draft.tasks)
    locked = dataclasses.replace(
        draft, lock_digest=package_lock_digest(draft.tasks, draft.workflows)
    )
    digest = revision_digest(locked)
    return dataclasses.replace(locked, revision_id=revision_id_for(digest), revision_digest=digest)


_REVISION_FIELDS = (
    "schema", "project", "package", "installation", "lock_digest", "generation",
    "revision_id", "revision_digest", "tasks", "workflows",
)  # fmt: skip
_TASK_FIELDS = ("command", "enabled", "env", "files", "source_digest")
_TASK_OPTIONAL_FIELDS = ("python", "isolation", "on_interrupt", "concurrency")
_WORKFLOW_FIELDS = ("enabled", "timeout_ms", "steps")
_WORKFLOW_OPTIONAL_FIELDS = (
    "schedules", "params", "notify", "max_running", "concurrency", "priority",
)  # fmt: skip
_STEP_FIELDS = ("key", "task", "needs")


def revision_to_json(revision: MaterializedRevision) -> dict[str, Any]:
    """The revision as a JSON-able dict; `revision_from_json` rebuilds it exactly."""
    return {
        "schema": REVISION_SCHEMA,
        "project": revision.project,
        "package": revision.package,
        "installation": revision.installation,
        "lock_digest": revision.lock_digest,
        "generation": revision.generation,
        "revision_id": revision.revision_id,
        "revision_digest": revision.revision_digest,
        **_content_document(revision.tasks, revision.workflows),
    }


def revision_from_json(value: object) -> MaterializedRevision:
    """Strictly rebuild a revision from `revision_to_json` output (a dict, or its JSON
    text or bytes): unknown or missing fields, wrong types and any digest or id that
    does not match the content raise PlanError."""
    document = check_mapping(load_json(value), "revision")
    check_fields(document, _REVISION_FIELDS, "revision")
    if document["schema"] != REVISION_SCHEMA:
        raise PlanError("schema", f"revision schema must be {REVISION_SCHEMA!r}")
    tasks = []
    for task_id, raw in check_mapping(document["tasks"], "revision tasks").items():
        what = f"revision Task {task_id!r}"
        task = check_mapping(raw, what)
        check_fields(task, _TASK_FIELDS, what, _TASK_OPTIONAL_FIELDS)
        if task.get("on_interrupt") == ON_INTERRUPT_DEFAULT:
            raise PlanError("not_canonical", f"{what} states the default on_interrupt")
        tasks.append(
            TaskDefinition(
                task_id=task_id,
                command=task["command"],
                source_digest=task["source_digest"],
                enabled=task["enabled"],
                env=tuple(check_mapping(task["env"], f"{what} env").items()),
                files=task["files"],
                python=task.get("python"),
                isolation=task.get("isolation"),
                on_interrupt=task.get("on_interrupt", ON_INTERRUPT_DEFAULT),
                concurrency=_limit_from_json(task, "concurrency", what),
            )
        )
    workflows = []
    for key, raw in check_mapping(document["workflows"], "revision workflows").items():
        what = f"revision Workflow {key!r}"
        workflow = check_mapping(raw, what)
        check_fields(workflow, _WORKFLOW_FIELDS, what, _WORKFLOW_OPTIONAL_FIELDS)
        steps = []
        for raw_step in check_list(workflow["steps"], f"{what} steps"):
            step = check_mapping(raw_step, f"{what} step")
            check_fields(step, _STEP_FIELDS, f"{what} step", optional=("retry", "timeout_ms"))
            retry = None
            if "retry" in step:
                policy = check_mapping(step["retry"], f"{what} step retry")
                check_fields(policy, ("max_attempts", "backoff_ms"), f"{what} step retry")
                retry = RetryPolicy(policy["max_attempts"], policy["backoff_ms"])
            steps.append(
                WorkflowStepDefinition(
                    step["key"], step["task"], step["needs"], retry, step.get("timeout_ms")
                )
            )
        workflows.append(
            WorkflowDefinition(
                key=key,
                steps=tuple(steps),
                timeout_ms=workflow["timeout_ms"],
                enabled=workflow["enabled"],
                schedules=_schedules_from_json(workflow.get("schedules", []), what),
                params=params_from_document(workflow.get("params", {}), what),
                notify=_notify_from_json(workflow, what),
                limit=_workflow_limit_from_json(workflow, what),
                priority=workflow.get("priority", DEFAULT_PRIORITY),
            )
        )
    revision = materialize_revision(
        document["project"],
        document["package"],
        document["installation"],
        document["generation"],
        tasks,
        workflows,
    )
    check_same(document["lock_digest"], revision.lock_digest, "lock_digest", "revision")
    check_same(document["revision_digest"], revision.revision_digest, "revision_digest", "revision")
    check_same(document["revision_id"], revision.revision_id, "revision_id", "revision")
    if revision_to_json(revision) != document:
        raise PlanError("revision", "revision JSON is not in its canonical form")
    return revision


def schedule_document(spec: ScheduleSpec) -> dict[str, Any]:
    """One schedule of a Workflow as the revision JSON holds it. `overlap` is there
    unless it is `allow`, which a revision published before it existed means: those
    revisions keep their digests and their schedules what they did."""
    document: dict[str, Any] = {
        "cron": spec.cron,
        "timezone": spec.timezone,
        "misfire": spec.misfire,
        "params": dict(spec.params),
    }
    if spec.overlap != STORED_OVERLAP:
        document["overlap"] = spec.overlap
    return document


def _limit_from_json(document: Mapping[str, Any], field: str, what: str) -> Concurrency | None:
    if field not in document:
        return None
    try:
        return parse_concurrency(document[field], field)
    except FlowError as error:
        raise PlanError("limit", f"{what} {error}") from None


def _workflow_limit_from_json(workflow: Mapping[str, Any], what: str) -> Concurrency | None:
    if "max_running" in workflow and "concurrency" in workflow:
        raise PlanError("limit", f"{what} states both max_running and concurrency")
    if "max_running" in workflow:
        return _limit_from_json(workflow, "max_running", what)
    return _limit_from_json(workflow, "concurrency", what)


def _notify_from_json(workflow: Mapping[str, Any], what: str) -> tuple[NotifyRule, ...]:
    if "notify" not in workflow:
        return ()
    rules = plan_notify(workflow["notify"])
    if not rules:  # absent when there are none: one document per revision
        raise PlanError("not_canonical", f"{what} states an empty notify")
    return rules


def _schedules_from_json(value: object, what: str) -> tuple[ScheduleSpec, ...]:
    try:
        return validate_schedules(
            value, "revision", None, f"{what} schedules", default_overlap=STORED_OVERLAP
        )
    except ScheduleSpecError as error:
        raise PlanError("schedule", str(error)) from None
