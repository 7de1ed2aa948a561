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
    and the package folder the publication was made from (None for a manifest dict)."""

    task_ref: str
    task_id: str
    command: tuple[str, ...]
    env: dict[str, str]
    files: tuple[str, ...]
    folder: str | None
    source_digest: str
    on_interrupt: str = ON_INTERRUPT_DEFAULT  # what a stop by its host does: requeue | fail


def task_definition(store: EventStore, run_id: str, ref: str) -> TaskDefinitionView:
    """The Task `ref` ("<package>@<generation>#<task>") of the Run's publication;
    NotFound for a Task it has not, or has disabled (a plan never names one)."""
    publication_id = views.get_run(store, run_id).publication_id
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
                on_interrupt=task.on_interrupt,
            )
    raise NotFound(f"publication {publication_id} has no Task for task ref {ref}")


class TaskInputs(TypedDict):
    """What a step is given: the Run's bound parameters, and the succeeded output of
    each step it needs (None for a need that wrote none)."""

    params: dict[str, str | int | bool]
    needs: dict[str, dict[str, Any] | None]


def task_inputs(store: EventStore, run_id: str, step_key: str) -> TaskInputs:
    """`{"params": {...}, "needs": {"<step key>": <output or null>}}` for one step: the
    Run's bound parameters and each need's succeeded output."""
    run = views.get_run(store, run_id)
    step = run.steps.get(step_key)
    if step is None:
        raise NotFound(f"run {run_id!r} has no step {step_key!r}")
    return {
        "params": dict(run.params),
        "needs": {need: run.steps[need].output for need in step.needs},
    }
