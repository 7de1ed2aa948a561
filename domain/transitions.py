"""Allowed status changes of a Run, a StepRun, a Task Attempt and a lease
(docs/DESIGN.md, "States").

The fold refuses any logged change these tables do not allow; the decision
builder refuses to write one.
"""

from __future__ import annotations

from enum import StrEnum
from types import MappingProxyType


class Status(StrEnum):
    """Every status word a Run, a StepRun, a Task Attempt or a lease can hold, each
    declared once; the sets below say which of them each entity may hold."""

    PENDING = "pending"
    READY = "ready"
    WAITING_APPROVAL = "waiting_approval"
    CLAIMED = "claimed"
    STARTING = "starting"
    RUNNING = "running"
    LOST = "lost"
    INTERRUPTED = "interrupted"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    TIMED_OUT = "timed_out"
    SKIPPED = "skipped"
    LEASED = "leased"
    COMPLETED = "completed"
    RELEASED = "released"

    def __repr__(self) -> str:  # as the plain word it is in the log and in messages
        return repr(self.value)


_S = Status
Transitions = MappingProxyType[str, frozenset[str]]  # from status -> the statuses it may go to

# --- Run ------------------------------------------------------------------------------

RUN_RUNNING = _S.RUNNING
RUN_TERMINAL = frozenset({_S.SUCCEEDED, _S.FAILED, _S.CANCELLED, _S.TIMED_OUT})
RUN_TRANSITIONS: Transitions = MappingProxyType({RUN_RUNNING: RUN_TERMINAL})

CANCEL_REASONS = ("user", "policy", "shutdown", "reconcile", "timeout")

# --- StepRun --------------------------------------------------------------------------

STEP_PENDING = _S.PENDING
STEP_READY = _S.READY
STEP_WAITING_APPROVAL = _S.WAITING_APPROVAL
STEP_RUNNING = _S.RUNNING
STEP_LOST = _S.LOST
STEP_SUCCEEDED = _S.SUCCEEDED
STEP_TERMINAL = frozenset({_S.SUCCEEDED, _S.FAILED, _S.CANCELLED, _S.TIMED_OUT, _S.SKIPPED})
STEP_STATUSES = frozenset(
    {STEP_PENDING, STEP_READY, STEP_WAITING_APPROVAL, STEP_RUNNING, STEP_LOST} | STEP_TERMINAL
)
STEP_TRANSITIONS: Transitions = MappingProxyType(
    {
        STEP_PENDING: frozenset({_S.READY, _S.SKIPPED, _S.CANCELLED}),
        STEP_READY: frozenset(
            {
                _S.READY,
                _S.WAITING_APPROVAL,
                _S.RUNNING,
                _S.FAILED,
                _S.SKIPPED,
                _S.CANCELLED,
                _S.TIMED_OUT,
            }
        ),
        STEP_WAITING_APPROVAL: frozenset({_S.READY, _S.RUNNING, _S.CANCELLED, _S.TIMED_OUT}),
        STEP_RUNNING: frozenset({_S.LOST, _S.SUCCEEDED, _S.FAILED, _S.CANCELLED, _S.TIMED_OUT}),
        STEP_LOST: frozenset({_S.READY, _S.FAILED, _S.CANCELLED}),
    }
)
# A need in one of these statuses can never succeed: its dependants are skipped.
STEP_NOT_SUCCEEDED = frozenset({_S.FAILED, _S.CANCELLED, _S.TIMED_OUT, _S.SKIPPED})

# --- Task Attempt ---------------------------------------------------------------------

ATTEMPT_CLAIMED = _S.CLAIMED
ATTEMPT_STARTING = _S.STARTING
ATTEMPT_RUNNING = _S.RUNNING
ATTEMPT_SUCCEEDED = _S.SUCCEEDED
ATTEMPT_LOST = _S.LOST
ATTEMPT_INTERRUPTED = _S.INTERRUPTED  # its host stopped it: the step runs again
ATTEMPT_TERMINAL = frozenset(
    {_S.SUCCEEDED, _S.FAILED, _S.CANCELLED, _S.TIMED_OUT, _S.LOST, ATTEMPT_INTERRUPTED}
)
ATTEMPT_ACTIVE = frozenset({ATTEMPT_CLAIMED, ATTEMPT_STARTING, ATTEMPT_RUNNING})
# not recorded running: a lease of one may still be in no worker's hands (a lost answer)
ATTEMPT_NOT_YET_RUNNING = frozenset({ATTEMPT_CLAIMED, ATTEMPT_STARTING})
ATTEMPT_TRANSITIONS: Transitions = MappingProxyType(
    {
        ATTEMPT_CLAIMED: frozenset({_S.STARTING, _S.CANCELLED, _S.TIMED_OUT, _S.LOST}),
        ATTEMPT_STARTING: frozenset(
            {
                _S.RUNNING,
                _S.SUCCEEDED,
                _S.FAILED,
                _S.CANCELLED,
                _S.TIMED_OUT,
                _S.LOST,
                _S.INTERRUPTED,
            }
        ),
        ATTEMPT_RUNNING: frozenset(
            {_S.SUCCEEDED, _S.FAILED, _S.CANCELLED, _S.TIMED_OUT, _S.LOST, _S.INTERRUPTED}
        ),
    }
)
EXECUTORS = ("local_process", "remote_worker")

# --- Lease ----------------------------------------------------------------------------

LEASE_LEASED = _S.LEASED
LEASE_COMPLETED = _S.COMPLETED
LEASE_RELEASED = _S.RELEASED
RELEASE_REASONS = ("declined", "shutdown", "start_failed", "capacity_changed", "lease_expired")
MIN_LEASE_TTL_MS = 5_000
MAX_LEASE_TTL_MS = 600_000

# --- limits and result codes ------------------------------------------------------------

MAX_ATTEMPTS_PER_STEP = 64
MAX_ATTEMPTS_PER_RUN = 8_192

DEPENDENCY_NOT_SUCCEEDED = "dependency_not_succeeded"
EXECUTION_FAILED = "execution_failed"
EXECUTION_CANCELLED = "execution_cancelled"
EXECUTION_TIMED_OUT = "execution_timed_out"
LEASE_EXPIRED = "lease_expired"
ATTEMPTS_EXHAUSTED = "attempts_exhausted"
WORKER_SHUTDOWN = "worker_shutdown"  # the host stopped the step: it did not fail by itself
INTERRUPTED_TOO_OFTEN = "interrupted_too_often"
STEP_TIMEOUT = "step_timeout"  # the host stopped the Attempt at its step's timeout_ms
MAX_INTERRUPTIONS = 3  # per step; the next one fails it (docs/DESIGN.md, "Interruptions")
WORKFLOW_CANCELLED = "workflow_cancelled"
WORKFLOW_TIMED_OUT = "workflow_timed_out"


# Under a plan v2 retry policy a reported failure sends the StepRun back to ready; so
# does an interruption by the step's host (any plan).
RETRY_CHANGE = (STEP_RUNNING, STEP_READY)


def step_change_allowed(
    from_status: str, to_status: str, *, retry: bool = False, interrupted: bool = False
) -> bool:
    """True when a StepRun may go from `from_status` to `to_status`; `retry` (a
    reported failure with attempts left) and `interrupted` (its host stopped it)
    allow running -> ready (docs/DESIGN.md, "Retries" and "Interruptions")."""
    if (retry or interrupted) and (from_status, to_status) == RETRY_CHANGE:
        return True
    return to_status in STEP_TRANSITIONS.get(from_status, ())


def attempt_change_allowed(from_status: str, to_status: str) -> bool:
    """True when the status rules (docs/DESIGN.md, "States") allow a Task Attempt to
    go from `from_status` to `to_status`."""
    return to_status in ATTEMPT_TRANSITIONS.get(from_status, ())


def run_change_allowed(from_status: str, to_status: str) -> bool:
    """True when a Run may go from `from_status` to `to_status` (running → terminal)."""
    return to_status in RUN_TRANSITIONS.get(from_status, ())
