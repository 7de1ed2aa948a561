"""A Run's timeline and one Step's history: the Run's records in position order,
each with who wrote it, when, which step and Attempt it is about, and a sentence."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from domain import streams
from domain.errors import NotFound
from eventstore.api import EventStore
from projections.audit.run_log import RunLog, read_run_log
from projections.audit.summaries import summarize
from projections.run_streams import claims


@dataclass(frozen=True, slots=True)
class TimelineEntry:
    """One record of a Run, made readable."""

    position: int
    stream_id: str
    version: int
    at_ms: int | None
    type: str
    actor: str | None
    step_key: str | None
    attempt_id: str | None
    summary: str

    def to_dict(self) -> dict[str, Any]:
        """The entry as a JSON object."""
        return asdict(self)


def timeline(store: EventStore, run_id: str, *, mutations: bool = True) -> list[TimelineEntry]:
    """Every record of the Run (run, steps and lease streams) in position order.
    `mutations=False` leaves out the StepRunMutations, which repeat their step.* event."""
    log = read_run_log(store, run_id)
    return _entries(log, mutations=mutations)


def step_history(store: EventStore, run_id: str, step_key: str) -> list[TimelineEntry]:
    """The records about one Step: its StepRun's changes and mutations, its Attempts
    and their leases, in position order."""
    log = read_run_log(store, run_id)
    plan_keys = {s["key"] for s in log.run[0].data["plan"]["steps"]}
    if step_key not in plan_keys:
        raise NotFound(
            f"run {run_id!r} has no step {step_key!r}; its steps are {sorted(plan_keys)}"
        )
    return [e for e in _entries(log, mutations=True) if e.step_key == step_key]


def _entries(log: RunLog, *, mutations: bool) -> list[TimelineEntry]:
    step_of_attempt = {
        record.data["attempt_id"]: record.data["step_key"] for record in claims(log.run)
    }
    entries = []
    for record in log.merged():
        category = streams.category(record.stream_id)
        if not mutations and category == streams.STEPS:
            continue
        data = record.data
        attempt_id = data.get("attempt_id")
        if category == streams.LEASE:
            attempt_id = streams.entity_id(record.stream_id)
        step_key = data.get("step_key") or step_of_attempt.get(attempt_id or "")
        entries.append(
            TimelineEntry(
                position=record.global_position,
                stream_id=record.stream_id,
                version=record.stream_version,
                at_ms=record.metadata.get("at_ms"),
                type=record.type,
                actor=record.metadata.get("actor"),
                step_key=step_key,
                attempt_id=attempt_id,
                summary=summarize(record, step_key),
            )
        )
    return entries
