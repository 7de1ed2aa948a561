"""A Task that names a Python function: `python = "etl.fetch:run"` (docs/DESIGN.md,
"Python tasks").

The target is a dotted module path inside the package folder and a function name,
each part a Python identifier. The module's file (`etl/fetch.py`, or
`etl/fetch/__init__.py` for a package) must be one of the Task's `files`, so the
source digest covers the code that runs. Nothing here imports or reads anything.
"""

from __future__ import annotations

import keyword
import re
from collections.abc import Iterable
from dataclasses import dataclass

from domain.errors import PlanError

ISOLATION_PROCESS = "process"  # the default: a pool of worker processes per host
ISOLATION_THREAD = "thread"  # in the host process: it can be asked to stop, never made to
ISOLATIONS = (ISOLATION_PROCESS, ISOLATION_THREAD)
MAX_TARGET_CHARS = 512
_DRIVE = re.compile(r"[A-Za-z]:[/\\]")  # C:/x, C:\x


@dataclass(frozen=True, slots=True)
class PythonTarget:
    """A parsed `module:function`."""

    module: str
    function: str

    @property
    def text(self) -> str:
        """The target as the manifest writes it."""
        return f"{self.module}:{self.function}"

    def module_files(self) -> tuple[str, str]:
        """The two files the module may be, relative to the package folder."""
        base = self.module.replace(".", "/")
        return f"{base}.py", f"{base}/__init__.py"


def target_problem(value: object) -> str | None:
    """Why `value` is not a `module.path:function` target, or None."""
    if not isinstance(value, str):
        return f"must be a string 'module.path:function', not {type(value).__name__}"
    if len(value) > MAX_TARGET_CHARS:
        return f"is longer than {MAX_TARGET_CHARS} characters"
    if value.startswith(("/", "\\")) or _DRIVE.match(value):
        return f"{value!r} is an absolute path; name a module inside the package folder"
    if value.count(":") != 1:
        return f"{value!r} must be 'module.path:function' (one ':' between them)"
    module, function = value.split(":")
    if not module:
        return f"{value!r} names no module"
    for part in module.split("."):
        if part in ("", "..") or "/" in part or "\\" in part:
            return (
                f"{value!r}: module {module!r} must be a dotted path inside the package "
                "folder (no '/', '..' or empty parts)"
            )
        if not _identifier(part):
            return f"{value!r}: module part {part!r} is not a Python identifier"
    if not _identifier(function):
        return f"{value!r}: function {function!r} is not a Python identifier"
    return None


def parse_target(value: object, what: str = "python") -> PythonTarget:
    """The target of `value`; PlanError("task_python") saying what is wrong."""
    problem = target_problem(value)
    if problem is not None:
        raise PlanError("task_python", f"{what} {problem}")
    assert isinstance(value, str)
    module, function = value.split(":")
    return PythonTarget(module, function)


def module_file(target: PythonTarget, files: Iterable[str]) -> str | None:
    """The Task file that is the target's module, or None when `files` has neither."""
    named = set(files)
    return next((path for path in target.module_files() if path in named), None)


def files_problem(target: PythonTarget, files: Iterable[str]) -> str | None:
    """Why `files` does not cover the target's module, or None."""
    if module_file(target, files) is not None:
        return None
    plain, package = target.module_files()
    return (
        f"module {target.module!r} is not in files: name {plain!r} (or {package!r}) "
        "there, so the source digest covers the code that runs"
    )


def isolation_problem(value: object) -> str | None:
    """Why `value` is not an isolation, or None."""
    if value not in ISOLATIONS:
        return f"must be one of {', '.join(ISOLATIONS)}, not {value!r}"
    return None


def _identifier(text: str) -> bool:
    return text.isidentifier() and text.isascii() and not keyword.iskeyword(text)
