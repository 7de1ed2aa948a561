"""Reading one Run's streams from the log: its run and steps streams and the lease
stream of each of its Attempts, all cut at one head position (what each stream
holds: docs/DESIGN.md, "Streams")."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from domain.errors import InvalidInput
from domain.records import Record
from eventstore.api import EventStore
from projections import retention
from projections.run_streams import read_whole_runs


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


def read_run_log(store: EventStore, run_id: str) -> RunLog:
    """The Run's streams as of the current head (NotFound if the Run does not exist)."""
    if not isinstance(run_id, str) or not run_id:
        raise InvalidInput(
            "run_id", "non-empty string", f"run_id must be a non-empty string, got {run_id!r}"
        )
    head = store.head_position()
    whole = read_whole_runs(store, [run_id], upto_position=head).get(run_id)
    if whole is None:
        raise retention.run_not_found(store, run_id)
    return RunLog(
        run_id=run_id,
        position=head,
        run=tuple(whole.run),
        steps=tuple(whole.steps),
        leases={a: tuple(records) for a, records in whole.leases.items()},
    )
