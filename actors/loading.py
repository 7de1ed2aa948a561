"""Read Runs' streams and fold them into aggregates, many Runs at once; the names of
the locks a Run's writers take.

A Run is read from the newest base this process can trust — the aggregate its own
last commit left (`actors.aggregate_cache`), else the stored snapshot
(`projections.snapshots`) — plus only the records after the base's stream versions;
without a base, every stream of the Run (docs/DESIGN.md, "Snapshots"). A base is
checked before it is used: its Run head event must be the one the log holds at its
version, and the tail must fold onto it; one that does not is never used.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from actors.aggregate_cache import AggregateCache
from domain.aggregate import RunAggregate, extend, fold
from domain.errors import CorruptionError, NotFound
from domain.records import Record
from domain.snapshot import aggregate_from_snapshot
from domain.streams import lease_stream, run_stream, steps_stream
from eventstore.api import Reads
from projections import snapshots
from projections.run_streams import claimed_attempt_ids, read_whole_runs


def slot_lock(slot: str) -> str:
    """The name of a limit slot's lock (docs/DESIGN.md "Flow control"): held by whoever
    counts its holders to take one, taken with (after, in key order) the Attempt's."""
    return f"slot:{slot}"


ATTEMPT_LOCK = "attempt:"  # an Attempt's lock name: this and its id


def attempt_lock(attempt_id: str) -> str:
    """The name of an Attempt's lock: held by whoever writes its lease stream, taken
    first (before any stream head) by the cycle and by workers alike."""
    return f"{ATTEMPT_LOCK}{attempt_id}"


@dataclass(frozen=True, slots=True)
class RunStreams:
    """What one read of a Run's streams returned: the RunEvent and StepRunMutation
    streams and the lease stream of every Attempt the Run has claimed — whole, or
    only the records after `base` (a snapshot or this process's last commit)."""

    run_id: str
    run: list[Record]
    steps: list[Record]
    leases: Mapping[str, list[Record]]  # attempt id -> its lease stream (after `base`)
    base: RunAggregate | None = None
    folded: RunAggregate | None = None  # the fold, when it was made while reading

    def versions(self) -> dict[str, int]:
        """The head version read of every stream (0: it did not exist)."""
        base = self.base
        run_v, steps_v = (base.version, base.steps_version) if base else (0, 0)
        leases_v = base.lease_versions if base else {}
        versions = {
            run_stream(self.run_id): run_v + len(self.run),
            steps_stream(self.run_id): steps_v + len(self.steps),
        }
        versions.update(
            (lease_stream(a), leases_v.get(a, 0) + len(records))
            for a, records in self.leases.items()
        )
        return versions

    def records_read(self) -> int:
        """How many records this read returned."""
        return len(self.run) + len(self.steps) + sum(len(r) for r in self.leases.values())

    def fold(self) -> RunAggregate:
        """The aggregate these records make."""
        if self.folded is not None:
            return self.folded
        if self.base is not None:
            if not self.records_read():
                return self.base
            return extend(self.base, self.run, self.steps, self.leases)
        return fold(self.run, self.steps, self.leases)


def read_runs(
    tx: Reads, run_ids: Iterable[str], cache: AggregateCache | None = None
) -> dict[str, RunStreams]:
    """Each existing Run's streams, folded (`RunStreams.folded`), read from its base
    where it has one: a few queries for any number of Runs. A Run that does not exist
    is left out."""
    wanted = sorted(set(run_ids))
    bases = _bases(tx, wanted, cache)
    found: dict[str, RunStreams] = {}
    if bases:
        found.update(_read_after_bases(tx, bases))
    rest = [run_id for run_id in wanted if run_id not in found]
    if rest:
        found.update(_read_whole(tx, rest))
    return {run_id: found[run_id] for run_id in wanted if run_id in found}


def read_run_streams(tx: Reads, run_id: str, cache: AggregateCache | None = None) -> RunStreams:
    """One Run's streams from its base (see `read_runs`). NotFound if it does not exist."""
    found = read_runs(tx, [run_id], cache).get(run_id)
    if found is None:
        raise not_found(run_id)
    return found


def not_found(run_id: str) -> NotFound:
    return NotFound(f"run {run_id!r} does not exist; check the id (qlflow runs lists them)")


# --- reading -----------------------------------------------------------------------------


def _bases(tx: Reads, run_ids: list[str], cache: AggregateCache | None) -> dict[str, RunAggregate]:
    """The base of each Run that has one: this process's last commit, else its snapshot."""
    bases: dict[str, RunAggregate] = {}
    if cache is not None:
        for run_id in run_ids:
            held = cache.get(run_id)
            if held is not None:
                bases[run_id] = held
    missing = [run_id for run_id in run_ids if run_id not in bases]
    for run_id, document in snapshots.read_many(tx, missing).items():
        try:
            base = aggregate_from_snapshot(document)
        except CorruptionError:
            continue  # a snapshot that does not decode is never used; verify names it
        if base.run_id == run_id:
            bases[run_id] = base
    return bases


def _read_after_bases(tx: Reads, bases: Mapping[str, RunAggregate]) -> dict[str, RunStreams]:
    """The records after each base, in one query (two when a tail claims new Attempts).
    The Run stream is read from the base's own head event, which must be the one the log
    holds; a base that does not sit on this log or does not resume is left out."""
    after: dict[str, int] = {}
    for run_id, base in bases.items():
        after[run_stream(run_id)] = base.version - 1
        after[steps_stream(run_id)] = base.steps_version
        for attempt_id in base.attempts:
            after[lease_stream(attempt_id)] = base.lease_versions.get(attempt_id, 0)
    found = tx.read_streams_after(after)
    new_claims: dict[str, list[str]] = {}
    for run_id, base in bases.items():
        head_and_after = found[run_stream(run_id)]
        if head_and_after and head_and_after[0].event_id == base.run.head_event_id:
            new_claims[run_id] = [
                a for a in claimed_attempt_ids(head_and_after[1:]) if a not in base.attempts
            ]
    late = [lease_stream(a) for claims in new_claims.values() for a in claims]
    if late:
        found.update(tx.read_streams_after(dict.fromkeys(late, 0)))
    streams: dict[str, RunStreams] = {}
    for run_id, claims in new_claims.items():
        base = bases[run_id]
        attempt_ids = [*base.attempts, *claims]
        read = RunStreams(
            run_id,
            found[run_stream(run_id)][1:],
            found[steps_stream(run_id)],
            {a: found[lease_stream(a)] for a in attempt_ids},
            base,
        )
        try:
            streams[run_id] = replace(read, folded=read.fold())
        except CorruptionError:
            continue  # a base that does not resume is never used; verify names a snapshot
    return streams


def _read_whole(tx: Reads, run_ids: list[str]) -> dict[str, RunStreams]:
    """Every stream of each Run (`projections.run_streams`). Runs that do not exist are
    left out."""
    return {
        run_id: RunStreams(run_id, *whole) for run_id, whole in read_whole_runs(tx, run_ids).items()
    }
