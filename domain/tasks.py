"""A package's Tasks: what each runs, and the digest of its source.

A Task's source digest covers its command (or the Python function it names), its
environment and the contents of the files it names, so two Tasks that run the same
thing from the same bytes have the same source, whatever they are called. `python`
and `isolation` enter the digested definition only when declared, so a command
Task's digest is what it always was.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from domain.canonical import DIGEST_PREFIX, PLACEHOLDER_DIGEST, domain_digest
from domain.errors import PlanError
from domain.fields import (
    check_bool,
    check_digest,
    check_file_path,
    check_list,
    check_mapping,
    check_name,
    refuse_type,
)
from domain.flow import Concurrency
from domain.python_tasks import ISOLATION_PROCESS, files_problem, isolation_problem, parse_target

TASK_SOURCE_DOMAIN = "qlflow/task-source@v1"
# What an interruption by the step's host does (docs/DESIGN.md, "Interruptions"):
# requeue the step (the default) or fail it. Only "fail" is written down, so a Task
# that does not declare it keeps its definition and digests byte for byte.
ON_INTERRUPT = ("requeue", "fail")
ON_INTERRUPT_DEFAULT = "requeue"
_HEX_DIGEST = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True, slots=True, init=False)
class TaskDefinition:
    """A Task of a revision. `env` is a sorted tuple of (name, value) pairs and
    `files` a sorted tuple of the package files the Task names; `source_digest`
    covers the definition and those files' contents (see `task_source_digest`).

    The constructor checks every field and normalizes `command` and `files` (any
    list or tuple) and `env` (a mapping or (name, value) pairs). A Task runs either a
    command or, with `python` ("module.path:function", its module among `files`),
    a function; then `command` is empty and `isolation` is "process" or "thread"."""

    task_id: str
    command: tuple[str, ...]
    source_digest: str
    enabled: bool
    env: tuple[tuple[str, str], ...]
    files: tuple[str, ...]
    python: str | None
    isolation: str | None
    on_interrupt: str
    concurrency: Concurrency | None  # docs/DESIGN.md "Flow control"; not in the source digest

    def __init__(
        self,
        task_id: str,
        command: Sequence[str],
        source_digest: str,
        enabled: bool = True,
        env: Mapping[str, str] | Sequence[tuple[str, str]] = (),
        files: Sequence[str] = (),
        python: str | None = None,
        isolation: str | None = None,
        on_interrupt: str = ON_INTERRUPT_DEFAULT,
        concurrency: Concurrency | None = None,
    ) -> None:
        what = f"Task {task_id!r}"
        check_name(task_id, "task_id", "Task id")
        if python is None:
            checked_command = _command(command, what)
            if isolation is not None:
                raise PlanError("task_isolation", f"{what} isolation applies to python Tasks")
        elif list(check_list(command, f"{what} command")):
            raise PlanError("task_python", f"{what} has both a command and python")
        else:
            checked_command = ()
        check_digest(source_digest, "source_digest", f"{what} source_digest")
        check_bool(enabled, f"{what} enabled")
        checked_env = _env_pairs(env, what)
        checked_files = tuple(check_file_path(p, f"{what} file") for p in check_list(files, what))
        if len(set(checked_files)) != len(checked_files):
            raise PlanError("task_files", f"{what} names a file twice")
        if python is not None:
            problem = files_problem(parse_target(python, f"{what} python"), checked_files)
            if problem is not None:
                raise PlanError("task_files", f"{what} python: {problem}")
            if isolation is not None and isolation_problem(isolation) is not None:
                raise PlanError(
                    "task_isolation", f"{what} isolation {isolation_problem(isolation)}"
                )
        if on_interrupt not in ON_INTERRUPT:
            raise PlanError(
                "on_interrupt",
                f"{what} on_interrupt must be one of {ON_INTERRUPT}, not {on_interrupt!r}",
            )
        object.__setattr__(self, "task_id", task_id)
        object.__setattr__(self, "command", checked_command)
        object.__setattr__(self, "source_digest", source_digest)
        object.__setattr__(self, "enabled", enabled)
        object.__setattr__(self, "env", checked_env)
        object.__setattr__(self, "files", tuple(sorted(checked_files)))
        object.__setattr__(self, "python", python)
        object.__setattr__(self, "isolation", isolation)
        object.__setattr__(self, "on_interrupt", on_interrupt)
        if concurrency is not None and not isinstance(concurrency, Concurrency):
            refuse_type(concurrency, f"{what} concurrency", "a Concurrency")
        object.__setattr__(self, "concurrency", concurrency)

    @property
    def runs_python(self) -> bool:
        """Whether the Task is a Python function (else a command)."""
        return self.python is not None

    @property
    def isolation_mode(self) -> str:
        """Where a python Task runs: its declared isolation, else a pool process."""
        return self.isolation or ISOLATION_PROCESS

    @property
    def environment(self) -> Mapping[str, str]:
        """The Task's environment as a read-only mapping."""
        return MappingProxyType(dict(self.env))

    def definition(self) -> dict[str, Any]:
        """The definition document `task_source_digest` hashes (no id, no enabled flag:
        two Tasks that run the same thing from the same files have the same source).
        `python`, `isolation` and `on_interrupt` appear only when declared."""
        document: dict[str, Any] = {
            "command": list(self.command),
            "env": dict(self.env),
            "files": list(self.files),
        }
        if self.python is not None:
            document["python"] = self.python
        if self.isolation is not None:
            document["isolation"] = self.isolation
        if self.on_interrupt != ON_INTERRUPT_DEFAULT:  # only where declared
            document["on_interrupt"] = self.on_interrupt
        return document


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
    python: str | None = None,
    isolation: str | None = None,
    on_interrupt: str = ON_INTERRUPT_DEFAULT,
    concurrency: Concurrency | None = None,
) -> TaskDefinition:
    """Build a TaskDefinition whose source digest covers `command` (or `python` and
    `isolation`), `env`, `files` and `file_digests` (path -> SHA-256 hex of the
    file's bytes)."""
    draft = TaskDefinition(
        task_id=task_id,
        command=command,
        source_digest=PLACEHOLDER_DIGEST,
        enabled=enabled,
        env=env if env is not None else (),
        files=files,
        python=python,
        isolation=isolation,
        on_interrupt=on_interrupt,
        concurrency=concurrency,
    )
    digest = task_source_digest(draft.definition(), file_digests or {})
    return dataclasses.replace(draft, source_digest=digest)
