"""What `rt.schedules()` answers: one `ScheduleView` per schedule that is not retired."""

from __future__ import annotations

from dataclasses import dataclass

from domain.schedule_spec import describe_cron
from domain.schedules import PAUSED
from eventstore.api import Reads
from projections import schedules as read_model


@dataclass(frozen=True, slots=True)
class ScheduleView:
    """A schedule of a Workflow of a head publication and its durable cursor.

    `next_fire_at_ms` is the next occurrence the schedule phase will admit (None while
    paused, or before the first cycle after its publication arms it);
    `last_fired_at_ms` / `last_run_id` name the last occurrence admitted as a Run.
    `status` is active, paused, or unarmed (declared, not armed yet); `description`
    says the cron in words. Times are epoch milliseconds.
    """

    schedule_id: str
    package: str
    workflow: str
    cron: str
    timezone: str
    misfire: str
    overlap: str  # allow | skip | queue: an occurrence while the last fired Run runs
    next_fire_at_ms: int | None
    last_fired_at_ms: int | None
    paused: bool
    status: str
    description: str
    last_run_id: str | None
    installation: str
    publication_id: str
    params: dict[str, str | int | bool]


UNARMED = "unarmed"


def list_schedules(reader: Reads) -> list[ScheduleView]:
    """Every schedule that is not retired, by (package, workflow, id)."""
    return [_view(row) for row in read_model.listed(reader)]


def _view(row: read_model.ScheduleRow) -> ScheduleView:
    declaration, state = row.declaration, row.state
    spec = declaration.spec
    return ScheduleView(
        schedule_id=declaration.schedule_id,
        package=declaration.package,
        workflow=declaration.workflow,
        cron=spec.cron,
        timezone=spec.timezone,
        misfire=spec.misfire,
        overlap=spec.overlap,
        next_fire_at_ms=None if state is None else state.next_fire_at_ms,
        last_fired_at_ms=None if state is None else state.last_fired_at_ms,
        paused=state is not None and state.status == PAUSED,
        status=UNARMED if state is None else state.status,
        description=describe_cron(spec.cron),
        last_run_id=None if state is None else state.last_run_id,
        installation=declaration.installation,
        publication_id=declaration.publication_id,
        params=spec.params_dict(),
    )
