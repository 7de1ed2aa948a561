"""What a leased Attempt's Task is given: its definition from the admitted revision,
and its inputs (the Run's parameters and the outputs of the steps it needs).

`task_definition` is the one place that reads a Task's definition for a Run, so
it reads through `projections.published_revisions`, which a PostgreSQL runtime role
may call where it may not read the publications themselves.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypedDict

import orjson

from domain.errors import NotFound
from domain.plan import task_ref
from domain.revision import revision_from_json
from domain.tasks import ON_INTERRUPT_DEFAULT
from domain.transitions import ATTEMPT_SUCCEEDED
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


@dataclass(frozen=True, slots=True)
class AttemptInputs:
    """What a python Task's context holds besides the lease: the step's inputs, which
    Attempt of the step this is (1-based) and how many it may have."""

    inputs: TaskInputs
    attempt: int
    max_attempts: int


def attempt_inputs(store: EventStore, run_id: str, step_key: str, attempt_id: str) -> AttemptInputs:
    """The inputs of the step and the number of Attempt `attempt_id` in it: three small
    reads sent together (one round trip on PostgreSQL), not the whole Run."""
    run_rows, step_rows, attempt_rows, reused_rows = store.query_all(
        [
            ("SELECT params FROM runs WHERE run_id = ?", (run_id,)),
            (
                "SELECT needs, max_attempts FROM step_runs WHERE run_id = ? AND step_key = ?",
                (run_id, step_key),
            ),
            (
                """SELECT step_key, attempt_id, attempt_number, status, output FROM attempts
                   WHERE run_id = ? AND (status = ? OR attempt_id = ?)""",
                (run_id, ATTEMPT_SUCCEEDED, attempt_id),
            ),
            (  # a rerun's reused steps (docs/DESIGN.md "Reruns") hold their output
                "SELECT step_key, reused_output FROM step_runs "
                "WHERE run_id = ? AND reused_from IS NOT NULL",
                (run_id,),
            ),
        ],
        prepared=True,
    )
    if not run_rows:
        raise NotFound(f"run {run_id!r} does not exist; `qlflow runs` lists the runs")
    if not step_rows:
        raise NotFound(f"run {run_id!r} has no step {step_key!r}")
    (params,), (needs_text, max_attempts) = run_rows[0], step_rows[0]
    needs = [need for need in needs_text.split(",") if need]
    outputs: dict[str, dict[str, Any] | None] = dict.fromkeys(needs)
    number = 0
    for key, attempt, attempt_number, status, output in attempt_rows:
        if attempt == attempt_id:
            number = attempt_number
        if status == ATTEMPT_SUCCEEDED and key in outputs and output is not None:
            outputs[key] = orjson.loads(output)
    for key, output in reused_rows:
        if key in outputs and output is not None:
            outputs[key] = orjson.loads(output)
    inputs: TaskInputs = {"params": orjson.loads(params) if params else {}, "needs": outputs}
    return AttemptInputs(inputs, number, max_attempts)
