"""Stream categories: every stream id is `<category>-<entity id>`.

One place names each category, builds stream ids and takes them apart (as
message-db does with `category()` and `id()`); no other module spells a prefix.
See docs/DESIGN.md for what each stream holds.
"""

from __future__ import annotations

from typing import Final

RUN: Final = "run"  # RunEvents of one Run: workflow.*, step.*, attempt.*
STEPS: Final = "steps"  # StepRunMutations of one Run
LEASE: Final = "lease"  # the lease of one Task Attempt (its version is the fencing token)
PUBLICATION: Final = "publication"  # lifecycle of one publication
PUBLISHER: Final = "publisher"  # trust of one publisher
ADMISSION: Final = "admission"  # the durable admission receipt of one admission key
SCHEDULE: Final = "schedule"  # the durable cursor of one schedule
RETENTION: Final = "retention"  # what retention removed, one record per batch
NOTIFICATION: Final = "notification"  # the notification outbox of one Run
LIMIT: Final = "limit"  # the runtime changes of one concurrency limit (or key)
CATEGORIES = (
    RUN,
    STEPS,
    LEASE,
    PUBLICATION,
    PUBLISHER,
    ADMISSION,
    SCHEDULE,
    RETENTION,
    NOTIFICATION,
    LIMIT,
)
# what the runtime writes (cycles, workers, admission) and what publishers write
RUNTIME_CATEGORIES = (RUN, STEPS, LEASE, ADMISSION, SCHEDULE, NOTIFICATION, LIMIT)
PROVENANCE_CATEGORIES = (PUBLICATION, PUBLISHER)


def stream_id(category_name: str, entity_id: str) -> str:
    """`<category>-<entity id>`."""
    return f"{category_name}-{entity_id}"


def category(stream: str) -> str:
    """The category of a stream id: "run-abc" -> "run" ("" when it has none)."""
    name, sep, _ = stream.partition("-")
    return name if sep else ""


def entity_id(stream: str) -> str:
    """The entity id of a stream id: "run-abc" -> "abc"."""
    return stream.partition("-")[2]


def prefix(category_name: str) -> str:
    """The prefix every stream of a category starts with: "run" -> "run-"."""
    return f"{category_name}-"


def run_stream(run_id: str) -> str:
    """The stream of a Run's RunEvents."""
    return stream_id(RUN, run_id)


def steps_stream(run_id: str) -> str:
    """The stream of a Run's StepRunMutations."""
    return stream_id(STEPS, run_id)


def lease_stream(attempt_id: str) -> str:
    """The stream of one Attempt's lease."""
    return stream_id(LEASE, attempt_id)


def publication_stream(publication_id: str) -> str:
    """The lifecycle stream of one publication."""
    return stream_id(PUBLICATION, publication_id)


def publisher_stream(publisher: str) -> str:
    """The trust stream of one publisher."""
    return stream_id(PUBLISHER, publisher)


def schedule_stream(schedule_id: str) -> str:
    """The cursor stream of one schedule."""
    return stream_id(SCHEDULE, schedule_id)


RETENTION_LOG = "runs"  # the entity of the one retention stream


def retention_stream() -> str:
    """The stream of retention records (one per batch of removed Runs)."""
    return stream_id(RETENTION, RETENTION_LOG)


def notification_stream(run_id: str) -> str:
    """The notification outbox of one Run."""
    return stream_id(NOTIFICATION, run_id)


def limit_stream(target_digest: str) -> str:
    """The stream of one limit target's runtime changes (`limits set`)."""
    return stream_id(LIMIT, target_digest)
