"""Allowed status changes of a Run, a StepRun, a Task Attempt and a lease
(docs/DESIGN.md, "States").

The fold refuses any logged change these tables do not allow; the decision
builder refuses to write one.
"""

from __future__ import annotations

from types import MappingProxyType

# --- Run ------------------------------------------------------------------------------

RUN_RUNNING = "running"
RUN_TERMINAL = frozenset({"succeeded", "failed", "cancelled", "timed_out"})
RUN_TRANSITIONS = MappingProxyType({RUN_RUNNING: RUN_TERMINAL})

CANCEL_REASONS = ("user", "policy", "shutdown", "reconcile", "timeout")

# --- StepRun --------------------------------------------------------------------------

STEP_PENDING = "pending"
STEP_READY = "ready"
STEP_WAITING_APPROVAL = "waiting_approval"
STEP_RUNNING = "running"
STEP_LOST = "lost"
STEP_SUCCEEDED = "succeeded"
STEP_TERMINAL = frozenset({"succeeded", "failed", "cancelled", "timed_out", "skipped"})
STEP_STATUSES = frozenset(
    {STEP_PENDING, STEP_READY, STEP_WAITING_APPROVAL, STEP_RUNNING, STEP_LOST} | STEP_TERMINAL
)
STEP_TRANSITIONS = MappingProxyType(
    {
        STEP_PENDING: frozenset({"ready", "skipped", "cancelled"}),
        STEP_READY: frozenset(
            {"ready", "waiting_approval", "running", "failed", "skipped", "cancelled", "timed_out"}
        ),
        STEP_WAITING_APPROVAL: frozenset({"ready", "running", "cancelled", "timed_out"}),
        STEP_RUNNING: frozenset({"lost", "succeeded", "failed", "cancelled", "timed_out"}),
        STEP_LOST: frozenset({"ready", "failed", "cancelled"}),
    }
)
# A need in one of these statuses can never succeed: its dependants are skipped.
STEP_NOT_SUCCEEDED = frozenset({"failed", "cancelled", "timed_out", "skipped"})

# --- Task Attempt ---------------------------------------------------------------------

ATTEMPT_CLAIMED = "claimed"
ATTEMPT_STARTING = "starting"
ATTEMPT_RUNNING = "running"
ATTEMPT_SUCCEEDED = "succeeded"
ATTEMPT_INTERRUPTED = "interrupted"  # its host stopped it: the step runs again
ATTEMPT_TERMINAL = frozenset(
    {"succeeded", "failed", "cancelled", "timed_out", "lost", ATTEMPT_INTERRUPTED}
)
ATTEMPT_ACTIVE = frozenset({ATTEMPT_CLAIMED, ATTEMPT_STARTING, ATTEMPT_RUNNING})
ATTEMPT_TRANSITIONS = MappingProxyType(
    {
        ATTEMPT_CLAIMED: frozenset({"starting", "cancelled", "timed_out", "lost"}),
        ATTEMPT_STARTING: frozenset(
            {"running", "succeeded", "failed", "cancelled", "timed_out", "lost", "interrupted"}
        ),
        ATTEMPT_RUNNING: frozenset(
            {"succeeded", "failed", "cancelled", "timed_out", "lost", "interrupted"}
        ),
    }
)
EXECUTORS = ("local_process", "remote_worker")

# --- Lease ----------------------------------------------------------------------------

LEASE_LEASED = "leased"
LEASE_COMPLETED = "completed"
LEASE_RELEASED = "released"
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
