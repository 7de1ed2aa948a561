"""What a leased Attempt's Task is given: its definition from the admitted revision,
and its inputs (the Run's parameters and the outputs of the steps it needs).

`task_definition` is the one place that reads a Task's definition for a Run, so
it reads through `projections.published_revisions`, which a PostgreSQL runtime role
may call where it may not read the publications themselves.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypedDict

from domain.errors import NotFound
from domain.plan import task_ref
from domain.revision import revision_from_json
from domain.tasks import ON_INTERRUPT_DEFAULT
from eventstore.api import EventStore
from projections import views
from projections.published_revisions import published_revisions


@dataclass(frozen=True, slots=True)
class TaskDefinitionView:
    """A Task as the admitted revision holds it: command, env, the files it names,
    and the package folder the publication was made from (None for a manifest dict);
    a python Task has `python` ("module:function") and `isolation`, and no command."""

    task_ref: str
    task_id: str
    command: tuple[str, ...]
    env: dict[str, str]
    files: tuple[str, ...]
    folder: str | None
    source_digest: str
    python: str | None = None
    isolation: str | None = None
    on_interrupt: str = ON_INTERRUPT_DEFAULT  # what a stop by its host does: requeue | fail


def task_definition(store: EventStore, publication_id: str, ref: str) -> TaskDefinitionView:
    """The Task `ref` ("<package>@<generation>#<task>") of the publication a Run was
    admitted with; NotFound for a Task it has not, or has disabled (a plan never names
    one)."""
    found = published_revisions(store, publication_id=publication_id)
    if not found:
        raise NotFound(f"publication {publication_id!r} has no published revision")
    ((_, published),) = found
    revision = revision_from_json(published["revision"])
    for task_id, task in revision.tasks.items():
        if task_ref(revision.package, revision.generation, task_id) == ref:
            if not task.enabled:
                raise NotFound(
                    f"publication {publication_id} has Task {task_id!r} disabled: "
                    "no Run of it may execute it"
                )
            source = published.get("source_path")
            return TaskDefinitionView(
                task_ref=ref,
                task_id=task_id,
                command=tuple(task.command),
                env=dict(task.env),
                files=tuple(task.files),
                folder=source if isinstance(source, str) and source else None,
                source_digest=task.source_digest,
                python=task.python,
                isolation=task.isolation_mode if task.runs_python else None,
                on_interrupt=task.on_interrupt,
            )
    raise NotFound(f"publication {publication_id} has no Task for task ref {ref}")


class TaskInputs(TypedDict):
    """What a step is given: the Run's bound parameters, and the succeeded output of
    each step it needs (None for a need that wrote none)."""

    params: dict[str, str | int | bool]
    needs: dict[str, dict[str, Any] | None]


def step_inputs(run: views.RunView, step_key: str) -> TaskInputs:
    """The inputs of the Run's step `step_key`: its bound parameters and each need's
    output (`StepView.output`). The one rule every path that hands a step its inputs
    asks, whichever way it came by the Run."""
    step = run.steps.get(step_key)
    if step is None:
        raise NotFound(f"run {run.run_id!r} has no step {step_key!r}")
    return {
        "params": dict(run.params),
        "needs": {need: run.steps[need].output for need in step.needs},
    }


@dataclass(frozen=True, slots=True)
class AttemptInputs:
    """What a python Task's context holds besides the lease: the step's inputs, which
    Attempt of the step this is (1-based) and how many it may have."""

    inputs: TaskInputs
    attempt: int
    max_attempts: int


def attempt_inputs(run: views.RunView, step_key: str, attempt_id: str) -> AttemptInputs:
    """The inputs of Attempt `attempt_id` of the Run's step `step_key` (`step_inputs`),
    its number (0 where the Run does not hold it) and its step's Attempt limit."""
    inputs = step_inputs(run, step_key)
    step = run.steps[step_key]
    number = next((a.attempt_number for a in step.attempts if a.attempt_id == attempt_id), 0)
    return AttemptInputs(inputs, number, step.max_attempts)
