"""Read a Run's streams and fold them into the aggregate; the names of the locks
a Run's writers take."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from domain.aggregate import RunAggregate, fold, lease_stream, run_stream, steps_stream
from domain.errors import NotFound
from domain.records import Record
from eventstore.api import Reads, Transaction


def attempt_lock(attempt_id: str) -> str:
    """The name of an Attempt's lock: held by whoever writes its lease stream, taken
    first (before any stream head) by the cycle and by workers alike."""
    return f"attempt:{attempt_id}"


@dataclass(frozen=True, slots=True)
class RunStreams:
    """What one read of a Run's streams returned: the RunEvent and StepRunMutation
    streams and the lease stream of every Attempt the Run has claimed."""

    run_id: str
    run: list[Record]
    steps: list[Record]
    leases: Mapping[str, list[Record]]  # attempt id -> its lease stream

    def versions(self) -> dict[str, int]:
        """The head version read of every stream (0: it did not exist)."""
        streams = {run_stream(self.run_id): self.run, steps_stream(self.run_id): self.steps}
        streams.update((lease_stream(a), records) for a, records in self.leases.items())
        return {stream_id: len(records) for stream_id, records in streams.items()}

    def fold(self) -> RunAggregate:
        """The aggregate these records make."""
        return fold(self.run, self.steps, self.leases)


def read_run_streams(tx: Reads, run_id: str) -> RunStreams:
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
