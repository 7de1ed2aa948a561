"""What every event type must carry for its fold to decode it (docs/EVENTS.md), in
one declaration that the append's check (`eventstore.validation`), the PostgreSQL
append function (`eventstore.pg_append`, generated from it) and `verify` all use.

Per type: the stream category it is written to, the top-level data fields the folds
read without a default, and, for types that name their own entity, the path of the
field that must equal the stream's entity id (`run-<run_id>` opens with a plan for
that Run). A stream id is `<known category>-<non-empty entity id>`. A type this
module does not name is the generic store's business (its contract tests use
such types); a restricted PostgreSQL role may append only the named ones.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from domain import event_types as t
from domain import streams
from domain.event_types import EventType, Family
from domain.transitions import ATTEMPT_TERMINAL, RUN_TERMINAL, STEP_TRANSITIONS


@dataclass(frozen=True, slots=True)
class EventShape:
    """Where a type is written and what its data must hold."""

    category: str
    fields: tuple[str, ...]
    entity_field: tuple[str, ...] = ()  # data path that must equal the stream's entity id


def _shapes() -> dict[str, EventShape]:
    run, lease = streams.RUN, streams.LEASE
    step_change = ("step_run_id", "step_key", "from", "to", "epoch")
    shapes: dict[str, EventShape] = {
        EventType.WORKFLOW_ADMITTED: EventShape(
            run, ("plan", "admission_key", "admitted_at_ms"), ("plan", "run_id")
        ),
        EventType.WORKFLOW_CANCEL_REQUESTED: EventShape(run, ("reason", "requested_at_ms")),
        EventType.WORKFLOW_DEQUEUED: EventShape(run, ("slot", "dequeued_at_ms")),
        EventType.STEP_CREATED: EventShape(run, ("step_run_id", "step_key", "status", "epoch")),
        EventType.ATTEMPT_CLAIMED: EventShape(
            run,
            ("attempt_id", "step_run_id", "step_key", "step_epoch", "attempt_number", "admission"),
        ),
        EventType.ATTEMPT_STARTING: EventShape(run, ("attempt_id", "lease_id")),
        EventType.STEP_REUSED: EventShape(run, (*step_change, "reused_from", "output")),
        EventType.ATTEMPT_RUNNING: EventShape(run, ("attempt_id", "lease_id")),
        EventType.STEP_RUN_MUTATED: EventShape(
            streams.STEPS,
            ("step_run_id", "step_key", "from", "to", "step_epoch", "run_version", "event_id"),
        ),
        EventType.LEASE_GRANTED: EventShape(
            lease,
            ("lease_id", "attempt_id", "worker_id", "granted_at_ms", "ttl_ms", "expires_at_ms"),
            ("attempt_id",),
        ),
        EventType.LEASE_RENEWED: EventShape(lease, ("lease_id", "ttl_ms", "expires_at_ms")),
        EventType.LEASE_COMPLETED: EventShape(lease, ("lease_id", "outcome")),
        EventType.LEASE_RELEASED: EventShape(lease, ("lease_id", "reason")),
        EventType.PUBLICATION_PUBLISHED: EventShape(
            streams.PUBLICATION,
            ("publication", "revision", "published_at_ms"),
            ("publication", "publication_id"),
        ),
        EventType.ADMISSION_RECEIPT: EventShape(
            streams.ADMISSION,
            (
                "admission_key",
                "run_id",
                "plan_digest",
                "receipt_digest",
                "package",
                "workflow_key",
                "publication_id",
                "admitted_at_ms",
            ),
        ),
        EventType.SCHEDULE_ARMED: EventShape(streams.SCHEDULE, ("next_fire_at_ms",)),
        EventType.SCHEDULE_RESUMED: EventShape(streams.SCHEDULE, ("next_fire_at_ms",)),
        EventType.SCHEDULE_FIRED: EventShape(
            streams.SCHEDULE, ("scheduled_for_ms", "run_id", "next_fire_at_ms")
        ),
        EventType.SCHEDULE_SKIPPED: EventShape(
            streams.SCHEDULE, ("from_ms", "to_ms", "next_fire_at_ms", "reason")
        ),
        EventType.SCHEDULE_PAUSED: EventShape(streams.SCHEDULE, ()),
        EventType.SCHEDULE_RETIRED: EventShape(streams.SCHEDULE, ()),
        EventType.RETENTION_REMOVED: EventShape(
            streams.RETENTION, ("runs", "positions", "events", "digest", "removed_at_ms")
        ),
        EventType.NOTIFICATION_DUE: EventShape(
            streams.NOTIFICATION, ("run_id", "rule", "status", "target"), ("run_id",)
        ),
        EventType.NOTIFICATION_ATTEMPTED: EventShape(
            streams.NOTIFICATION, ("rule", "attempt", "delivered", "at_ms", "retry_at_ms")
        ),
        EventType.LIMIT_SET: EventShape(streams.LIMIT, ("target", "old", "new", "set_at_ms")),
    }
    for kind in (EventType.PUBLICATION_WITHDRAWN, EventType.PUBLICATION_QUARANTINED):
        shapes[kind] = EventShape(
            streams.PUBLICATION, ("publication_id", "at_ms"), ("publication_id",)
        )
    for kind in (EventType.PUBLISHER_REVOKED, EventType.PUBLISHER_REINSTATED):
        shapes[kind] = EventShape(streams.PUBLISHER, ("publisher", "at_ms"), ("publisher",))
    for to in {to for targets in STEP_TRANSITIONS.values() for to in targets}:
        shapes[t.of(Family.STEP, to)] = EventShape(run, step_change)
    for end in ATTEMPT_TERMINAL:
        shapes[t.of(Family.ATTEMPT, end)] = EventShape(run, ("attempt_id",))
    for end in RUN_TERMINAL:
        shapes[t.of(Family.WORKFLOW, end)] = EventShape(run, ())
    return shapes


SHAPES: Mapping[str, EventShape] = _shapes()
# per type (a plain str: a StrEnum key's lookup costs several times a str's), its shape
# and its fields as a set: `verify` asks `shape_problem` of every event in the log
_CHECKED = {str(kind): (shape, frozenset(shape.fields)) for kind, shape in SHAPES.items()}


def stream_problem(stream_id: str) -> str | None:
    """Why `stream_id` is not `<known category>-<entity id>`, or None."""
    name, sep, entity = stream_id.partition("-")
    if not sep or name not in streams.CATEGORIES:
        return f"stream {stream_id!r} is not in a known category {streams.CATEGORIES}"
    if not entity:
        return f"stream {stream_id!r} names no entity after {name + '-'!r}"
    return None


def shape_problem(stream_id: str, event_type: str, data: Mapping[str, Any]) -> str | None:
    """Why an event of `event_type` with `data` cannot be folded from `stream_id`, or
    None (also None for a type not named here: see the module docstring)."""
    checked = _CHECKED.get(event_type)
    if checked is None:
        return None
    shape, fields = checked
    name, _, entity = stream_id.partition("-")
    if name != shape.category:
        return f"{event_type} is written to {shape.category}- streams, not to {stream_id!r}"
    if not data.keys() >= fields:
        missing = [field for field in shape.fields if field not in data]
        return f"{event_type} data lacks {', '.join(missing)}"
    if shape.entity_field:
        value: Any = data
        for part in shape.entity_field:
            value = value.get(part) if type(value) is dict or isinstance(value, Mapping) else None
        if value != entity:
            path = ".".join(shape.entity_field)
            return f"{event_type} {path} {value!r} is not the entity of stream {stream_id!r}"
    return None
