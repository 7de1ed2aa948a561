"""The start guard: may this publication start a Run of this Workflow now?

Admission gathers the facts inside the publisher's lock (the publication, its
publisher's trust status, the current head of its installation and the revision it
publishes) and this module decides, purely. A refusal has a `reason` (the rule that
said no) and a message that names the publication and what to do. `build_plan`
refuses a disabled Workflow or Task by the same two rules (`workflow_disabled`,
`task_disabled`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from domain.errors import StartGuardError
from domain.revision import MaterializedRevision
from domain.tasks import TaskDefinition
from domain.values import ACTIVE, QUARANTINED, REVOKED, WITHDRAWN, Publication
from domain.workflows import WorkflowDefinition


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a start is refused: the rule (`reason`) and what to tell the caller."""

    reason: str
    message: str


def workflow_disabled(workflow_key: str, workflow: WorkflowDefinition) -> Refusal | None:
    """A disabled Workflow starts no Run."""
    if workflow.enabled:
        return None
    return Refusal("workflow_disabled", f"Workflow {workflow_key!r} is disabled")


def task_disabled(
    workflow_key: str, workflow: WorkflowDefinition, tasks: Mapping[str, TaskDefinition]
) -> Refusal | None:
    """A Workflow one of whose steps uses a disabled Task starts no Run."""
    for step in workflow.steps:
        task = tasks.get(step.task)
        if task is not None and not task.enabled:
            return Refusal(
                "task_disabled",
                f"Workflow {workflow_key!r} step {step.key!r} uses Task {step.task!r}, "
                "which is disabled",
            )
    return None


def start_refusal(
    publication: Publication,
    publisher_status: str | None,
    installation_head: Publication | None,
    revision: MaterializedRevision,
    workflow_key: str,
    *,
    superseded_ok: bool = False,
) -> Refusal | None:
    """The first rule that refuses starting `workflow_key` from `publication`, or None.

    In order: the publisher is not revoked; the publication is not quarantined, not
    withdrawn, active; it is the head (newest generation) of its installation
    (`installation_head` names the current one); the revision has the Workflow; the
    Workflow and every Task it uses are enabled. `superseded_ok`: a rerun of the same
    plan (docs/DESIGN.md "Reruns") may bind a publication that is no longer the head."""
    where = (
        f"publication {publication.publication_id} ({publication.package} generation "
        f"{publication.generation})"
    )
    if publisher_status == REVOKED:
        return Refusal(
            "publisher_revoked",
            f"{where}: its publisher {publication.publisher!r} is revoked; "
            "no publication of a revoked publisher may start Workflows",
        )
    if publication.status == QUARANTINED:
        return Refusal("quarantined", f"{where} is quarantined and may not start Workflows")
    if publication.status == WITHDRAWN:
        return Refusal(
            "withdrawn", f"{where} is withdrawn; publish a new generation to start Workflows again"
        )
    if publication.status != ACTIVE:
        return Refusal("inactive", f"{where} is {publication.status}")
    if not publication.head and not superseded_ok:
        head = installation_head
        current = f"generation {head.generation} ({head.publication_id})" if head else "unknown"
        return Refusal(
            "superseded",
            f"{where} is no longer the head of installation {publication.installation!r}; "
            f"the current head is {current}: start that one",
        )
    workflow = revision.workflows.get(workflow_key)
    if workflow is None:
        known = ", ".join(revision.workflows) or "none"
        return Refusal(
            "unknown_workflow", f"{where} has no Workflow {workflow_key!r} (workflows: {known})"
        )
    disabled = workflow_disabled(workflow_key, workflow) or task_disabled(
        workflow_key, workflow, revision.tasks
    )
    if disabled is not None:
        return Refusal(disabled.reason, f"{where}: {disabled.message}")
    return None


def check_start(
    publication: Publication,
    publisher_status: str | None,
    installation_head: Publication | None,
    revision: MaterializedRevision,
    workflow_key: str,
    *,
    superseded_ok: bool = False,
) -> None:
    """Raise StartGuardError (with `.reason`) if `start_refusal` refuses."""
    refusal = start_refusal(
        publication,
        publisher_status,
        installation_head,
        revision,
        workflow_key,
        superseded_ok=superseded_ok,
    )
    if refusal is not None:
        error = StartGuardError(refusal.message)
        error.reason = refusal.reason
        raise error
