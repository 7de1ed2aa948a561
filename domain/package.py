"""Pure model of a package's materialized revision and its publication (SPEC §3, §11).

A *materialized revision* is one installation's package content at one
generation: its Tasks (with source digests) and Workflows. A *publication*
makes a revision startable; it names the revision by id and digest and carries
the semantic digest of every Workflow, which an execution plan must match.

Everything here is pure: file contents arrive already digested, and every id
and digest is a function of the inputs.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, NoReturn

import orjson

from domain.canonical import DIGEST_PREFIX, MAX_SAFE_INTEGER, domain_digest, is_digest
from domain.errors import PlanError

MAX_WORKFLOW_STEPS = 128

REVISION_SCHEMA = "qlflow/materialized-revision@v1"
PUBLICATION_SCHEMA = "qlflow/publication@v1"
TASK_SOURCE_DOMAIN = "qlflow/task-source@v1"
WORKFLOW_DOMAIN = "qlflow/workflow-semantic@v1"
LOCK_DOMAIN = "qlflow/package-lock@v1"
PUBLICATION_ID_DOMAIN = "qlflow/publication-id@v1"
REVISION_ID_PREFIX = "rev:"
PUBLICATION_ID_PREFIX = "pub:"

# Package, Task, Workflow and Step names. No "@" or "#": they build task refs.
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
# Ids that appear in stream ids and event ids: at most 36 characters.
ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9:._-]{0,35}")
# Project and installation identifiers.
IDENTIFIER_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9:._-]{0,127}")
_HEX_DIGEST = re.compile(r"[0-9a-f]{64}")
_MAX_PATH_CHARS = 1024
_PLACEHOLDER_DIGEST = DIGEST_PREFIX + "0" * 64


# --- field checks shared with domain.plan -------------------------------------------------


def refuse_type(value: object, what: str, expected: str) -> NoReturn:
    """Raise PlanError("float") for a float, else PlanError("type")."""
    if isinstance(value, float):
        raise PlanError("float", f"{what} is the float {value!r}; only integers are allowed")
    raise PlanError("type", f"{what} must be {expected}, not {type(value).__name__}")


def check_text(value: object, pattern: re.Pattern[str], rule: str, what: str) -> str:
    """Return `value` if it is a str fully matching `pattern`; else PlanError(rule)."""
    if not isinstance(value, str):
        refuse_type(value, what, "a string")
    if pattern.fullmatch(value) is None:
        raise PlanError(rule, f"{what} {value!r} must match {pattern.pattern}")
    return value


def check_name(value: object, rule: str, what: str) -> str:
    """A package, Task, Workflow or Step name: 1-64 of [A-Za-z0-9_-], alphanumeric first."""
    return check_text(value, NAME_PATTERN, rule, what)


def check_id(value: object, rule: str, what: str) -> str:
    """An id used in stream or event ids: 1-36 of [A-Za-z0-9:._-], alphanumeric first."""
    return check_text(value, ID_PATTERN, rule, what)


def check_digest(value: object, rule: str, what: str) -> str:
    """A digest: "sha256:" and 64 lowercase hex digits."""
    if not isinstance(value, str):
        refuse_type(value, what, "a digest string")
    if not is_digest(value):
        raise PlanError(rule, f"{what} {value!r} must be sha256:<64 lowercase hex>")
    return value


def check_positive_int(value: object, rule: str, what: str) -> int:
    """An integer from 1 to 2**53 - 1; a bool is not an integer."""
    if isinstance(value, bool) or not isinstance(value, int):
        refuse_type(value, what, "an integer")
    if not 1 <= value <= MAX_SAFE_INTEGER:
        raise PlanError(rule, f"{what} must be a positive integer up to 2**53 - 1, not {value}")
    return value


def check_bool(value: object, what: str) -> bool:
    """A real bool (0 and 1 are not)."""
    if not isinstance(value, bool):
        refuse_type(value, what, "a bool")
    return value


def check_list(value: object, what: str) -> Sequence[Any]:
    """A list or tuple (never a str, which is also a sequence)."""
    if not isinstance(value, (list, tuple)):
        refuse_type(value, what, "a list")
    return value


def check_mapping(value: object, what: str) -> Mapping[str, Any]:
    """A mapping whose keys are all str."""
    if not isinstance(value, Mapping):
        refuse_type(value, what, "an object")
    for key in value:
        if not isinstance(key, str):
            raise PlanError("type", f"{what} has the non-string key {key!r}")
    return value


def check_fields(
    value: Mapping[str, Any], required: Iterable[str], what: str, optional: Iterable[str] = ()
) -> None:
    """Refuse unknown fields ("unknown_field") and missing ones ("missing_field")."""
    required = set(required)
    allowed = required | set(optional)
    unknown = sorted(set(value) - allowed)
    if unknown:
        raise PlanError("unknown_field", f"{what} has unknown field(s) {', '.join(unknown)}")
    missing = sorted(required - set(value))
    if missing:
        raise PlanError("missing_field", f"{what} lacks field(s) {', '.join(missing)}")


def check_file_path(value: object, what: str) -> str:
    """A relative POSIX path inside the package folder."""
    if not isinstance(value, str):
        refuse_type(value, what, "a path string")
    segments = value.split("/")
    if (
        not value
        or len(value) > _MAX_PATH_CHARS
        or value.startswith("/")
        or "\\" in value
        or "\x00" in value
        or any(segment in ("", ".", "..") for segment in segments)
    ):
        raise PlanError(
            "task_files", f"{what} {value!r} must be a relative path inside the package folder"
        )
    return value


# --- graph ----------------------------------------------------------------------------


def find_cycle(needs_by_key: Mapping[str, Sequence[str]]) -> list[str] | None:
    """Return one dependency cycle as a path [a, b, ..., a], or None if acyclic.

    Edges run from a Step to the Steps it needs; needs naming no key are ignored.
    The search visits keys in sorted order, so the reported cycle is deterministic.
    """
    visiting: set[str] = set()
    done: set[str] = set()
    path: list[str] = []

    def visit(key: str) -> list[str] | None:
        visiting.add(key)
        path.append(key)
        for need in sorted(set(needs_by_key[key])):
            if need in visiting:
                return [*path[path.index(need) :], need]
            if need in needs_by_key and need not in done:
                cycle = visit(need)
                if cycle is not None:
                    return cycle
        path.pop()
        visiting.discard(key)
        done.add(key)
        return None

    for key in sorted(needs_by_key):
        if key not in done:
            cycle = visit(key)
            if cycle is not None:
                return cycle
    return None


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
        unknown = sorted(set(needs) - needs_by_key.keys())
        if unknown:
            raise PlanError(
                "unknown_need", f"{what}: Step {key!r} needs unknown Step(s) {', '.join(unknown)}"
            )
    cycle = find_cycle(needs_by_key)
    if cycle is not None:
        raise PlanError("cycle", f"{what} has a dependency cycle: {' -> '.join(cycle)}")


# --- Tasks ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TaskDefinition:
    """A Task of a revision. `env` is a sorted tuple of (name, value) pairs and
    `files` a sorted tuple of the package files the Task names; `source_digest`
    covers the definition and those files' contents (see `task_source_digest`)."""

    task_id: str
    command: tuple[str, ...]
    source_digest: str
    enabled: bool = True
    env: tuple[tuple[str, str], ...] = ()
    files: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        what = f"Task {self.task_id!r}"
        check_name(self.task_id, "task_id", "Task id")
        object.__setattr__(self, "command", _command(self.command, what))
        check_digest(self.source_digest, "source_digest", f"{what} source_digest")
        check_bool(self.enabled, f"{what} enabled")
        object.__setattr__(self, "env", _env_pairs(self.env, what))
        files = tuple(check_file_path(p, f"{what} file") for p in check_list(self.files, what))
        if len(set(files)) != len(files):
            raise PlanError("task_files", f"{what} names a file twice")
        object.__setattr__(self, "files", tuple(sorted(files)))

    @property
    def environment(self) -> Mapping[str, str]:
        """The Task's environment as a read-only mapping."""
        return MappingProxyType(dict(self.env))

    def definition(self) -> dict[str, Any]:
        """The definition document `task_source_digest` hashes (no id, no enabled flag:
        two Tasks that run the same thing from the same files have the same source)."""
        return {"command": list(self.command), "env": dict(self.env), "files": list(self.files)}


def _command(value: object, what: str) -> tuple[str, ...]:
    parts = check_list(value, f"{what} command")
    if not parts:
        raise PlanError("task_command", f"{what} command is empty")
    for part in parts:
        if not isinstance(part, str):
            refuse_type(part, f"{what} command part", "a string")
        if "\x00" in part:
            raise PlanError("task_command", f"{what} command holds a NUL character")
    if not parts[0]:
        raise PlanError("task_command", f"{what} command names no program")
    return tuple(parts)


def _env_pairs(value: object, what: str) -> tuple[tuple[str, str], ...]:
    if isinstance(value, Mapping):
        items = list(value.items())
    else:
        items = []
        for pair in check_list(value, f"{what} env"):
            if not isinstance(pair, (list, tuple)) or len(pair) != 2:
                raise PlanError("type", f"{what} env must be a mapping or (name, value) pairs")
            items.append((pair[0], pair[1]))
    names = set()
    for name, text in items:
        if not isinstance(name, str):
            refuse_type(name, f"{what} env name", "a string")
        if not isinstance(text, str):
            refuse_type(text, f"{what} env {name}", "a string")
        if not name or "=" in name or "\x00" in name or "\x00" in text:
            raise PlanError("task_env", f"{what} env name {name!r} or its value is malformed")
        if name in names:
            raise PlanError("task_env", f"{what} env sets {name!r} twice")
        names.add(name)
    return tuple(sorted(items))


def task_source_digest(definition: Mapping[str, Any], file_digests: Mapping[str, str]) -> str:
    """Digest of a Task's definition document and the contents of the files it names.

    `file_digests` maps each named path to the SHA-256 of its bytes (64 hex digits,
    with or without the "sha256:" prefix). When the definition has a "files" list,
    `file_digests` must cover exactly those paths (rule "task_files").
    """
    check_mapping(definition, "Task definition")
    check_mapping(file_digests, "file digests")
    files: dict[str, str] = {}
    for path, digest in file_digests.items():
        check_file_path(path, "digested file")
        if isinstance(digest, str) and _HEX_DIGEST.fullmatch(digest):
            digest = DIGEST_PREFIX + digest
        files[path] = check_digest(digest, "file_digest", f"digest of file {path!r}")
    if "files" in definition:
        named = {check_file_path(p, "named file") for p in check_list(definition["files"], "files")}
        if named != files.keys():
            missing = sorted(named - files.keys())
            extra = sorted(files.keys() - named)
            raise PlanError(
                "task_files",
                f"file digests must cover exactly the named files (missing {missing}, "
                f"not named {extra})",
            )
    return domain_digest(TASK_SOURCE_DOMAIN, {"definition": definition, "files": files})


def define_task(
    task_id: str,
    command: Sequence[str],
    *,
    file_digests: Mapping[str, str] | None = None,
    env: Mapping[str, str] | None = None,
    files: Sequence[str] = (),
    enabled: bool = True,
) -> TaskDefinition:
    """Build a TaskDefinition whose source digest covers `command`, `env`, `files`
    and `file_digests` (path -> SHA-256 hex of the file's bytes)."""
    draft = TaskDefinition(
        task_id=task_id,
        command=command,
        source_digest=_PLACEHOLDER_DIGEST,
        enabled=enabled,
        env=env if env is not None else (),
        files=files,
    )
    digest = task_source_digest(draft.definition(), file_digests or {})
    return dataclasses.replace(draft, source_digest=digest)


# --- Workflows ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WorkflowStepDefinition:
    """A Step of a Workflow: runs `task` after every Step in `needs` succeeded."""

    key: str
    task: str
    needs: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        check_name(self.key, "step_key", "Step key")
        check_name(self.task, "task_id", f"Step {self.key!r} task")
        needs = check_list(self.needs, f"Step {self.key!r} needs")
        for need in needs:
            check_name(need, "step_key", f"Step {self.key!r} need")
        object.__setattr__(self, "needs", tuple(needs))


@dataclass(frozen=True, slots=True)
class WorkflowDefinition:
    """A Workflow of a revision: a DAG of Steps, an optional aggregate timeout."""

    key: str
    steps: tuple[WorkflowStepDefinition, ...]
    timeout_ms: int | None = None
    enabled: bool = True

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
    `check_step_graph`, then every Step's Task exists ("unknown_task")."""
    what = f"Workflow {workflow.key!r}"
    check_step_graph([(step.key, step.needs) for step in workflow.steps], what)
    for step in workflow.steps:
        if step.task not in tasks:
            raise PlanError(
                "unknown_task",
                f"{what}: Step {step.key!r} uses Task {step.task!r}, which is not in the revision",
            )


def workflow_semantic_digest(
    workflow: WorkflowDefinition, tasks: Mapping[str, TaskDefinition]
) -> str:
    """Digest of what a Workflow does: its key, timeout, Steps (key, Task, sorted
    needs) and the source digest of each Task it uses (null for a missing Task).
    Step order and the enabled flag do not change it."""
    steps = [
        {
            "key": step.key,
            "task": step.task,
            "needs": sorted(step.needs),
            "source_digest": tasks[step.task].source_digest if step.task in tasks else None,
        }
        for step in workflow.steps
    ]
    steps.sort(key=lambda step: (step["key"], orjson.dumps(step, option=orjson.OPT_SORT_KEYS)))
    document = {"key": workflow.key, "timeout_ms": workflow.timeout_ms, "steps": steps}
    return domain_digest(WORKFLOW_DOMAIN, document)


# --- Revisions ------------------------------------------------------------------------


def _frozen_by_key(
    value: object, kind: type, key_of: str, duplicate_rule: str, what: str
) -> Mapping[str, Any]:
    if isinstance(value, Mapping):
        pairs = list(value.items())
    else:
        pairs = [(getattr(item, key_of, None), item) for item in check_list(value, what)]
    result: dict[str, Any] = {}
    for key, item in pairs:
        if not isinstance(item, kind):
            refuse_type(item, f"{what} entry", f"a {kind.__name__}")
        if key != getattr(item, key_of):
            raise PlanError("type", f"{what} key {key!r} differs from {getattr(item, key_of)!r}")
        if key in result:
            raise PlanError(duplicate_rule, f"{what} has {key!r} twice")
        result[key] = item
    return MappingProxyType(dict(sorted(result.items())))


@dataclass(frozen=True, slots=True)
class MaterializedRevision:
    """One installation's package content at one generation. Build it with
    `materialize_revision` (or `revision_from_json`), which compute its lock digest,
    id and digest; `tasks` and `workflows` are read-only mappings sorted by key."""

    project: str
    package: str
    installation: str
    lock_digest: str
    generation: int
    revision_id: str
    revision_digest: str
    tasks: Mapping[str, TaskDefinition]
    workflows: Mapping[str, WorkflowDefinition]

    def __post_init__(self) -> None:
        check_text(self.project, IDENTIFIER_PATTERN, "project", "project")
        check_name(self.package, "package", "package")
        check_text(self.installation, IDENTIFIER_PATTERN, "installation", "installation")
        check_digest(self.lock_digest, "lock_digest", "lock_digest")
        check_positive_int(self.generation, "generation", "generation")
        check_id(self.revision_id, "revision_id", "revision_id")
        check_digest(self.revision_digest, "revision_digest", "revision_digest")
        tasks = _frozen_by_key(self.tasks, TaskDefinition, "task_id", "duplicate_task", "tasks")
        workflows = _frozen_by_key(
            self.workflows, WorkflowDefinition, "key", "duplicate_workflow", "workflows"
        )
        object.__setattr__(self, "tasks", tasks)
        object.__setattr__(self, "workflows", workflows)

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
    return {
        "command": list(task.command),
        "enabled": task.enabled,
        "env": dict(task.env),
        "files": list(task.files),
        "source_digest": task.source_digest,
    }


def _workflow_document(workflow: WorkflowDefinition) -> dict[str, Any]:
    return {
        "enabled": workflow.enabled,
        "timeout_ms": workflow.timeout_ms,
        "steps": [
            {"key": step.key, "task": step.task, "needs": list(step.needs)}
            for step in workflow.steps
        ],
    }


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
    return REVISION_ID_PREFIX + digest[len(DIGEST_PREFIX) : len(DIGEST_PREFIX) + 32]


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
        lock_digest=_PLACEHOLDER_DIGEST,
        generation=generation,
        revision_id=REVISION_ID_PREFIX + "0" * 32,
        revision_digest=_PLACEHOLDER_DIGEST,
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
_WORKFLOW_FIELDS = ("enabled", "timeout_ms", "steps")
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
    document = check_mapping(_loads(value), "revision")
    check_fields(document, _REVISION_FIELDS, "revision")
    if document["schema"] != REVISION_SCHEMA:
        raise PlanError("schema", f"revision schema must be {REVISION_SCHEMA!r}")
    tasks = []
    for task_id, raw in check_mapping(document["tasks"], "revision tasks").items():
        what = f"revision Task {task_id!r}"
        task = check_mapping(raw, what)
        check_fields(task, _TASK_FIELDS, what)
        tasks.append(
            TaskDefinition(
                task_id=task_id,
                command=task["command"],
                source_digest=task["source_digest"],
                enabled=task["enabled"],
                env=check_mapping(task["env"], f"{what} env"),
                files=task["files"],
            )
        )
    workflows = []
    for key, raw in check_mapping(document["workflows"], "revision workflows").items():
        what = f"revision Workflow {key!r}"
        workflow = check_mapping(raw, what)
        check_fields(workflow, _WORKFLOW_FIELDS, what)
        steps = []
        for raw_step in check_list(workflow["steps"], f"{what} steps"):
            step = check_mapping(raw_step, f"{what} step")
            check_fields(step, _STEP_FIELDS, f"{what} step")
            steps.append(WorkflowStepDefinition(step["key"], step["task"], step["needs"]))
        workflows.append(
            WorkflowDefinition(
                key=key,
                steps=tuple(steps),
                timeout_ms=workflow["timeout_ms"],
                enabled=workflow["enabled"],
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
    _same(document["lock_digest"], revision.lock_digest, "lock_digest", "revision")
    _same(document["revision_digest"], revision.revision_digest, "revision_digest", "revision")
    _same(document["revision_id"], revision.revision_id, "revision_id", "revision")
    if revision_to_json(revision) != document:
        raise PlanError("revision", "revision JSON is not in its canonical form")
    return revision


# --- Publications ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PublicationRef:
    """A publication of one revision by one publisher. `workflow_digests` maps each
    Workflow key to its semantic digest (read-only, sorted by key)."""

    publication_id: str
    publication_digest: str
    publisher: str
    project: str
    package: str
    installation: str
    lock_digest: str
    generation: int
    revision_id: str
    revision_digest: str
    workflow_digests: Mapping[str, str]

    def __post_init__(self) -> None:
        check_id(self.publication_id, "publication_id", "publication_id")
        check_digest(self.publication_digest, "publication_digest", "publication_digest")
        check_id(self.publisher, "publisher", "publisher")
        check_text(self.project, IDENTIFIER_PATTERN, "project", "project")
        check_name(self.package, "package", "package")
        check_text(self.installation, IDENTIFIER_PATTERN, "installation", "installation")
        check_digest(self.lock_digest, "lock_digest", "lock_digest")
        check_positive_int(self.generation, "generation", "generation")
        check_id(self.revision_id, "revision_id", "revision_id")
        check_digest(self.revision_digest, "revision_digest", "revision_digest")
        digests = check_mapping(self.workflow_digests, "workflow_digests")
        for key, digest in digests.items():
            check_name(key, "workflow_key", "workflow_digests key")
            check_digest(digest, "workflow_digest", f"workflow_digests[{key!r}]")
        frozen = MappingProxyType(dict(sorted(digests.items())))
        object.__setattr__(self, "workflow_digests", frozen)

    def __hash__(self) -> int:
        return hash((self.publication_id, self.publication_digest))


def publication_id_for(package: str, generation: int, digest: str) -> str:
    """The publication id of `package` at `generation` with revision digest `digest`:
    "pub:" and 32 hex digits (36 characters, fit for stream ids)."""
    derived = domain_digest(PUBLICATION_ID_DOMAIN, [package, generation, digest])
    return PUBLICATION_ID_PREFIX + derived[len(DIGEST_PREFIX) : len(DIGEST_PREFIX) + 32]


def publication_digest(publication: PublicationRef) -> str:
    """Recompute the digest of `publication` from its other fields."""
    document = publication_to_json(publication)
    del document["publication_digest"]
    return domain_digest(PUBLICATION_SCHEMA, document)


def check_publication(publication: PublicationRef) -> None:
    """Refuse a publication whose id ("publication_id") or digest
    ("publication_digest") does not match its fields."""
    expected_id = publication_id_for(
        publication.package, publication.generation, publication.revision_digest
    )
    _same(publication.publication_id, expected_id, "publication_id", "publication")
    _same(
        publication.publication_digest,
        publication_digest(publication),
        "publication_digest",
        "publication",
    )


def publication_for(revision: MaterializedRevision, publisher: str) -> PublicationRef:
    """The publication of `revision` by `publisher`, with every Workflow's semantic digest."""
    draft = PublicationRef(
        publication_id=publication_id_for(
            revision.package, revision.generation, revision.revision_digest
        ),
        publication_digest=_PLACEHOLDER_DIGEST,
        publisher=publisher,
        project=revision.project,
        package=revision.package,
        installation=revision.installation,
        lock_digest=revision.lock_digest,
        generation=revision.generation,
        revision_id=revision.revision_id,
        revision_digest=revision.revision_digest,
        workflow_digests={
            key: workflow_semantic_digest(workflow, revision.tasks)
            for key, workflow in revision.workflows.items()
        },
    )
    return dataclasses.replace(draft, publication_digest=publication_digest(draft))


_PUBLICATION_FIELDS = (
    "schema", "publication_id", "publication_digest", "publisher", "project", "package",
    "installation", "lock_digest", "generation", "revision_id", "revision_digest",
    "workflow_digests",
)  # fmt: skip


def publication_to_json(publication: PublicationRef) -> dict[str, Any]:
    """The publication as a JSON-able dict; `publication_from_json` rebuilds it."""
    return {
        "schema": PUBLICATION_SCHEMA,
        "publication_id": publication.publication_id,
        "publication_digest": publication.publication_digest,
        "publisher": publication.publisher,
        "project": publication.project,
        "package": publication.package,
        "installation": publication.installation,
        "lock_digest": publication.lock_digest,
        "generation": publication.generation,
        "revision_id": publication.revision_id,
        "revision_digest": publication.revision_digest,
        "workflow_digests": dict(publication.workflow_digests),
    }


def publication_from_json(value: object) -> PublicationRef:
    """Strictly rebuild a publication (dict, JSON text or bytes), refusing unknown or
    missing fields, wrong types and an id or digest that does not match."""
    document = check_mapping(_loads(value), "publication")
    check_fields(document, _PUBLICATION_FIELDS, "publication")
    if document["schema"] != PUBLICATION_SCHEMA:
        raise PlanError("schema", f"publication schema must be {PUBLICATION_SCHEMA!r}")
    publication = PublicationRef(**{k: v for k, v in document.items() if k != "schema"})
    check_publication(publication)
    return publication


def _loads(value: object) -> object:
    if isinstance(value, (bytes, str)):
        try:
            return orjson.loads(value)
        except orjson.JSONDecodeError as error:
            raise PlanError("json", f"not valid JSON: {error}") from None
    return value


def _same(stated: object, computed: str, rule: str, what: str) -> None:
    if stated != computed:
        raise PlanError(rule, f"{what} states {rule} {stated!r} but its content gives {computed!r}")
