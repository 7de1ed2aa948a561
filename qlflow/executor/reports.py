"""What the local executor tells its host: how an Attempt ended, and what still runs."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from qlflow.runtime import Lease


@dataclass(frozen=True, slots=True)
class AttemptReport:
    """How one Attempt ended on this executor. `recorded_status` is what `complete`
    recorded (None when the lease was lost and nothing could be recorded)."""

    attempt_id: str
    run_id: str
    step_key: str
    recorded_status: str | None
    exit_code: int | None
    pid: int | None
    log_path: str
    stopped_by: str | None = None
    error: str | None = None


@dataclass(frozen=True, slots=True)
class RunningProcess:
    """A live subprocess of this executor (for "what is left running")."""

    attempt_id: str
    run_id: str
    step_key: str
    pid: int
    started_monotonic: float
    lease_expires_at_ms: int


def report(
    lease: Lease,
    status: str | None,
    exit_code: int | None,
    pid: int | None,
    log_path: Path,
    *,
    stopped_by: str | None = None,
    error: str | None = None,
) -> AttemptReport:
    """The report of `lease`'s Attempt."""
    return AttemptReport(
        lease.attempt_id,
        lease.run_id,
        lease.step_key,
        status,
        exit_code,
        pid,
        str(log_path),
        stopped_by,
        error,
    )
