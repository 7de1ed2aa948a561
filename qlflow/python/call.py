"""Running a python Task's function once and saying how it went, the same way in a
pool process, in a host thread and in `qlflow.testing` (docs/DESIGN.md, "Python
tasks").

The module is imported from the package folder (put first on `sys.path`); a
module imported for an older source digest of that folder is dropped first, so a
republished package never runs stale code. What the function returns is checked
as a step's output must be: a JSON object within the size limit, no NaN.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import importlib
import inspect
import os
import sys
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import orjson

from domain.errors import InvalidInput
from domain.json_values import check_finite, check_output_size
from domain.params import ParamValue
from domain.transitions import Status
from qlflow.python.context import LogSink, TaskContext, task_logger
from qlflow.trace_context import traceparent

EXCEPTION = "exception"  # the function raised
OUTPUT_INVALID = "output_invalid"  # it returned something that cannot be an output
IMPORT_FAILED = "import_failed"  # its module cannot be imported (missing, raised)
FUNCTION_MISSING = "function_missing"  # the module has no such callable
PROCESS_DIED = "process_died"  # the pool process ended while the function ran

SUCCEEDED = Status.SUCCEEDED
FAILED = Status.FAILED


@dataclass(frozen=True, slots=True)
class Call:
    """One function call of an Attempt: where the function is, and its context's data
    (plain values, so it crosses to a pool process)."""

    folder: str
    module: str
    function: str
    source_digest: str
    params: dict[str, ParamValue]
    needs: dict[str, dict[str, Any] | None]
    run_id: str
    step_key: str
    attempt: int
    max_attempts: int
    attempt_id: str


@dataclass(frozen=True, slots=True)
class Outcome:
    """How a call ended: `succeeded` with its output (None: it returned none), or
    `failed` with a result code and a one-line message."""

    outcome: str
    result_code: str | None = None
    output: dict[str, Any] | None = None
    message: str | None = None


_imports = threading.Lock()
_loaded: dict[str, str] = {}  # package folder -> the source digest its modules were loaded for
_real_folders: dict[tuple[str, int, int], str] = {}  # (folder, device, inode) -> real path


def invoke(call: Call, sink: LogSink, stop_requested: Callable[[], bool]) -> Outcome:
    """Import the function, call it with its TaskContext (awaiting an `async def`),
    and check what it returned. Never raises for anything the function does: a
    failure is an Outcome, its traceback written to `sink` (stream stderr)."""
    try:
        function = _function(call)
    except _Refused as refused:
        _write_traceback(sink, refused.__cause__ or refused, refused.message)
        return Outcome(FAILED, refused.result_code, message=refused.message)
    context = TaskContext(
        params=call.params,
        needs=call.needs,
        run_id=call.run_id,
        step_key=call.step_key,
        attempt=call.attempt,
        max_attempts=call.max_attempts,
        attempt_id=call.attempt_id,
        log=task_logger(call.step_key, sink),
        _stop=stop_requested,
        traceparent=traceparent(call.run_id, call.attempt_id),
    )
    try:
        value = function(context)
        if inspect.isawaitable(value):
            value = _await(value)
    except BaseException as error:  # whatever the function raised fails it
        message = f"{type(error).__name__}: {error}"
        _write_traceback(sink, error, f"qlflow: {call.module}:{call.function} raised {message}")
        return Outcome(FAILED, EXCEPTION, message=message)
    return checked_output(value, sink)


def checked_output(value: object, sink: LogSink) -> Outcome:
    """`succeeded` with `value` as the output, or `failed` (`output_invalid`, the
    reason in the log) when it is not a JSON object, holds NaN, or is too large."""
    if value is None:
        return Outcome(SUCCEEDED)
    problem = None
    if not isinstance(value, dict):
        problem = f"the function returned {type(value).__name__}; a step's output is a dict"
    else:
        try:
            orjson.dumps(value)
            check_finite(value, "output")
            check_output_size(value, "output")
        except (TypeError, orjson.JSONEncodeError) as error:
            problem = f"the returned dict is not JSON: {error}"
        except InvalidInput as error:
            problem = str(error)
    if problem is not None:
        sink("qlflow", f"qlflow: {problem}\n".encode())
        return Outcome(FAILED, OUTPUT_INVALID, message=problem)
    assert isinstance(value, dict)
    return Outcome(SUCCEEDED, output=value)


class _Refused(Exception):
    def __init__(self, result_code: str, message: str) -> None:
        super().__init__(message)
        self.result_code = result_code
        self.message = message


def _function(call: Call) -> Callable[[TaskContext], Any]:
    with _imports:
        module = _module(call)
    function = getattr(module, call.function, None)
    if function is None or not callable(function):
        raise _Refused(
            FUNCTION_MISSING, f"qlflow: module {call.module!r} has no function {call.function!r}"
        )
    return function  # type: ignore[no-any-return]


def _module(call: Call) -> ModuleType:
    folder = _resolved(call.folder)
    if _loaded.get(folder) == call.source_digest and sys.path[:1] == [folder]:
        loaded = sys.modules.get(call.module)
        if loaded is not None and _inside(loaded, folder):
            return loaded  # imported for this digest already: what import_module returns
    if _loaded.get(folder) != call.source_digest:
        _forget(folder)
        _loaded[folder] = call.source_digest
    if sys.path[:1] != [folder]:
        # only the folder of the call at hand: another package's folder left on the
        # path could hold a module of the same name that wins the import
        for other in _loaded:
            while other in sys.path:
                sys.path.remove(other)
        sys.path.insert(0, folder)
    parts = call.module.split(".")
    for depth in range(1, len(parts) + 1):
        loaded = sys.modules.get(".".join(parts[:depth]))
        if loaded is not None and not _inside(loaded, folder):
            _forget_name(call.module)  # the same name from another package's folder
            break
    try:
        return importlib.import_module(call.module)
    except BaseException as error:  # a module that raises on import
        _forget(folder)
        raise _Refused(
            IMPORT_FAILED,
            f"qlflow: importing {call.module!r} failed: {type(error).__name__}: {error}",
        ) from error


def _resolved(folder: str) -> str:
    """The folder's real path, resolved again only when what `folder` names is
    another directory than last time (a symlink retargeted)."""
    try:
        info = os.stat(folder)
    except OSError:
        return str(Path(folder).resolve())
    key = (folder, info.st_dev, info.st_ino)
    real = _real_folders.get(key)
    if real is None:
        real = str(Path(folder).resolve())
        _real_folders[key] = real
    return real


def _inside(module: ModuleType, folder: str) -> bool:
    path = getattr(module, "__file__", None)
    if isinstance(path, str):
        return path.startswith(folder + "/")
    # a namespace package: inside when all its portions are
    portions = list(getattr(module, "__path__", []))
    return bool(portions) and all(str(p).startswith(folder + "/") for p in portions)


def _forget(folder: str) -> None:
    """Drop every module imported from `folder` (its source changed, or it failed)."""
    for name, module in list(sys.modules.items()):
        if module is not None and _inside(module, folder):
            del sys.modules[name]
    importlib.invalidate_caches()


def _forget_name(name: str) -> None:
    top = name.split(".")[0]
    for loaded in list(sys.modules):
        if loaded == top or loaded.startswith(top + "."):
            del sys.modules[loaded]


async def _awaited(value: Any) -> Any:
    return await value


def _await(value: Any) -> Any:
    """Run the coroutine to its end on an event loop of its own: on this thread, or
    on a thread of its own when this one runs a loop already (an async test)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(_awaited(value))
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="qlflow-await") as one:
        return one.submit(asyncio.run, _awaited(value)).result()


def _write_traceback(sink: LogSink, error: BaseException, headline: str) -> None:
    text = "".join(traceback.format_exception(error))
    sink("stderr", text.encode("utf-8", "replace"))
    sink("qlflow", (headline + "\n").encode("utf-8", "replace"))
