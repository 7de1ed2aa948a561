"""Reading one Run's streams from the log: its run and steps streams and the lease
stream of each of its Attempts, all cut at one head position (what each stream
holds: docs/DESIGN.md, "Streams")."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from domain.errors import InvalidInput
from domain.event_types import EventType
from domain.records import Record
from domain.streams import lease_stream, run_stream, steps_stream
from eventstore.api import EventStore
from projections import retention


@dataclass(frozen=True, slots=True)
class RunLog:
    """A Run's records up to `position`: run and steps streams, and each Attempt's lease
    stream (attempts in claim order)."""

    run_id: str
    position: int
    run: tuple[Record, ...]
    steps: tuple[Record, ...]
    leases: Mapping[str, tuple[Record, ...]]

    def merged(self) -> list[Record]:
        """Every record of the Run, in global position order."""
        records = [*self.run, *self.steps, *(r for rs in self.leases.values() for r in rs)]
        return sorted(records, key=lambda r: r.global_position)


def claimed_attempts(run_records: Sequence[Record]) -> list[Record]:
    """The `attempt.claimed` records of a run stream, in claim order."""
    return [r for r in run_records if r.type == EventType.ATTEMPT_CLAIMED]


def read_run_log(store: EventStore, run_id: str) -> RunLog:
    """The Run's streams as of the current head (NotFound if the Run does not exist)."""
    if not isinstance(run_id, str) or not run_id:
        raise InvalidInput(
            "run_id", "non-empty string", f"run_id must be a non-empty string, got {run_id!r}"
        )
    head = store.head_position()

    def upto(records: Sequence[Record]) -> tuple[Record, ...]:
        return tuple(r for r in records if r.global_position <= head)

    run = upto(store.read_stream(run_stream(run_id)))
    if not run:
        raise retention.run_not_found(store, run_id)
    attempts = [r.data["attempt_id"] for r in claimed_attempts(run)]
    return RunLog(
        run_id=run_id,
        position=head,
        run=run,
        steps=upto(store.read_stream(steps_stream(run_id))),
        leases={a: upto(store.read_stream(lease_stream(a))) for a in attempts},
    )
