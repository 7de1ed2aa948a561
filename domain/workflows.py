"""A package's Workflows: DAGs of Steps, each running one Task of the revision.

`check_step_graph` holds the shape rules every Workflow and every execution plan
obeys (at most 128 Steps, unique keys and needs, a sound graph); the graph itself
is checked by `domain.graph`, and its problems are said here as PlanErrors.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import orjson

from domain.canonical import domain_digest
from domain.errors import PlanError
from domain.fields import check_bool, check_list, check_name, check_positive_int, refuse_type
from domain.flow import DEFAULT_PRIORITY, Concurrency, priority_problem
from domain.graph import DependencyCycle, UnknownNeed, topological_order
from domain.notify import NotifyRule
from domain.params import ParamDefinition, params_document
from domain.retry import RetryPolicy
from domain.schedule_spec import ScheduleSpec
from domain.step_timeouts import timeout_problem
from domain.tasks import TaskDefinition

MAX_WORKFLOW_STEPS = 128
WORKFLOW_DOMAIN = "qlflow/workflow-semantic@v1"


@dataclass(frozen=True, slots=True)
class WorkflowStepDefinition:
    """A Step of a Workflow: runs `task` after every Step in `needs` succeeded;
    `retry` (None: not declared) says how often a reported failure is retried, and
    `timeout_ms` (None: none) how long one Attempt may run (docs/DESIGN.md, "Step
    timeouts": the step's own or its Task's, resolved when the manifest is read)."""

    key: str
    task: str
    needs: tuple[str, ...] = ()
    retry: RetryPolicy | None = None
    timeout_ms: int | None = None

    def __post_init__(self) -> None:
        check_name(self.key, "step_key", "Step key")
        check_name(self.task, "task_id", f"Step {self.key!r} task")
        needs = check_list(self.needs, f"Step {self.key!r} needs")
        for need in needs:
            check_name(need, "step_key", f"Step {self.key!r} need")
        object.__setattr__(self, "needs", tuple(needs))
        if self.retry is not None and not isinstance(self.retry, RetryPolicy):
            refuse_type(self.retry, f"Step {self.key!r} retry", "a RetryPolicy")


@dataclass(frozen=True, slots=True)
class WorkflowDefinition:
    """A Workflow of a revision: a DAG of Steps, an optional aggregate timeout, the
    parameters a start gives (sorted by name) and the schedules that start it
    (docs/DESIGN.md, "Schedules")."""

    key: str
    steps: tuple[WorkflowStepDefinition, ...]
    timeout_ms: int | None = None
    enabled: bool = True
    schedules: tuple[ScheduleSpec, ...] = ()
    params: tuple[ParamDefinition, ...] = ()
    notify: tuple[NotifyRule, ...] = ()  # docs/DESIGN.md "Notifications"
    # docs/DESIGN.md "Flow control": how many Runs may run at once (per key value), and
    # the priority its Runs start with
    limit: Concurrency | None = None
    priority: int = DEFAULT_PRIORITY

    def __post_init__(self) -> None:
        check_name(self.key, "workflow_key", "Workflow key")
        steps = check_list(self.steps, f"Workflow {self.key!r} steps")
        for step in steps:
            if not isinstance(step, WorkflowStepDefinition):
                refuse_type(step, f"Workflow {self.key!r} step", "a WorkflowStepDefinition")
        object.__setattr__(self, "steps", tuple(steps))
        if self.timeout_ms is not None:
            check_positive_int(self.timeout_ms, "timeout_ms", f"Workflow {self.key!r} timeout_ms")
        check_bool(self.enabled, f"Workflow {self.key!r} enabled")
        schedules = check_list(self.schedules, f"Workflow {self.key!r} schedules")
        for schedule in schedules:
            if not isinstance(schedule, ScheduleSpec):
                refuse_type(schedule, f"Workflow {self.key!r} schedule", "a ScheduleSpec")
        object.__setattr__(self, "schedules", tuple(schedules))
        params = check_list(self.params, f"Workflow {self.key!r} params")
        for param in params:
            if not isinstance(param, ParamDefinition):
                refuse_type(param, f"Workflow {self.key!r} param", "a ParamDefinition")
        object.__setattr__(self, "params", tuple(sorted(params, key=lambda p: p.name)))
        notify = check_list(self.notify, f"Workflow {self.key!r} notify")
        for rule in notify:
            if not isinstance(rule, NotifyRule):
                refuse_type(rule, f"Workflow {self.key!r} notify rule", "a NotifyRule")
        object.__setattr__(self, "notify", tuple(notify))
        if self.limit is not None and not isinstance(self.limit, Concurrency):
            refuse_type(self.limit, f"Workflow {self.key!r} limit", "a Concurrency")
        problem = priority_problem(self.priority)
        if problem is not None:
            raise PlanError("priority", f"Workflow {self.key!r} priority {problem}")

    @property
    def step_keys(self) -> tuple[str, ...]:
        """Step keys in definition order."""
        return tuple(step.key for step in self.steps)

    def step(self, key: str) -> WorkflowStepDefinition:
        """The Step with `key`; KeyError if there is none."""
        for step in self.steps:
            if step.key == key:
                return step
        raise KeyError(key)


def check_workflow(workflow: WorkflowDefinition, tasks: Mapping[str, TaskDefinition]) -> None:
    """Structural rules of a Workflow within its revision: the graph rules of
    `check_step_graph`, then every Step's Task exists ("unknown_task") and its
    timeout is one (`domain.step_timeouts.timeout_problem`, "step_timeout")."""
    what = f"Workflow {workflow.key!r}"
    check_step_graph([(step.key, step.needs) for step in workflow.steps], what)
    for step in workflow.steps:
        if step.task not in tasks:
            raise PlanError(
                "unknown_task",
                f"{what}: Step {step.key!r} uses Task {step.task!r}, which is not in the revision",
            )
        if step.timeout_ms is not None:
            problem = timeout_problem(step.timeout_ms, workflow.timeout_ms)
            if problem is not None:
                raise PlanError("step_timeout", f"{what}: Step {step.key!r} timeout_ms {problem}")


def workflow_semantic_digest(
    workflow: WorkflowDefinition, tasks: Mapping[str, TaskDefinition]
) -> str:
    """Digest of what a Workflow does: its key, timeout, Steps (key, Task, sorted
    needs) and the source digest of each Task it uses (null for a missing Task).
    Step order and the enabled flag do not change it. Parameters and retry
    policies count only where declared, so a Workflow without them keeps its v1
    digest."""
    steps = []
    for step in workflow.steps:
        entry: dict[str, object] = {
            "key": step.key,
            "task": step.task,
            "needs": sorted(step.needs),
            "source_digest": tasks[step.task].source_digest if step.task in tasks else None,
        }
        if step.retry is not None:
            entry["retry"] = retry_document(step.retry)
        if step.timeout_ms is not None:  # only where declared: other digests stay
            entry["timeout_ms"] = step.timeout_ms
        steps.append(entry)
    steps.sort(key=lambda step: (step["key"], orjson.dumps(step, option=orjson.OPT_SORT_KEYS)))
    document: dict[str, object] = {
        "key": workflow.key,
        "timeout_ms": workflow.timeout_ms,
        "steps": steps,
    }
    if workflow.params:
        document["params"] = params_document(workflow.params)
    return domain_digest(WORKFLOW_DOMAIN, document)


def retry_document(policy: RetryPolicy) -> dict[str, int]:
    """A retry policy as JSON."""
    return {"max_attempts": policy.max_attempts, "backoff_ms": policy.backoff_ms}


def check_step_graph(steps: Sequence[tuple[str, Sequence[str]]], what: str) -> None:
    """Check Step keys and needs of one Workflow or plan: 1-128 Steps, unique keys,
    unique and known needs, no cycle. Rules: empty_workflow, too_many_steps,
    duplicate_step, duplicate_need, unknown_need, cycle."""
    if not steps:
        raise PlanError("empty_workflow", f"{what} has no Steps")
    if len(steps) > MAX_WORKFLOW_STEPS:
        raise PlanError(
            "too_many_steps", f"{what} has {len(steps)} Steps; at most {MAX_WORKFLOW_STEPS}"
        )
    needs_by_key: dict[str, Sequence[str]] = {}
    for key, needs in steps:
        if key in needs_by_key:
            raise PlanError("duplicate_step", f"{what} has two Steps with key {key!r}")
        needs_by_key[key] = needs
    for key, needs in steps:
        if len(set(needs)) != len(needs):
            raise PlanError("duplicate_need", f"{what}: Step {key!r} names a need twice")
    try:
        topological_order(dict(sorted(needs_by_key.items())))  # problems in key order
    except UnknownNeed as problem:
        unknown = ", ".join(sorted(problem.unknown))
        raise PlanError(
            "unknown_need", f"{what}: Step {problem.step!r} needs unknown Step(s) {unknown}"
        ) from None
    except DependencyCycle as problem:
        raise PlanError(
            "cycle", f"{what} has a dependency cycle: {' -> '.join(problem.path)}"
        ) from None
