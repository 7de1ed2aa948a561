"""Load a Run's streams inside a transaction and fold them into the aggregate."""

from __future__ import annotations

from domain.aggregate import fold
from domain.errors import NotFound


def run_stream(run_id: str) -> str:
    return f"run-{run_id}"


def steps_stream(run_id: str) -> str:
    return f"steps-{run_id}"


def lease_stream(attempt_id: str) -> str:
    return f"lease-{attempt_id}"


def load_aggregate(tx, run_id: str):
    """Read the Run, StepRun and lease streams in `tx` and fold them (SPEC §1).

    On PostgreSQL the Run's stream head is row-locked first. Every writer of the
    Run's streams holds that lock until it commits, so the separate reads below
    (each its own READ COMMITTED snapshot) see one consistent point of the log.
    The cycle took it already without waiting (SPEC §8); a worker write waits.
    """
    if tx.dialect == "postgresql":
        tx.query("SELECT 1 FROM streams WHERE stream_id = ? FOR UPDATE", (run_stream(run_id),))
    run_records = tx.read_stream(run_stream(run_id))
    if not run_records:
        raise NotFound(f"run {run_id!r} does not exist; check the id (qlflow runs lists them)")
    step_records = tx.read_stream(steps_stream(run_id))
    lease_records = {
        attempt_id: tx.read_stream(lease_stream(attempt_id))
        for attempt_id in claimed_attempt_ids(run_records)
    }
    return fold(run_records, step_records, lease_records)


def claimed_attempt_ids(run_records) -> list[str]:
    """Ids of every Attempt the Run's log has claimed, in claim order."""
    return [r.data["attempt_id"] for r in run_records if r.type == "attempt.claimed"]
