"""Reading a Run's streams whole: its RunEvents, its StepRunMutations and the lease
stream of every Attempt its RunEvents claimed, for many Runs in two queries. Every
layer that folds a Run from its whole log (the writers without a base, the candidate
index, snapshots' checks, the audit queries) reads it here (docs/DESIGN.md "Streams").
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import NamedTuple

from domain.event_types import EventType
from domain.records import Record
from domain.streams import lease_stream, run_stream, steps_stream
from eventstore.api import Reads


class WholeRun(NamedTuple):
    """One Run's streams: `fold(*whole_run)` makes its aggregate."""

    run: list[Record]
    steps: list[Record]
    leases: Mapping[str, list[Record]]  # attempt id -> its lease stream, in claim order


def claims(run_records: Iterable[Record]) -> list[Record]:
    """The `attempt.claimed` records among a Run's RunEvents, in claim order."""
    return [r for r in run_records if r.type == EventType.ATTEMPT_CLAIMED]


def claimed_attempt_ids(run_records: Iterable[Record]) -> list[str]:
    """Ids of every Attempt the Run's records claim, in claim order."""
    return [r.data["attempt_id"] for r in claims(run_records)]


def read_whole_runs(
    reads: Reads, run_ids: Iterable[str], upto_position: int | None = None
) -> dict[str, WholeRun]:
    """Each existing Run's streams (only records at or before `upto_position`, where
    given), in run id order: two queries in all. A Run that does not exist is left out."""
    ordered = sorted(set(run_ids))
    if not ordered:
        return {}
    found = reads.read_streams([s for r in ordered for s in (run_stream(r), steps_stream(r))])
    runs = {r: _upto(found[run_stream(r)], upto_position) for r in ordered}
    claimed = {run_id: claimed_attempt_ids(records) for run_id, records in runs.items() if records}
    wanted = [lease_stream(a) for attempt_ids in claimed.values() for a in attempt_ids]
    leases = reads.read_streams(wanted) if wanted else {}
    return {
        run_id: WholeRun(
            runs[run_id],
            _upto(found[steps_stream(run_id)], upto_position),
            {a: _upto(leases[lease_stream(a)], upto_position) for a in attempt_ids},
        )
        for run_id, attempt_ids in claimed.items()
    }


def _upto(records: list[Record], position: int | None) -> list[Record]:
    if position is None:
        return records
    return [r for r in records if r.global_position <= position]
