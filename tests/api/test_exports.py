"""`qlflow.__all__` is pinned, the way temporalio's tests pin its client exports: a
name added to or dropped from the package's surface is a decision this test makes
visible. And the surface holds only what a user needs: every exported class is an
entry point or a type the API hands out or takes (a method's parameters and return,
and the fields of those, transitively)."""

from __future__ import annotations

import inspect
import types
import typing

import qlflow

PINNED = [
    "AdmissionReceipt",
    "AsyncRuntime",
    "AttemptBlock",
    "AttemptReport",
    "AttemptState",
    "AttemptView",
    "BackfillResult",
    "BackfilledRun",
    "BatchResult",
    "Completed",
    "Completion",
    "CycleResult",
    "Difference",
    "Intent",
    "Lease",
    "LeaseState",
    "LimitChange",
    "LimitView",
    "LogAttempt",
    "LogChunk",
    "LogState",
    "PackageView",
    "PageResult",
    "ParamDefinition",
    "Profile",
    "Pruned",
    "Publication",
    "RebuildSummary",
    "Record",
    "RetentionReport",
    "RootCause",
    "RunAggregate",
    "RunCursor",
    "RunState",
    "RunView",
    "Runtime",
    "ScheduleView",
    "SlotHolder",
    "StepFailure",
    "StepRunState",
    "StepView",
    "StepWait",
    "TaskContext",
    "TaskDefinitionView",
    "TaskInputs",
    "TimelineEntry",
    "VerifyReport",
    "WhyReport",
    "Worker",
    "WorkerView",
    "errors",
    "open",
    "open_async",
]

ENTRY_POINTS = {qlflow.Runtime, qlflow.AsyncRuntime, qlflow.Worker, qlflow.TaskContext}


def test_the_exported_names_are_pinned():
    assert sorted(qlflow.__all__) == PINNED
    assert len(set(qlflow.__all__)) == len(qlflow.__all__)
    for name in qlflow.__all__:
        value = getattr(qlflow, name)
        assert inspect.getdoc(value), f"qlflow.{name} has no docstring"


def _classes_named_by(hint: object) -> set[type]:
    """The classes a type hint names (list[X] -> {X}, X | None -> {X}, Mapping[K, V] ...)."""
    if isinstance(hint, type):
        return {hint}
    found: set[type] = set()
    for argument in typing.get_args(hint):
        found |= _classes_named_by(argument)
    return found


def _hinted_classes(value: object) -> set[type]:
    try:
        hints = typing.get_type_hints(value)
    except (NameError, TypeError):
        return set()
    found: set[type] = set()
    for hint in hints.values():
        found |= _classes_named_by(hint)
    return found


def _reachable_from_the_api() -> set[type]:
    """Every class a public method of an entry point takes or returns, and the
    field types of those classes, transitively."""
    reached: set[type] = set()
    pending: list[type] = list(ENTRY_POINTS)
    while pending:
        cls = pending.pop()
        if cls in reached or cls.__module__ == "builtins":
            continue
        reached.add(cls)
        named = _hinted_classes(cls)  # a dataclass's fields, a class's public attributes
        for name, member in inspect.getmembers(cls):
            if not name.startswith("_") and inspect.isfunction(member):
                named |= _hinted_classes(member)
        pending.extend(named - reached)
    return reached


def test_every_exported_class_is_one_the_api_hands_out_or_takes():
    exported = {
        getattr(qlflow, name) for name in qlflow.__all__ if isinstance(getattr(qlflow, name), type)
    }
    unreachable = exported - _reachable_from_the_api()
    assert not unreachable, sorted(cls.__name__ for cls in unreachable)


def test_the_errors_module_is_the_exported_one():
    assert isinstance(qlflow.errors, types.ModuleType)
    assert qlflow.errors.__name__ == "qlflow.errors"
