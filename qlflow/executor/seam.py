"""What a host loop (`Driver`, `WorkerPool`) needs of an executor: run one leased
Attempt, say what still runs, and stop or kill it when the host leaves. The local
command executor and the python Task router both are one."""

from __future__ import annotations

from typing import Protocol

from qlflow.executor.reports import AttemptReport, RunningProcess
from qlflow.runtime import Lease


class Executor(Protocol):
    """The executor seam of a host."""

    @property
    def kill_after_s(self) -> float:
        """How long a stopped step is given before it is ended."""
        ...

    def execute(self, lease: Lease) -> AttemptReport:
        """Run one leased Attempt to its end and record its outcome under the lease."""
        ...

    def running(self) -> list[RunningProcess]:
        """What runs right now."""
        ...

    def renew_now(self, run_id: str | None = None) -> None:
        """Renew the leases now, so a new cancel intent reaches the steps at once."""
        ...

    def stop_all(self, reason: str = "shutdown") -> None:
        """Ask every step to stop; the ones that can be are ended after a grace."""
        ...

    def kill_all(self) -> None:
        """End every step now (the host is leaving without waiting)."""
        ...

    def close(self) -> None:
        """Kill whatever is still running. Idempotent."""
        ...
