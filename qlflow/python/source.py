"""A python Task's function, checked statically at publish: its module parses, the
function is defined at its top level and takes one argument (the TaskContext).
Nothing is imported: the module is read as text and parsed with `ast`."""

from __future__ import annotations

import ast
from pathlib import Path

from domain.errors import ManifestError
from domain.manifest import TaskSpec
from domain.manifest_checks import manifest_error
from domain.python_tasks import module_file, parse_target


def check_python_task(folder: Path, task: TaskSpec, source: str) -> None:
    """Refuse (ManifestError naming the Task's `python`) a module that does not parse,
    a function it does not define, or one that cannot take exactly one argument. A
    name the module binds some other way (an assignment, an import) cannot be seen
    statically and is left to the run, which fails with a named result code."""
    if task.python is None:
        return
    table = f"tasks.{task.task_id}"
    target = parse_target(task.python)
    relative = module_file(target, task.files)
    if relative is None:  # pragma: no cover - the manifest refused it already
        raise manifest_error(source, table, "files", f"module {target.module!r} not in files")
    try:
        tree = ast.parse((folder / relative).read_bytes(), filename=relative)
    except SyntaxError as error:
        raise _refused(source, table, f"{relative} does not parse: {error}") from None
    except (OSError, ValueError) as error:
        raise _refused(source, table, f"{relative} cannot be read: {error}") from None
    found: ast.FunctionDef | ast.AsyncFunctionDef | None = None
    bound_otherwise = False
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if node.name == target.function:
                found = node
        elif _binds(node, target.function):
            bound_otherwise = True
            found = None
    if found is None:
        if bound_otherwise:
            return
        raise _refused(
            source, table, f"{relative} defines no function {target.function!r} at its top level"
        )
    problem = _signature_problem(found.args)
    if problem is not None:
        raise _refused(source, table, f"{target.text} {problem}")


def _refused(source: str, table: str, problem: str) -> ManifestError:
    return manifest_error(source, table, "python", problem)


def _signature_problem(args: ast.arguments) -> str | None:
    positional = [*args.posonlyargs, *args.args]
    required = len(positional) - len(args.defaults)
    required_keywords = sum(1 for default in args.kw_defaults if default is None)
    if required_keywords:
        return "has keyword-only arguments without defaults; it is called with one argument"
    if required > 1:
        return f"takes {required} arguments; it is called with one (the TaskContext)"
    if not positional and args.vararg is None:
        return "takes no argument; it is called with one (the TaskContext)"
    return None


def _binds(node: ast.stmt, name: str) -> bool:
    """Whether a top-level statement other than a def may bind `name`."""
    if isinstance(node, ast.ClassDef):
        return node.name == name
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return any((alias.asname or alias.name.split(".")[0]) == name for alias in node.names)
    if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        return any(
            isinstance(sub, ast.Name) and sub.id == name
            for target in targets
            for sub in ast.walk(target)
        )
    # a def inside an if/try, say: it may well bind it
    return any(
        isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and sub.name == name
        for sub in ast.walk(node)
    )
