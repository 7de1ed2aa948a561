"""What a host loop (`Driver`, `WorkerPool`) needs of an executor: run one leased
Attempt, say what still runs, and stop or kill it when the host leaves. The local
command executor and the python Task router both are one. The host may hand it a
`Completer`: how an Attempt's outcome is recorded (the pool's takes the worker's
next work with it)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from qlflow.executor.reports import AttemptReport, RunningProcess
from qlflow.runtime import Lease


class Completer(Protocol):
    """Records an Attempt's outcome as `Runtime.complete` does; returns the status."""

    def __call__(
        self,
        lease: Lease,
        outcome: str,
        *,
        result_code: str | None,
        output: Mapping[str, Any] | None,
        execution: Mapping[str, Any] | None,
    ) -> str: ...


class Executor(Protocol):
    """The executor seam of a host."""

    completer: Completer | None  # None: `Runtime.complete`

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
