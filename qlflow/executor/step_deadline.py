"""When a host asks whether an Attempt ran past its step's timeout (docs/DESIGN.md,
"Step timeouts").

The host does not decide it: its lease carries the step's deadline on the store's
clock (`Lease.step_deadline_ms`), and once the host's estimate of that clock reaches
it, the host renews at once; the renewal's answer (`Lease.step_timed_out`) is the
domain's. Both executors then stop the step the way they stop a cancelled one and
complete it `timed_out`. A renewal that says "not yet" (the host's estimate ran
ahead) is asked again a little later, never in a busy loop.
"""

from __future__ import annotations

from qlflow.runtime import Lease, Runtime

STEP_TIMEOUT = "step_timeout"  # the stop's reason: `stopped_by` of the Attempt's execution
ASK_AGAIN_S = 0.2  # after a renewal found the Attempt not yet past its deadline


class StepDeadline:
    """One supervised Attempt's deadline: when to ask, and whether it is time to."""

    def __init__(self) -> None:
        self._asked_at: float | None = None

    def wait_s(self, rt: Runtime, lease: Lease, now: float) -> float | None:
        """Seconds until this host should ask again (None: no deadline to watch)."""
        if lease.step_deadline_ms is None or lease.step_timed_out:
            return None
        remaining_s = (lease.step_deadline_ms - rt.clock_ms()) / 1000
        if self._asked_at is not None:
            remaining_s = max(remaining_s, self._asked_at + ASK_AGAIN_S - now)
        return max(0.0, remaining_s)

    def due(self, rt: Runtime, lease: Lease, now: float) -> bool:
        """Whether to renew now to ask the domain; marks the question asked."""
        wait = self.wait_s(rt, lease, now)
        if wait is None or wait > 0:
            return False
        self._asked_at = now
        return True
