"""Every event type name, in one place (docs/EVENTS.md describes their data).

A type is `<family>.<name>`; the families follow the streams they are written to.
Modules compare and build types with these names, never with string literals (a test
scans the tree's syntax for one).
"""

from __future__ import annotations

from enum import StrEnum


class Family(StrEnum):
    """The family of a status change's type: `<family>.<status>`."""

    WORKFLOW = "workflow"
    STEP = "step"
    ATTEMPT = "attempt"


class EventType(StrEnum):
    """Every named event type; a status change's type is built by `of`."""

    # --- run-<run_id>: RunEvents ---------------------------------------------------------
    WORKFLOW_ADMITTED = "workflow.admitted"
    WORKFLOW_CANCEL_REQUESTED = "workflow.cancel_requested"
    WORKFLOW_DEQUEUED = "workflow.dequeued"  # a queued Run takes its Workflow's slot
    STEP_CREATED = "step.created"
    ATTEMPT_CLAIMED = "attempt.claimed"
    ATTEMPT_STARTING = "attempt.starting"
    ATTEMPT_RUNNING = "attempt.running"
    ATTEMPT_INTERRUPTED = "attempt.interrupted"  # its host stopped it; the step runs again
    STEP_REUSED = "step.reused"  # a rerun reuses a succeeded step of its source Run

    # --- steps-<run_id> --------------------------------------------------------------------
    STEP_RUN_MUTATED = "step_run.mutated"

    # --- lease-<attempt_id> ----------------------------------------------------------------
    LEASE_GRANTED = "lease.granted"
    LEASE_RENEWED = "lease.renewed"
    LEASE_COMPLETED = "lease.completed"
    LEASE_RELEASED = "lease.released"

    # --- publication-<id>, publisher-<id>, admission-<digest> ------------------------------
    PUBLICATION_PUBLISHED = "publication.published"
    PUBLICATION_WITHDRAWN = "publication.withdrawn"
    PUBLICATION_QUARANTINED = "publication.quarantined"
    PUBLISHER_REVOKED = "publisher.revoked"
    PUBLISHER_REINSTATED = "publisher.reinstated"
    ADMISSION_RECEIPT = "admission.receipt"

    # --- schedule-<schedule_id>: the durable cursor of one schedule ------------------------
    SCHEDULE_ARMED = "schedule.armed"
    SCHEDULE_FIRED = "schedule.fired"
    SCHEDULE_SKIPPED = "schedule.skipped"
    SCHEDULE_PAUSED = "schedule.paused"
    SCHEDULE_RESUMED = "schedule.resumed"
    SCHEDULE_RETIRED = "schedule.retired"

    # --- retention-runs: what retention removed ---------------------------------------------
    RETENTION_REMOVED = "retention.removed"  # one batch of finished Runs, gone from the log
    # --- notification-<run_id>: the outbox of one Run's notifications --------------------
    NOTIFICATION_DUE = "notification.due"  # written with the Run's terminal record
    NOTIFICATION_ATTEMPTED = "notification.attempted"  # one delivery attempt and its outcome
    # --- limit-<target digest>: a concurrency limit changed at runtime --------------------
    LIMIT_SET = "limit.set"  # who set which limit to what, and what it was


def of(family: str, name: str) -> str:
    """`<family>.<name>`: the type of a status change, e.g. of(Family.STEP, "ready")."""
    return f"{family}.{name}"


def family(event_type: str) -> str:
    """The family of a type: "step.failed" -> "step" ("" for a type without a dot)."""
    name, sep, _ = event_type.partition(".")
    return name if sep else ""


def name(event_type: str) -> str:
    """What follows the family: "step.failed" -> "failed"."""
    return event_type.partition(".")[2]


def known() -> tuple[str, ...]:
    """Every type the log can hold, sorted: the named ones and each status change's
    (`step.<to>`, `attempt.<terminal>`, `workflow.<terminal>`)."""
    from domain.transitions import ATTEMPT_TERMINAL, RUN_TERMINAL, STEP_TRANSITIONS

    named = {str(member) for member in EventType}
    steps = {of(Family.STEP, to) for targets in STEP_TRANSITIONS.values() for to in targets}
    attempts = {of(Family.ATTEMPT, end) for end in ATTEMPT_TERMINAL}
    runs = {of(Family.WORKFLOW, end) for end in RUN_TERMINAL}
    return tuple(sorted(named | steps | attempts | runs))
