"""A `schedule-<id>` stream kept in memory and appended to as the store would.

`ScheduleLog.apply` checks the expected version, refuses an event id seen before,
sends data and metadata through JSON, folds the new records and remembers every
occurrence a decision handed over for admission. `ms("2026-03-29T01:00Z")` reads
an ISO instant as epoch milliseconds; `local(ms, zone)` shows one in a zone.
"""

from __future__ import annotations

from datetime import datetime

import orjson

from domain.occurrences import EPOCH, MS, zone
from domain.records import Record
from domain.schedule_spec import ScheduleSpec, schedule_id
from domain.schedules import (
    Occurrence,
    ScheduleDecision,
    ScheduleState,
    arm,
    decide_due,
    fold_schedule,
)

MINUTE = 60_000
HOUR = 60 * MINUTE
DAY = 24 * HOUR
EDGE_GRACE_MS = 30_000
STANDALONE_GRACE_MS = 300_000


def ms(text: str) -> int:
    """Epoch milliseconds of an ISO 8601 instant with an offset ("...Z" allowed)."""
    return (datetime.fromisoformat(text.replace("Z", "+00:00")) - EPOCH) // MS


def local(at_ms: int, zone_name: str) -> str:
    """The instant as the zone's wall clock shows it, with its offset."""
    return (EPOCH + at_ms * MS).astimezone(zone(zone_name)).strftime("%Y-%m-%d %H:%M%z")


def make_spec(
    cron: str, timezone: str = "UTC", misfire: str = "skip", overlap: str = "allow", **params
) -> ScheduleSpec:
    return ScheduleSpec(
        cron=cron,
        timezone=timezone,
        misfire=misfire,
        params=tuple(params.items()),
        overlap=overlap,
    )


def spec_id(spec: ScheduleSpec) -> str:
    return schedule_id("acme", "reports", "nightly", spec)


class ScheduleLog:
    """One schedule's stream, its folded state and the occurrences admitted."""

    def __init__(self, spec: ScheduleSpec) -> None:
        self.spec = spec
        self.schedule_id = spec_id(spec)
        self.records: list[Record] = []
        self.state: ScheduleState | None = None
        self.event_ids: set[str] = set()
        self.admitted: list[Occurrence] = []
        self.decisions: list[ScheduleDecision] = []

    def apply(self, decision: ScheduleDecision) -> ScheduleDecision:
        new = []
        for append in decision.appends:
            assert append.stream_id == f"schedule-{self.schedule_id}"
            assert append.expected_version == len(self.records), "version conflict"
            for offset, event in enumerate(append.events, start=1):
                assert event.event_id not in self.event_ids, f"duplicate id {event.event_id}"
                assert len(event.event_id) == 36
                self.event_ids.add(event.event_id)
                new.append(
                    Record(
                        event_id=event.event_id,
                        stream_id=append.stream_id,
                        stream_version=append.expected_version + offset,
                        global_position=len(self.records) + offset,
                        type=event.type,
                        data=orjson.loads(orjson.dumps(event.data)),
                        metadata=orjson.loads(orjson.dumps(event.metadata)),
                    )
                )
        self.records.extend(new)
        self.state = fold_schedule(new, self.state)
        if decision.admit is not None:
            self.admitted.append(decision.admit)
        self.decisions.append(decision)
        return decision

    def arm(self, published_at_ms: int) -> ScheduleDecision:
        return self.apply(arm(self.spec, self.schedule_id, published_at_ms, self.state))

    def cycle(self, now_ms: int, grace_ms: int = EDGE_GRACE_MS, **kwargs) -> ScheduleDecision:
        assert self.state is not None
        return self.apply(decide_due(self.state, self.spec, now_ms, grace_ms, **kwargs))

    @property
    def fired_at(self) -> list[int]:
        return [occurrence.scheduled_for_ms for occurrence in self.admitted]
