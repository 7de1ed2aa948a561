"""Read a Run's streams and fold them into the aggregate; the names of the locks
a Run's writers take."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from domain.aggregate import RunAggregate, extend, fold, lease_stream, run_stream, steps_stream
from domain.errors import CorruptionError, NotFound
from domain.records import Record
from domain.snapshot import aggregate_from_snapshot
from eventstore.api import Reads, Transaction
from projections import snapshots


def attempt_lock(attempt_id: str) -> str:
    """The name of an Attempt's lock: held by whoever writes its lease stream, taken
    first (before any stream head) by the cycle and by workers alike."""
    return f"attempt:{attempt_id}"


@dataclass(frozen=True, slots=True)
class RunStreams:
    """What one read of a Run's streams returned: the RunEvent and StepRunMutation
    streams and the lease stream of every Attempt the Run has claimed — whole, or
    only the records after `base`, the Run's snapshot (docs/DESIGN.md, "Snapshots")."""

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
            return extend(self.base, self.run, self.steps, self.leases)
        return fold(self.run, self.steps, self.leases)


def read_run_streams(tx: Reads, run_id: str) -> RunStreams:
    """Read the Run's streams after its snapshot and fold them onto it; without a
    snapshot that checks (its digest, its Run head event at its version) and resumes,
    every stream of the Run, folded from scratch. NotFound if the Run does not exist."""
    base = _snapshot(tx, run_id)
    if base is not None:
        head_and_after = tx.read_stream(run_stream(run_id), base.version - 1)
        if not head_and_after or head_and_after[0].event_id != base.run.head_event_id:
            return read_whole_run_streams(tx, run_id)  # it does not sit on this log
        run_records = head_and_after[1:]
        attempt_ids = [*base.attempts, *claimed_attempt_ids(run_records)]
        after = {lease_stream(a): base.lease_versions.get(a, 0) for a in attempt_ids}
        after[steps_stream(run_id)] = base.steps_version
        found = tx.read_streams_after(after)
        streams = RunStreams(
            run_id,
            run_records,
            found[steps_stream(run_id)],
            {a: found[lease_stream(a)] for a in attempt_ids},
            base,
        )
        try:
            return replace(streams, folded=streams.fold())
        except CorruptionError:
            pass  # a snapshot that does not resume is never used; verify names it
    return read_whole_run_streams(tx, run_id)


def _snapshot(tx: Reads, run_id: str) -> RunAggregate | None:
    document = snapshots.read(tx, run_id)
    if document is None:
        return None
    try:
        base = aggregate_from_snapshot(document)
    except CorruptionError:
        return None
    return base if base.run_id == run_id else None


def read_whole_run_streams(tx: Reads, run_id: str) -> RunStreams:
    """Read every stream of the Run: two queries (the lease streams named by the
    RunEvents' claims are read in the second). NotFound if the Run does not exist."""
    run_id_stream, steps_id_stream = run_stream(run_id), steps_stream(run_id)
    found = tx.read_streams([run_id_stream, steps_id_stream])
    run_records = found[run_id_stream]
    if not run_records:
        raise NotFound(f"run {run_id!r} does not exist; check the id (qlflow runs lists them)")
    attempt_ids = claimed_attempt_ids(run_records)
    leases = tx.read_streams([lease_stream(a) for a in attempt_ids]) if attempt_ids else {}
    return RunStreams(
        run_id,
        run_records,
        found[steps_id_stream],
        {a: leases[lease_stream(a)] for a in attempt_ids},
    )


def load_aggregate(tx: Transaction, run_id: str) -> RunAggregate:
    """Read the Run's streams in `tx` and fold them.

    The Run's stream head is locked first, waiting for it (bounded by the store's
    lock timeout). Every writer of the Run's streams holds that lock until it
    commits, so the reads below see one consistent point of the log even where each
    statement reads its own snapshot. Worker writes use this; the cycle reads without
    locks and checks versions when it writes (actors.workflow).
    """
    tx.lock_heads([run_stream(run_id)], wait=True)
    return read_run_streams(tx, run_id).fold()


def claimed_attempt_ids(run_records: Sequence[Record]) -> list[str]:
    """Ids of every Attempt the Run's log has claimed, in claim order."""
    return [r.data["attempt_id"] for r in run_records if r.type == "attempt.claimed"]
