"""Validation of a package manifest: the parsed `qlflow.toml` of a package folder.

Pure: `parse_manifest` takes the file's text, `validate_manifest` a parsed dict
(the shape `tomllib` returns). Either returns a `Manifest` or raises
`ManifestError` naming the file, the table and the key that is wrong, e.g.

    qlflow.toml: [workflows.nightly] steps[1].task: unknown task 'archiv' (tasks: archive, fetch)

Files a Task names. In a package folder `files` is a list of relative paths; the
loader reads and hashes them. A manifest dict has no folder to read from, so
there `files` is a table `{relative path = "sha256:<64 hex>"}` giving each file's
digest (the SHA-256 of its bytes), or is left out. The other form is refused in
each case, so a Task's source digest never silently leaves out a file.
"""

from __future__ import annotations

import dataclasses
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from domain.canonical import MAX_SAFE_INTEGER, is_digest
from domain.errors import InvalidInput, PlanError
from domain.flow import (
    DEFAULT_PRIORITY,
    Concurrency,
    FlowError,
    parse_concurrency,
    priority_problem,
    template_params,
)
from domain.graph import DependencyCycle, UnknownNeed, topological_order
from domain.manifest_checks import (
    IDENTIFIER_RULE,
    NAME_RULE,
    PUBLISHER_RULE,
    bool_at,
    describe,
    kind_of,
    manifest_error,
    name_at,
    optional_name,
    refuse_unknown_keys,
    relative_path_at,
    required_name,
    table_at,
    text_at,
)
from domain.manifest_v2 import params_at, retry_at
from domain.notify import NotifyError, NotifyRule, parse_notify
from domain.params import ParamDefinition, bind_params
from domain.python_tasks import files_problem, isolation_problem, parse_target, target_problem
from domain.retry import RetryPolicy
from domain.revision import MaterializedRevision, materialize_revision
from domain.schedule_spec import ScheduleSpec, validate_schedules
from domain.step_timeouts import timeout_problem
from domain.tasks import ON_INTERRUPT, ON_INTERRUPT_DEFAULT, define_task
from domain.workflows import MAX_WORKFLOW_STEPS, WorkflowDefinition, WorkflowStepDefinition

ENV_NAME_PATTERN = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
DEFAULT_PROJECT = "default"
MANIFEST_FILE = "qlflow.toml"
DICT_SOURCE = "<manifest dict>"

TOP_LEVEL_KEYS = ("package", "tasks", "workflows")
PACKAGE_KEYS = ("name", "publisher", "project", "installation")
TASK_KEYS = (
    "command", "python", "isolation", "env", "files", "enabled", "on_interrupt", "concurrency",
    "timeout_ms",
)  # fmt: skip
WORKFLOW_KEYS = (
    "steps", "timeout_ms", "enabled", "schedules", "params", "notify", "max_running",
    "concurrency", "priority",
)  # fmt: skip
STEP_KEYS = ("key", "task", "needs", "retry", "timeout_ms")
MAX_TIMEOUT_MS = MAX_SAFE_INTEGER


@dataclass(frozen=True, slots=True)
class PackageInfo:
    """The `[package]` table with its defaults applied."""

    name: str
    publisher: str
    project: str
    installation: str


@dataclass(frozen=True, slots=True)
class TaskSpec:
    """One `[tasks.<id>]` table. `files` is sorted; `file_digests` maps each to its
    digest when the manifest gave them (manifest dict), else is empty. A python
    Task has `python` ("module:function") and an empty `command`."""

    task_id: str
    command: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    files: tuple[str, ...]
    file_digests: tuple[tuple[str, str], ...]
    enabled: bool
    python: str | None = None
    isolation: str | None = None
    on_interrupt: str = ON_INTERRUPT_DEFAULT
    concurrency: Concurrency | None = None  # docs/DESIGN.md "Flow control"
    # the default timeout of the steps that run it (docs/DESIGN.md "Step timeouts")
    timeout_ms: int | None = None


@dataclass(frozen=True, slots=True)
class StepSpec:
    """One entry of a Workflow's `steps`; `needs` is sorted; `timeout_ms` is the
    step's own, else its Task's (None: neither declares one)."""

    key: str
    task: str
    needs: tuple[str, ...]
    retry: RetryPolicy | None = None
    timeout_ms: int | None = None


@dataclass(frozen=True, slots=True)
class WorkflowSpec:
    """One `[workflows.<key>]` table; `steps` in manifest order."""

    key: str
    steps: tuple[StepSpec, ...]
    timeout_ms: int | None
    enabled: bool
    schedules: tuple[ScheduleSpec, ...] = ()
    params: tuple[ParamDefinition, ...] = ()
    notify: tuple[NotifyRule, ...] = ()
    limit: Concurrency | None = None  # max_running, or a keyed concurrency
    priority: int = DEFAULT_PRIORITY


@dataclass(frozen=True, slots=True)
class Manifest:
    """A validated manifest; `tasks` and `workflows` are sorted by id."""

    source: str
    package: PackageInfo
    tasks: tuple[TaskSpec, ...]
    workflows: tuple[WorkflowSpec, ...]

    def task(self, task_id: str) -> TaskSpec:
        for task in self.tasks:
            if task.task_id == task_id:
                return task
        raise KeyError(task_id)

    def workflow(self, key: str) -> WorkflowSpec:
        for workflow in self.workflows:
            if workflow.key == key:
                return workflow
        raise KeyError(key)


def parse_manifest(text: str, source: str = MANIFEST_FILE, *, folder: bool = True) -> Manifest:
    """Parse TOML text and validate it; a syntax error names its line and column."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise manifest_error(source, None, None, f"TOML syntax error: {error}") from None
    except RecursionError:
        raise manifest_error(source, None, None, "values are nested too deeply") from None
    return validate_manifest(raw, source, folder=folder)


def validate_manifest(
    raw: Mapping[str, Any], source: str = DICT_SOURCE, *, folder: bool = False
) -> Manifest:
    """Validate a parsed manifest. `folder` says whether `files` are paths to read
    (a package folder) or a table of given digests (a manifest dict)."""
    if not isinstance(raw, Mapping):
        raise manifest_error(source, None, None, f"a manifest is a table, not {kind_of(raw)}")
    refuse_unknown_keys(source, None, raw, TOP_LEVEL_KEYS, "table")
    if "package" not in raw:
        raise manifest_error(source, "package", None, "missing (it needs name and publisher)")
    package = _package(source, raw["package"])
    tasks_raw = table_at(source, None, "tasks", raw.get("tasks", {}))
    workflows_raw = table_at(source, None, "workflows", raw.get("workflows", {}))
    for task_id in tasks_raw:
        name_at(source, "tasks", task_id, task_id, "task id")
    for key in workflows_raw:
        name_at(source, "workflows", key, key, "workflow key")
    tasks = tuple(
        _task(source, task_id, tasks_raw[task_id], folder) for task_id in sorted(tasks_raw)
    )
    task_ids = tuple(task.task_id for task in tasks)
    workflows = tuple(
        _with_task_timeouts(source, _workflow(source, key, workflows_raw[key], task_ids), tasks)
        for key in sorted(workflows_raw)
    )
    _check_limit_keys(source, tasks, workflows)
    return Manifest(source=source, package=package, tasks=tasks, workflows=workflows)


def revision_from_manifest(
    manifest: Manifest,
    file_digests: Mapping[str, str] | None = None,
    generation: int = 1,
) -> MaterializedRevision:
    """Materialize a manifest's content at `generation`.

    `file_digests` maps each file path a Task names to the SHA-256 of its bytes
    (what the folder loader computed); a manifest dict's own `files` digests are
    used when it is None. Publishing re-materializes at the generation it assigns.
    """
    given = dict(file_digests or {})
    tasks = []
    for task in manifest.tasks:
        table = f"tasks.{task.task_id}"
        own = dict(task.file_digests)
        digests = {}
        for path in task.files:
            digest = given.get(path, own.get(path))
            if digest is None:
                raise manifest_error(
                    manifest.source, table, "files", f"no digest for file {path!r}"
                )
            digests[path] = digest
        try:
            tasks.append(
                define_task(
                    task.task_id,
                    task.command,
                    file_digests=digests,
                    env=dict(task.env),
                    files=task.files,
                    enabled=task.enabled,
                    python=task.python,
                    isolation=task.isolation,
                    on_interrupt=task.on_interrupt,
                    concurrency=task.concurrency,
                )
            )
        except PlanError as error:
            raise manifest_error(manifest.source, table, None, str(error)) from None
    workflows = [
        WorkflowDefinition(
            key=workflow.key,
            steps=tuple(
                WorkflowStepDefinition(
                    key=step.key,
                    task=step.task,
                    needs=step.needs,
                    retry=step.retry,
                    timeout_ms=step.timeout_ms,
                )
                for step in workflow.steps
            ),
            timeout_ms=workflow.timeout_ms,
            enabled=workflow.enabled,
            schedules=workflow.schedules,
            params=workflow.params,
            notify=workflow.notify,
            limit=workflow.limit,
            priority=workflow.priority,
        )
        for workflow in manifest.workflows
    ]
    package = manifest.package
    try:
        return materialize_revision(
            package.project, package.name, package.installation, generation, tasks, workflows
        )
    except PlanError as error:
        raise manifest_error(manifest.source, None, None, str(error)) from None


def _package(source: str, raw: Any) -> PackageInfo:
    table = "package"
    if not isinstance(raw, Mapping):
        raise manifest_error(source, None, "package", f"must be a table, not {kind_of(raw)}")
    refuse_unknown_keys(source, table, raw, PACKAGE_KEYS, "key")
    name = required_name(source, table, raw, "name", NAME_RULE)
    publisher = required_name(source, table, raw, "publisher", PUBLISHER_RULE)
    project = optional_name(source, table, raw, "project", DEFAULT_PROJECT, IDENTIFIER_RULE)
    installation = optional_name(source, table, raw, "installation", name, IDENTIFIER_RULE)
    return PackageInfo(name=name, publisher=publisher, project=project, installation=installation)


def _task(source: str, task_id: str, raw: Any, folder: bool) -> TaskSpec:
    table = f"tasks.{task_id}"
    name_at(source, "tasks", task_id, task_id, "task id")
    if not isinstance(raw, Mapping):
        raise manifest_error(source, None, table, f"must be a table, not {kind_of(raw)}")
    refuse_unknown_keys(source, table, raw, TASK_KEYS, "key")
    env = _env(source, table, raw.get("env", {}))
    files, digests = _files(source, table, raw.get("files"), folder)
    enabled = bool_at(source, table, "enabled", raw.get("enabled", True))
    timeout = _step_timeout(source, table, "timeout_ms", raw.get("timeout_ms"), None)
    on_interrupt = raw.get("on_interrupt", ON_INTERRUPT_DEFAULT)
    if on_interrupt not in ON_INTERRUPT:
        raise manifest_error(
            source,
            table,
            "on_interrupt",
            f"must be one of {', '.join(map(repr, ON_INTERRUPT))}, not {describe(on_interrupt)}",
        )
    concurrency = _concurrency(source, table, raw, "concurrency")
    if "python" in raw:
        task = _python_task(source, task_id, raw, env, files, digests, enabled, on_interrupt)
        return dataclasses.replace(task, concurrency=concurrency, timeout_ms=timeout)
    if "isolation" in raw:
        raise manifest_error(source, table, "isolation", "applies only to a python Task")
    if "command" not in raw:
        raise manifest_error(
            source,
            table,
            "command",
            'missing: a Task needs a command, e.g. ["python3", "x.py"], '
            'or python = "module:function"',
        )
    command = raw["command"]
    if not isinstance(command, list) or not command:
        raise manifest_error(
            source,
            table,
            "command",
            f"must be a non-empty list of strings, not {describe(command)}",
        )
    for index, part in enumerate(command):
        text_at(source, table, f"command[{index}]", part)
    if not command[0]:
        raise manifest_error(source, table, "command[0]", "the program must not be empty")
    return TaskSpec(
        task_id=task_id,
        command=tuple(command),
        env=env,
        files=files,
        file_digests=digests,
        enabled=enabled,
        on_interrupt=on_interrupt,
        concurrency=concurrency,
        timeout_ms=timeout,
    )


def _python_task(
    source: str,
    task_id: str,
    raw: Mapping[str, Any],
    env: tuple[tuple[str, str], ...],
    files: tuple[str, ...],
    digests: tuple[tuple[str, str], ...],
    enabled: bool,
    on_interrupt: str,
) -> TaskSpec:
    """A `[tasks.<id>]` table with `python = "module:function"` (nothing imported)."""
    table = f"tasks.{task_id}"
    if "command" in raw:
        raise manifest_error(source, table, "python", "a Task has a command or python, not both")
    if env:
        raise manifest_error(
            source,
            table,
            "env",
            "applies to a command Task; a python function is given ctx.params instead",
        )
    problem = target_problem(raw["python"])
    if problem is not None:
        raise manifest_error(source, table, "python", problem)
    target = parse_target(raw["python"])
    problem = files_problem(target, files)
    if problem is not None:
        raise manifest_error(source, table, "files", problem)
    isolation = raw.get("isolation")
    if isolation is not None:
        problem = isolation_problem(isolation)
        if problem is not None:
            raise manifest_error(source, table, "isolation", problem)
    return TaskSpec(
        task_id=task_id,
        command=(),
        env=env,
        files=files,
        file_digests=digests,
        enabled=enabled,
        python=target.text,
        isolation=isolation,
        on_interrupt=on_interrupt,
    )


def _env(source: str, table: str, raw: Any) -> tuple[tuple[str, str], ...]:
    if not isinstance(raw, Mapping):
        raise manifest_error(
            source, table, "env", f"must be a table of strings, not {kind_of(raw)}"
        )
    for name, value in raw.items():
        if not isinstance(name, str) or not ENV_NAME_PATTERN.fullmatch(name):
            raise manifest_error(
                source, table, f"env.{name}", "not a valid environment variable name"
            )
        text_at(source, table, f"env.{name}", value)
    return tuple(sorted(raw.items()))


def _files(
    source: str, table: str, raw: Any, folder: bool
) -> tuple[tuple[str, ...], tuple[tuple[str, str], ...]]:
    if raw is None:
        return (), ()
    if folder:
        if not isinstance(raw, list):
            raise manifest_error(
                source,
                table,
                "files",
                f"must be a list of relative paths, not {kind_of(raw)} "
                "(qlflow reads and hashes the files itself)",
            )
        paths = [relative_path_at(source, table, f"files[{i}]", p) for i, p in enumerate(raw)]
        digests: dict[str, str] = {}
    else:
        if not isinstance(raw, Mapping):
            raise manifest_error(
                source,
                table,
                "files",
                f'must be a table {{path = "sha256:<64 hex>"}}, not {kind_of(raw)}: '
                "a manifest dict has no folder to read files from, so give their digests "
                "(or publish the package folder)",
            )
        paths = [relative_path_at(source, table, f"files.{p!r}", p) for p in raw]
        digests = {}
        for path, digest in raw.items():
            if not is_digest(digest):
                raise manifest_error(
                    source,
                    table,
                    f"files.{path!r}",
                    f'must be "sha256:<64 hex>", not {describe(digest)}',
                )
            digests[path] = digest
    seen: set[str] = set()
    for path in paths:
        if path in seen:
            raise manifest_error(source, table, "files", f"names {path!r} twice")
        seen.add(path)
    return tuple(sorted(paths)), tuple(sorted(digests.items()))


def _workflow(source: str, key: str, raw: Any, task_ids: tuple[str, ...]) -> WorkflowSpec:
    table = f"workflows.{key}"
    name_at(source, "workflows", key, key, "workflow key")
    if not isinstance(raw, Mapping):
        raise manifest_error(source, None, table, f"must be a table, not {kind_of(raw)}")
    refuse_unknown_keys(source, table, raw, WORKFLOW_KEYS, "key")
    if "steps" not in raw:
        raise manifest_error(source, table, "steps", "missing: a Workflow needs at least one step")
    steps_raw = raw["steps"]
    if not isinstance(steps_raw, list) or not steps_raw:
        raise manifest_error(
            source, table, "steps", f"must be a non-empty list of tables, not {describe(steps_raw)}"
        )
    if len(steps_raw) > MAX_WORKFLOW_STEPS:
        raise manifest_error(
            source,
            table,
            "steps",
            f"has {len(steps_raw)} steps; at most {MAX_WORKFLOW_STEPS} are allowed",
        )
    timeout = raw.get("timeout_ms")
    if timeout is not None and (type(timeout) is not int or not 0 < timeout <= MAX_TIMEOUT_MS):
        raise manifest_error(
            source, table, "timeout_ms", f"must be a positive integer, not {describe(timeout)}"
        )
    steps = [
        _step(source, table, index, item, task_ids, timeout) for index, item in enumerate(steps_raw)
    ]
    indexes: dict[str, int] = {}
    for index, step in enumerate(steps):
        if step.key in indexes:
            raise manifest_error(
                source,
                table,
                f"steps[{index}].key",
                f"duplicate step key {step.key!r} (first at steps[{indexes[step.key]}])",
            )
        indexes[step.key] = index
    _check_graph(source, table, steps, indexes)
    enabled = bool_at(source, table, "enabled", raw.get("enabled", True))
    params = params_at(source, table, raw["params"]) if "params" in raw else ()
    schedules = validate_schedules(raw.get("schedules", []), source, table, "schedules")
    _check_schedule_params(source, table, schedules, params)
    try:
        notify = parse_notify(raw["notify"]) if "notify" in raw else ()
    except NotifyError as error:
        raise manifest_error(source, table, error.field, error.reason) from None
    return WorkflowSpec(
        key=key,
        steps=tuple(steps),
        timeout_ms=timeout,
        enabled=enabled,
        schedules=schedules,
        params=params,
        notify=notify,
        limit=_workflow_limit(source, table, raw),
        priority=_priority(source, table, raw),
    )


def _concurrency(source: str, table: str, raw: Mapping[str, Any], key: str) -> Concurrency | None:
    """A `concurrency` (or `max_running`) value, said at its key when wrong."""
    if key not in raw:
        return None
    try:
        return parse_concurrency(raw[key], key)
    except FlowError as error:
        raise manifest_error(source, table, error.field, error.reason) from None


def _workflow_limit(source: str, table: str, raw: Mapping[str, Any]) -> Concurrency | None:
    """A Workflow's one limit on its Runs: `max_running = N`, or `concurrency` (a
    count, or `{ limit, key }` for one set of slots per key value)."""
    if "max_running" in raw and "concurrency" in raw:
        raise manifest_error(
            source,
            table,
            "concurrency",
            "a Workflow takes max_running or concurrency, not both "
            "(max_running = N is concurrency = N)",
        )
    found = _concurrency(source, table, raw, "max_running")
    if found is not None and found.key is not None:
        raise manifest_error(
            source, table, "max_running", "is a count; for one per key say concurrency = {...}"
        )
    return found or _concurrency(source, table, raw, "concurrency")


def _priority(source: str, table: str, raw: Mapping[str, Any]) -> int:
    value = raw.get("priority", DEFAULT_PRIORITY)
    problem = priority_problem(value)
    if problem is not None:
        raise manifest_error(source, table, "priority", problem)
    assert isinstance(value, int)
    return value


def _check_limit_keys(
    source: str, tasks: tuple[TaskSpec, ...], workflows: tuple[WorkflowSpec, ...]
) -> None:
    """A limit's key names parameters of the Workflows it applies to: every Workflow
    that has a step of a Task with a keyed limit, and the Workflow's own."""
    keyed = {t.task_id: t.concurrency.key for t in tasks if t.concurrency and t.concurrency.key}
    for workflow in workflows:
        declared = {param.name for param in workflow.params}
        table = f"workflows.{workflow.key}"
        if workflow.limit is not None and workflow.limit.key is not None:
            for name in template_params(workflow.limit.key):
                if name not in declared:
                    raise manifest_error(
                        source,
                        table,
                        "concurrency.key",
                        f"names parameter {name!r}, which the Workflow does not declare",
                    )
        for index, step in enumerate(workflow.steps):
            template = keyed.get(step.task)
            for name in template_params(template) if template else ():
                if name not in declared:
                    raise manifest_error(
                        source,
                        f"tasks.{step.task}",
                        "concurrency.key",
                        f"names parameter {name!r}, which Workflow {workflow.key!r} "
                        f"(steps[{index}]) does not declare",
                    )


def _check_schedule_params(
    source: str,
    table: str,
    schedules: tuple[ScheduleSpec, ...],
    declared: tuple[ParamDefinition, ...],
) -> None:
    """A schedule's `params` must bind the Workflow's declarations as a start's would:
    an unknown name, a missing required one or a wrong type is refused at publish,
    naming `schedules[i].params.<name>`."""
    for index, schedule in enumerate(schedules):
        try:
            bind_params(declared, schedule.params_dict())
        except InvalidInput as error:
            key = f"schedules[{index}].{error.field}"
            raise manifest_error(source, table, key, str(error)) from None


def _step_timeout(
    source: str, table: str, key: str, raw: Any, workflow_timeout_ms: int | None
) -> int | None:
    """A step's or a Task's `timeout_ms` (None when not declared), refused naming
    `key` when it is below 1 s or above the Workflow's own timeout."""
    if raw is None:
        return None
    problem = timeout_problem(raw, workflow_timeout_ms)
    if problem is not None:
        raise manifest_error(source, table, key, problem)
    return int(raw)


def _with_task_timeouts(
    source: str, workflow: WorkflowSpec, tasks: tuple[TaskSpec, ...]
) -> WorkflowSpec:
    """Each step without a timeout of its own takes its Task's; a Task's timeout above
    the timeout of a Workflow that runs it is refused at the Task, naming both."""
    by_id = {task.task_id: task for task in tasks}
    steps = []
    for step in workflow.steps:
        inherited = by_id[step.task].timeout_ms
        if step.timeout_ms is None and inherited is not None:
            problem = timeout_problem(inherited, workflow.timeout_ms)
            if problem is not None:
                raise manifest_error(
                    source,
                    f"tasks.{step.task}",
                    "timeout_ms",
                    f"{problem} (Workflow {workflow.key!r}, step {step.key!r} runs it)",
                )
            step = dataclasses.replace(step, timeout_ms=inherited)
        steps.append(step)
    return dataclasses.replace(workflow, steps=tuple(steps))


def _step(
    source: str,
    table: str,
    index: int,
    raw: Any,
    task_ids: tuple[str, ...],
    workflow_timeout_ms: int | None = None,
) -> StepSpec:
    where = f"steps[{index}]"
    if not isinstance(raw, Mapping):
        raise manifest_error(source, table, where, f"must be a table, not {describe(raw)}")
    for name in raw:
        if name not in STEP_KEYS:
            raise manifest_error(
                source,
                table,
                f"{where}.{name}",
                f"unknown key (allowed: {', '.join(STEP_KEYS)})",
            )
    for name in ("key", "task"):
        if name not in raw:
            raise manifest_error(source, table, f"{where}.{name}", "missing")
    key = raw["key"]
    name_at(source, table, f"{where}.key", key, "step key")
    task = raw["task"]
    text_at(source, table, f"{where}.task", task)
    if task not in task_ids:
        known = ", ".join(task_ids) or "none"
        raise manifest_error(
            source, table, f"{where}.task", f"unknown task {task!r} (tasks: {known})"
        )
    needs = raw.get("needs", [])
    if not isinstance(needs, list):
        raise manifest_error(
            source, table, f"{where}.needs", f"must be a list of step keys, not {describe(needs)}"
        )
    for position, need in enumerate(needs):
        text_at(source, table, f"{where}.needs[{position}]", need)
    if len(set(needs)) != len(needs):
        raise manifest_error(source, table, f"{where}.needs", "names a step twice")
    retry = retry_at(source, table, where, raw["retry"]) if "retry" in raw else None
    timeout = _step_timeout(
        source, table, f"{where}.timeout_ms", raw.get("timeout_ms"), workflow_timeout_ms
    )
    return StepSpec(key=key, task=task, needs=tuple(sorted(needs)), retry=retry, timeout_ms=timeout)


def _check_graph(source: str, table: str, steps: list[StepSpec], indexes: dict[str, int]) -> None:
    """Every need names a step and no step needs itself, directly or not; a problem
    is said at the step that has it (`domain.graph` decides what is sound)."""
    try:
        topological_order({step.key: step.needs for step in steps})
    except UnknownNeed as problem:
        raise manifest_error(
            source,
            table,
            f"steps[{indexes[problem.step]}].needs",
            f"unknown step {problem.unknown[0]!r} (steps: {', '.join(sorted(indexes))})",
        ) from None
    except DependencyCycle as problem:
        first = problem.path[0]
        if len(problem.path) == 2:  # (a, a)
            raise manifest_error(
                source, table, f"steps[{indexes[first]}].needs", f"step {first!r} needs itself"
            ) from None
        raise manifest_error(
            source, table, "steps", f"cycle: {' -> '.join(problem.path)}"
        ) from None
