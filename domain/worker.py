"""Worker transitions under a lease fence (docs/DESIGN.md, "Fencing"; docs/EVENTS.md,
the lease stream).

A worker leases a claimed Attempt (`grant_lease`), crosses the start barrier
(`mark_starting`: Attempt `starting`, StepRun `ready → running`, written before
anything is spawned), reports `mark_running`, keeps the lease alive (`renew`,
whose answer carries `stop_requested` under cancel intent and `step_timed_out` past
the step's timeout), and ends with `complete` (outcome succeeded | failed |
interrupted | timed_out — recorded as cancelled / timed_out under cancel intent) or
gives a not-yet-started claim back (`release`).

Every write presents (lease_id, version). Anything but the current, live lease
of the Attempt is a `FenceError` saying which: unknown lease, replaced lease,
stale version, expired, completed or released lease, Run terminal. The same
write repeated after it already happened (a lost response) is answered with an
empty Decision flagged `replayed` — never a second record.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from domain.aggregate import AttemptState, LeaseState, RunAggregate, effective_intent
from domain.decision import Decision, DecisionBuilder, LeaseGrant, check_now
from domain.errors import FenceError, InvalidInput, NotFound
from domain.event_types import EventType, Family, of
from domain.execution import check_execution
from domain.ids import LEASE_ID, WORKER_EVENT, WORKER_MUTATION, WORKER_STEP_EVENT, derive_id
from domain.json_values import check_finite, check_output_size
from domain.lease_terms import check_lease_ttl, lease_expiry
from domain.retries import retry_after_failure
from domain.step_timeouts import past_step_timeout, step_timeout_ms
from domain.transitions import (
    ATTEMPT_CLAIMED,
    ATTEMPT_INTERRUPTED,
    ATTEMPT_RUNNING,
    ATTEMPT_STARTING,
    EXECUTION_CANCELLED,
    EXECUTION_FAILED,
    EXECUTION_TIMED_OUT,
    INTERRUPTED_TOO_OFTEN,
    LEASE_COMPLETED,
    LEASE_EXPIRED,
    LEASE_LEASED,
    LEASE_RELEASED,
    MAX_INTERRUPTIONS,
    RELEASE_REASONS,
    STEP_READY,
    STEP_RUNNING,
    STEP_TIMEOUT,
    WORKER_SHUTDOWN,
    Status,
)

# timed_out: the host stopped the Attempt at its step's timeout (docs/DESIGN.md, "Step
# timeouts"); accepted only for an Attempt the domain finds past it
OUTCOMES = (Status.SUCCEEDED, Status.FAILED, Status.INTERRUPTED, Status.TIMED_OUT)


def worker_actor(worker_id: str) -> str:
    return f"worker:{worker_id}"


MAX_WORKER_SLOTS = 10_000
MAX_HOST_CHARS = 255


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    """What a worker says of itself on a lease grant: the host it runs on and how
    many Attempts it runs at once (its slots). Either may be None (not said)."""

    host: str | None = None
    slots: int | None = None

    def __post_init__(self) -> None:
        if self.host is not None and (
            not isinstance(self.host, str) or not 0 < len(self.host) <= MAX_HOST_CHARS
        ):
            raise InvalidInput(
                "host", "text", f"host must be 1..{MAX_HOST_CHARS} characters, not {self.host!r}"
            )
        if self.slots is not None and (
            type(self.slots) is not int or not 1 <= self.slots <= MAX_WORKER_SLOTS
        ):
            raise InvalidInput(
                "slots",
                "range",
                f"slots must be an integer from 1 to {MAX_WORKER_SLOTS}, not {self.slots!r}",
            )

    def fields(self) -> dict[str, Any]:
        """The grant's data fields for what was said (`worker_host`, `worker_slots`)."""
        said: dict[str, Any] = {}
        if self.host is not None:
            said["worker_host"] = self.host
        if self.slots is not None:
            said["worker_slots"] = self.slots
        return said


# --- lease grant -----------------------------------------------------------------------


def grant_lease(
    aggregate: RunAggregate,
    attempt_id: str,
    worker_id: str,
    ttl_ms: int,
    now_ms: int,
    *,
    worker: WorkerInfo | None = None,
    probe: bool = False,
    caused_by: str | None = None,
) -> Decision:
    """Lease a claimed Attempt to `worker_id` for `ttl_ms` (5 s – 10 min).

    `worker` is what the worker says of itself (its host, its slots), recorded on
    the grant only where given (docs/DESIGN.md, "Workers"). `probe`: only asked
    whether it would lease (`domain.work`): `HasWork` where it would, as
    `DecisionBuilder.on` says. `caused_by`: the event the grant follows from, as its
    records' causation (default: the Run's latest event); a grant made with a
    completion names the completion's `lease.completed` (docs/DESIGN.md "A lost
    answer of a completion that leased").

    Refused (FenceError) when the Run is terminal or has cancel intent, the
    Attempt is not claimed at its admitted ready epoch, or another lease is live.
    An expired lease of a never-started claim is released (`lease_expired`) and
    the new lease granted in the same append. The Decision's `lease` is what the
    worker presents from now on.
    """
    check_now(now_ms)
    check_lease_ttl(ttl_ms)
    if not isinstance(worker_id, str) or not worker_id or len(worker_id) > 128:
        raise InvalidInput(
            "worker_id", "non_empty", "worker_id must be a string of 1..128 characters"
        )
    said = {} if worker is None else worker.fields()
    attempt = _attempt(aggregate, attempt_id)
    _require_running(aggregate)
    intent = effective_intent(aggregate, now_ms)
    if intent is not None:
        raise FenceError(f"Run {aggregate.run_id!r} has cancel intent ({intent[0]}): no new leases")
    if attempt.status != ATTEMPT_CLAIMED:
        raise FenceError(
            f"Attempt {attempt_id!r} is {attempt.status}; only a claimed Attempt is leased"
        )
    _require_admitted_epoch(aggregate, attempt)
    lease = attempt.lease
    expires_at_ms = lease_expiry(now_ms, ttl_ms)  # refused before any record is added
    builder = DecisionBuilder.on(aggregate, now_ms, worker_actor(worker_id), caused_by, probe=probe)
    if lease is not None and lease.status == LEASE_LEASED:
        if lease.is_live(now_ms):
            raise FenceError(
                f"Attempt {attempt_id!r} is leased to {lease.worker_id!r} (lease "
                f"{lease.lease_id!r}) until {lease.expires_at_ms} (now {now_ms})"
            )
        builder.lease_event(
            attempt_id,
            EventType.LEASE_RELEASED,
            {"lease_id": lease.lease_id, "reason": LEASE_EXPIRED},
            parts=(lease.lease_id, "grant"),
        )
    version = builder.lease_version(attempt_id) + 1
    lease_id = derive_id(LEASE_ID, attempt_id, version)
    builder.lease_event(
        attempt_id,
        EventType.LEASE_GRANTED,
        {
            "lease_id": lease_id,
            "attempt_id": attempt_id,
            "run_id": aggregate.run_id,
            "step_key": attempt.step_key,
            "task_ref": attempt.admission.get("task_ref"),
            "worker_id": worker_id,
            "granted_at_ms": now_ms,
            "ttl_ms": ttl_ms,
            "expires_at_ms": expires_at_ms,
            **said,
        },
        parts=(lease_id, worker_id),
    )
    return builder.build(lease=LeaseGrant(attempt_id, lease_id, version, worker_id, expires_at_ms))


# --- start barrier and running ---------------------------------------------------------


def mark_starting(
    aggregate: RunAggregate, attempt_id: str, lease_id: str, lease_version: int, now_ms: int
) -> Decision:
    """Cross the start barrier: Attempt `starting`, StepRun `ready → running`.

    Allowed under cancel intent (the worker's live lease is its authority).
    """
    check_now(now_ms)
    attempt = _attempt(aggregate, attempt_id)
    _require_running(aggregate)
    lease = _fence(attempt, lease_id, lease_version, now_ms)
    if attempt.status in (ATTEMPT_STARTING, ATTEMPT_RUNNING):
        return _replayed(attempt_id, lease)
    builder = DecisionBuilder.on(aggregate, now_ms, worker_actor(lease.worker_id))
    _start(builder, aggregate, attempt, lease)
    return builder.build()


def mark_running(
    aggregate: RunAggregate, attempt_id: str, lease_id: str, lease_version: int, now_ms: int
) -> Decision:
    """Attempt `starting → running`; from `claimed` it passes the start barrier first."""
    check_now(now_ms)
    attempt = _attempt(aggregate, attempt_id)
    _require_running(aggregate)
    lease = _fence(attempt, lease_id, lease_version, now_ms)
    if attempt.status == ATTEMPT_RUNNING:
        return _replayed(attempt_id, lease)
    builder = DecisionBuilder.on(aggregate, now_ms, worker_actor(lease.worker_id))
    if attempt.status == ATTEMPT_CLAIMED:
        _start(builder, aggregate, attempt, lease)
    builder.event(
        derive_id(WORKER_EVENT, attempt_id, Status.RUNNING, lease_id),
        EventType.ATTEMPT_RUNNING,
        _lease_ref(attempt_id, lease),
    )
    return builder.build()


def _start(
    builder: DecisionBuilder, aggregate: RunAggregate, attempt: AttemptState, lease: LeaseState
) -> None:
    _require_admitted_epoch(aggregate, attempt)
    data = _lease_ref(attempt.attempt_id, lease)
    if step_timeout_ms(aggregate, attempt.step_key) is not None:
        data["started_at_ms"] = builder.now_ms  # the step's timeout runs from here
    builder.event(
        derive_id(WORKER_EVENT, attempt.attempt_id, Status.STARTING, lease.lease_id),
        EventType.ATTEMPT_STARTING,
        data,
    )
    step = aggregate.steps[attempt.step_key]
    builder.change_step(
        step.key,
        STEP_RUNNING,
        _step_ids(step.step_run_id, step.epoch, STEP_RUNNING),
        attempt_id=attempt.attempt_id,
    )


# --- renewal ---------------------------------------------------------------------------


def renew(
    aggregate: RunAggregate,
    attempt_id: str,
    lease_id: str,
    lease_version: int,
    ttl_ms: int,
    now_ms: int,
) -> Decision:
    """Extend a live lease to `now_ms + ttl_ms`; the new version is in `Decision.lease`.

    `stop_requested` is set when the Run has cancel intent, `step_timed_out` when the
    Attempt is past its step's timeout (and the Run has none). Presenting the version
    just before a renewal this lease already made answers with that renewal
    (`replayed`), so a worker that lost the response learns its new version.
    """
    check_now(now_ms)
    check_lease_ttl(ttl_ms)
    attempt = _attempt(aggregate, attempt_id)
    _require_running(aggregate)
    stop = effective_intent(aggregate, now_ms) is not None
    timed_out = not stop and past_step_timeout(aggregate, attempt_id, now_ms)
    lease = attempt.lease
    if (
        lease is not None
        and lease.lease_id == lease_id
        and lease.is_live(now_ms)
        and lease.version == lease_version + 1
        and lease.version > lease.granted_version
    ):
        return Decision(
            lease=_grant_of(attempt_id, lease),
            stop_requested=stop,
            step_timed_out=timed_out,
            replayed=True,
        )
    lease = _fence(attempt, lease_id, lease_version, now_ms)
    builder = DecisionBuilder.on(aggregate, now_ms, worker_actor(lease.worker_id))
    expires_at_ms = lease_expiry(now_ms, ttl_ms)
    version = builder.lease_event(
        attempt_id,
        EventType.LEASE_RENEWED,
        {
            "lease_id": lease_id,
            "renewed_at_ms": now_ms,
            "ttl_ms": ttl_ms,
            "expires_at_ms": expires_at_ms,
        },
        parts=(lease_id, lease_version),
    )
    grant = LeaseGrant(attempt_id, lease_id, version, lease.worker_id, expires_at_ms)
    return builder.build(lease=grant, stop_requested=stop, step_timed_out=timed_out)


# --- completion and release ------------------------------------------------------------


def complete(
    aggregate: RunAggregate,
    attempt_id: str,
    lease_id: str,
    lease_version: int,
    outcome: str,
    result_code: str | None,
    output: Mapping[str, Any] | None,
    now_ms: int,
    *,
    execution: Mapping[str, Any] | None = None,
) -> Decision:
    """End a started Attempt with the worker's `outcome` (succeeded | failed |
    interrupted: its host stopped it, docs/DESIGN.md "Interruptions" | timed_out: its
    host stopped it at its step's timeout, docs/DESIGN.md "Step timeouts").

    `output` is what the task returned; `execution` how it ran (exit code, signal,
    pid, log path: `domain.execution`), recorded beside it and passed nowhere.

    Without cancel intent: succeeded, or failed with `result_code` (default
    `execution_failed`); interrupted (`worker_shutdown`) sends the StepRun back to
    ready without using up an attempt, at most MAX_INTERRUPTIONS times — the next
    one fails it (`interrupted_too_often`); timed_out (`step_timeout`) is refused
    (InvalidInput) unless the Attempt is past its step's timeout at `now_ms`, and is
    retried like a failure, counting as one. With cancel intent any outcome is
    recorded `cancelled` (`execution_cancelled`), or `timed_out`
    (`execution_timed_out`) for reason timeout. The StepRun takes the Attempt's
    terminal status; the lease completes.
    """
    check_now(now_ms)
    if outcome not in OUTCOMES:
        raise InvalidInput(
            "outcome", "one_of", f"outcome must be one of {OUTCOMES}, not {outcome!r}"
        )
    if result_code is not None and (not isinstance(result_code, str) or not result_code):
        raise InvalidInput(
            "result_code", "non_empty", "result_code must be a non-empty string or None"
        )
    if output is not None and not isinstance(output, Mapping):
        raise InvalidInput("output", "object", "output must be a JSON object (a mapping) or None")
    check_finite(output, "output")
    check_output_size(output, "output")
    ran = check_execution(execution)
    attempt = _attempt(aggregate, attempt_id)
    lease = attempt.lease
    if (
        lease is not None
        and lease.status == LEASE_COMPLETED
        and lease.lease_id == lease_id
        and lease.version == lease_version
        and attempt.ended_lease_id == lease_id
        and attempt.reported_outcome == outcome
        and _same_output(attempt.output, output)
    ):
        return Decision(replayed=True)
    _require_running(aggregate)
    lease = _fence(attempt, lease_id, lease_version, now_ms)
    if attempt.status not in (ATTEMPT_STARTING, ATTEMPT_RUNNING):
        raise InvalidInput(
            "attempt",
            "not_started",
            f"Attempt {attempt_id!r} is {attempt.status}: mark it starting before completing, "
            "or release the lease",
        )
    step = aggregate.steps[attempt.step_key]
    if step.status != STEP_RUNNING or step.epoch != attempt.step_epoch + 1:
        raise FenceError(
            f"StepRun {step.key!r} is {step.status} at epoch {step.epoch}: stale Attempt"
        )
    intent = effective_intent(aggregate, now_ms)
    if intent is not None:
        timeout = intent[0] == "timeout"
        status = Status.TIMED_OUT if timeout else Status.CANCELLED
        code: str | None = EXECUTION_TIMED_OUT if timeout else EXECUTION_CANCELLED
    elif outcome == Status.SUCCEEDED:
        status, code = Status.SUCCEEDED, None
    elif outcome == Status.INTERRUPTED and interruptions(aggregate, step.key) < MAX_INTERRUPTIONS:
        status, code = ATTEMPT_INTERRUPTED, result_code or WORKER_SHUTDOWN
    elif outcome == Status.INTERRUPTED:
        status, code = Status.FAILED, INTERRUPTED_TOO_OFTEN
    elif outcome == Status.TIMED_OUT:
        if not past_step_timeout(aggregate, attempt_id, now_ms):
            raise InvalidInput(
                "outcome",
                "not_past_timeout",
                f"Attempt {attempt_id!r} is not past its step's timeout at {now_ms}: "
                "only an Attempt stopped at its timeout_ms is completed timed_out",
            )
        status, code = Status.TIMED_OUT, STEP_TIMEOUT
    else:
        status, code = Status.FAILED, result_code or EXECUTION_FAILED
    # a reported failure or step timeout with attempts left goes back to ready (plan v2
    # retry); an interruption does not count as one, and one too many is never retried
    retries = code == STEP_TIMEOUT or (status == Status.FAILED and code != INTERRUPTED_TOO_OFTEN)
    retry_at = retry_after_failure(aggregate, step.key, now_ms) if retries else None
    builder = DecisionBuilder.on(aggregate, now_ms, worker_actor(lease.worker_id))
    completed_id = derive_id(WORKER_EVENT, attempt_id, Status.COMPLETED, lease_id)
    builder.event(
        completed_id,
        of(Family.ATTEMPT, status),
        {
            "attempt_id": attempt_id,
            "result_code": code,
            "reported_outcome": outcome,
            "output": None if output is None else dict(output),
            "execution": ran,
            "lease_id": lease_id,
        },
    )
    builder.settled_attempts += 1
    if status == ATTEMPT_INTERRUPTED:
        builder.change_step(
            step.key,
            STEP_READY,
            _step_ids(step.step_run_id, step.epoch, STEP_READY),
            attempt_id=attempt_id,
            interrupted=True,
        )
    elif retry_at is not None:
        builder.change_step(
            step.key,
            STEP_READY,
            _step_ids(step.step_run_id, step.epoch, STEP_READY),
            attempt_id=attempt_id,
            retry_at_ms=retry_at,
        )
    else:
        builder.change_step(
            step.key,
            status,
            _step_ids(step.step_run_id, step.epoch, status),
            result_code=code,
            attempt_id=attempt_id,
        )
    builder.lease_event(
        attempt_id,
        EventType.LEASE_COMPLETED,
        {"lease_id": lease_id, "outcome": status},
        born_with=completed_id,
    )
    return builder.build()


def release(
    aggregate: RunAggregate,
    attempt_id: str,
    lease_id: str,
    lease_version: int,
    reason: str,
    now_ms: int,
) -> Decision:
    """Give back the lease of a claim that has not started; the Attempt stays claimed.

    Past the start barrier a worker ends its Attempt with `complete` instead.
    """
    check_now(now_ms)
    if reason not in RELEASE_REASONS:
        raise InvalidInput(
            "reason", "one_of", f"release reason must be one of {RELEASE_REASONS}, not {reason!r}"
        )
    attempt = _attempt(aggregate, attempt_id)
    lease = attempt.lease
    if (
        lease is not None
        and lease.status == LEASE_RELEASED
        and lease.lease_id == lease_id
        and lease.version == lease_version
        and lease.release_reason == reason
    ):
        return Decision(replayed=True)
    _require_running(aggregate)
    lease = _fence(attempt, lease_id, lease_version, now_ms)
    if attempt.status != ATTEMPT_CLAIMED:
        raise InvalidInput(
            "attempt",
            "past_start_barrier",
            f"Attempt {attempt_id!r} is {attempt.status}: past the start barrier a worker "
            "completes its Attempt (outcome 'failed') instead of releasing it",
        )
    builder = DecisionBuilder.on(aggregate, now_ms, worker_actor(lease.worker_id))
    builder.lease_event(
        attempt_id,
        EventType.LEASE_RELEASED,
        {"lease_id": lease_id, "reason": reason},
        parts=(lease_id, "worker"),
    )
    return builder.build()


# --- fencing ---------------------------------------------------------------------------


def _fence(attempt: AttemptState, lease_id: str, lease_version: int, now_ms: int) -> LeaseState:
    """The Attempt's current live lease if (lease_id, lease_version) names it, else FenceError."""
    lease = attempt.lease
    aid = attempt.attempt_id
    if lease is None or lease_id not in attempt.lease_ids:
        raise FenceError(f"unknown lease {lease_id!r} for Attempt {aid!r}")
    if lease.lease_id != lease_id:
        raise FenceError(
            f"lease {lease_id!r} of Attempt {aid!r} was replaced by {lease.lease_id!r}"
        )
    if lease.status != LEASE_LEASED:
        raise FenceError(f"lease {lease_id!r} of Attempt {aid!r} is {lease.status}")
    if lease.version != lease_version:
        raise FenceError(
            f"stale version {lease_version} of lease {lease_id!r} (current version {lease.version})"
        )
    recorded_at_ms = lease.expires_at_ms - lease.ttl_ms  # its last grant or renewal
    if now_ms < recorded_at_ms:
        raise InvalidInput(
            "now_ms",
            "before_lease",
            f"now_ms {now_ms} is before lease {lease_id!r} was last granted or renewed "
            f"({recorded_at_ms}); a worker's clock must not go back",
        )
    if now_ms >= lease.expires_at_ms:
        raise FenceError(f"lease {lease_id!r} expired at {lease.expires_at_ms} (now {now_ms})")
    if not attempt.is_active:
        raise FenceError(f"Attempt {aid!r} is {attempt.status}: it holds no execution authority")
    if attempt.started_lease_id is not None and attempt.started_lease_id != lease_id:
        raise FenceError(
            f"Attempt {aid!r} started under lease {attempt.started_lease_id!r}, not {lease_id!r}"
        )
    return lease


def _attempt(aggregate: RunAggregate, attempt_id: str) -> AttemptState:
    attempt = aggregate.attempts.get(attempt_id)
    if attempt is None:
        raise NotFound(f"Attempt {attempt_id!r} does not exist in Run {aggregate.run_id!r}")
    return attempt


def _require_running(aggregate: RunAggregate) -> None:
    if aggregate.run.is_terminal:
        raise FenceError(f"Run {aggregate.run_id!r} is terminal ({aggregate.run.status})")


def _require_admitted_epoch(aggregate: RunAggregate, attempt: AttemptState) -> None:
    step = aggregate.steps[attempt.step_key]
    if step.status != STEP_READY or step.epoch != attempt.step_epoch:
        raise FenceError(
            f"stale admission: Attempt {attempt.attempt_id!r} was admitted at epoch "
            f"{attempt.step_epoch}, StepRun {step.key!r} is {step.status} at epoch {step.epoch}"
        )


def _replayed(attempt_id: str, lease: LeaseState) -> Decision:
    return Decision(replayed=True, lease=_grant_of(attempt_id, lease))


def _grant_of(attempt_id: str, lease: LeaseState) -> LeaseGrant:
    return LeaseGrant(
        attempt_id, lease.lease_id, lease.version, lease.worker_id, lease.expires_at_ms
    )


def _lease_ref(attempt_id: str, lease: LeaseState) -> dict[str, Any]:
    return {
        "attempt_id": attempt_id,
        "lease_id": lease.lease_id,
        "lease_version": lease.version,
        "worker_id": lease.worker_id,
    }


def _step_ids(
    step_run_id: str, epoch: int, to_status: str
) -> tuple[str, str, tuple[str, int, str]]:
    return WORKER_STEP_EVENT, WORKER_MUTATION, (step_run_id, epoch, to_status)


def interruptions(aggregate: RunAggregate, step_key: str) -> int:
    """How many of the step's Attempts their host interrupted so far."""
    step = aggregate.steps[step_key]
    return sum(1 for a in step.attempt_ids if aggregate.attempts[a].status == ATTEMPT_INTERRUPTED)


def _same_output(stored: Mapping[str, Any] | None, given: Mapping[str, Any] | None) -> bool:
    if stored is None or given is None:
        return stored is None and given is None
    return dict(stored) == dict(given)
