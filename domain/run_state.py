"""The folded state of one Run: its Run, StepRuns, Task Attempts and their leases,
as `domain.aggregate.fold` builds it (immutable; decisions read it, never change it)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from domain.intent import cancel_intent
from domain.plan import ExecutionPlan
from domain.transitions import (
    ATTEMPT_ACTIVE,
    LEASE_LEASED,
    RUN_TERMINAL,
    STEP_TERMINAL,
)

# --- the aggregate ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LeaseState:
    """The latest lease of one Attempt.

    `version` is the fencing token: the lease stream's version after the last
    grant or renewal. The lease is live while `status == "leased"` and
    `now_ms < expires_at_ms`.
    """

    lease_id: str
    version: int
    granted_version: int
    worker_id: str
    status: str  # leased | completed | released
    granted_at_ms: int
    ttl_ms: int
    expires_at_ms: int
    outcome: str | None = None
    release_reason: str | None = None

    def is_live(self, now_ms: int) -> bool:
        """True while the lease is held and not expired at `now_ms`."""
        return self.status == LEASE_LEASED and now_ms < self.expires_at_ms


@dataclass(frozen=True, slots=True)
class AttemptState:
    """One Task Attempt with its immutable admission and its lease."""

    attempt_id: str
    step_key: str
    step_run_id: str
    step_epoch: int  # the ready epoch it was admitted against
    attempt_number: int
    admission: Mapping[str, Any]
    status: str
    lease: LeaseState | None = None
    lease_ids: tuple[str, ...] = ()  # every lease ever granted, oldest first
    started_lease_id: str | None = None  # the lease it crossed the start barrier under
    # when it crossed it, where its step has a timeout (docs/DESIGN.md "Step timeouts")
    started_at_ms: int | None = None
    worker_id: str | None = None
    result_code: str | None = None
    reported_outcome: str | None = None
    output: Mapping[str, Any] | None = None
    ended_lease_id: str | None = None

    @property
    def is_active(self) -> bool:
        return self.status in ATTEMPT_ACTIVE

    def has_live_lease(self, now_ms: int) -> bool:
        return self.lease is not None and self.lease.is_live(now_ms)


@dataclass(frozen=True, slots=True)
class StepRunState:
    """One StepRun: its status, epoch (bumped by every change) and its Attempts."""

    step_run_id: str
    key: str
    status: str
    epoch: int
    result_code: str | None
    needs: tuple[str, ...]
    task_id: str
    task_ref: str
    source_digest: str
    attempt_ids: tuple[str, ...] = ()
    retry_at_ms: int | None = None  # a ready StepRun waiting for its retry (plan v2)
    # a rerun reused it (docs/DESIGN.md "Reruns"): {"run_id", "attempt_id", "output"}
    reused_from: Mapping[str, Any] | None = None

    @property
    def is_terminal(self) -> bool:
        return self.status in STEP_TERMINAL


@dataclass(frozen=True, slots=True)
class RunState:
    """The Run: status, version (= RunEvent count), plan, deadline and cancel intent."""

    run_id: str
    status: str
    version: int
    plan: ExecutionPlan
    admission_key: str
    admitted_at_ms: int
    timeout_ms: int | None
    deadline_ms: int | None
    cancel_requested_at_ms: int | None
    cancel_reason: str | None
    result_code: str | None
    error_code: str | None
    head_event_id: str
    # waiting in its Workflow's queue for a slot (docs/DESIGN.md "Flow control"): no
    # step is claimed until `workflow.dequeued`
    queued: bool = False

    @property
    def is_terminal(self) -> bool:
        return self.status in RUN_TERMINAL


@dataclass(frozen=True, slots=True)
class RunAggregate:
    """Everything the decisions need to know about one Run, immutable.

    `steps` is keyed by step key in plan order (sorted); `attempts` by attempt id
    in claim order; `lease_versions` holds each lease stream's head version;
    `topo_order` lists the step keys with every need before its dependants.
    """

    run: RunState
    steps: Mapping[str, StepRunState]
    attempts: Mapping[str, AttemptState]
    steps_version: int
    lease_versions: Mapping[str, int]
    topo_order: tuple[str, ...]

    @property
    def run_id(self) -> str:
        return self.run.run_id

    @property
    def version(self) -> int:
        return self.run.version

    @property
    def plan(self) -> ExecutionPlan:
        return self.run.plan

    def active_attempts(self) -> tuple[AttemptState, ...]:
        """Attempts that are claimed, starting or running, in claim order."""
        return tuple(a for a in self.attempts.values() if a.status in ATTEMPT_ACTIVE)


def effective_intent(aggregate: RunAggregate, now_ms: int) -> tuple[str, int] | None:
    """The Run's cancel intent as (reason, cancel time), or None (docs/DESIGN.md,
    "Cancellation convergence").

    A recorded intent wins; otherwise a reached deadline is a `timeout` intent
    whose cancel time is the deadline itself (the rule is `domain.intent`'s).
    """
    return cancel_intent(aggregate.run, now_ms)
