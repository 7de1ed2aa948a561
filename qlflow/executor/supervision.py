"""What both executors — a command's subprocess (`qlflow.executor.local`) and a python
Task's function (`qlflow.python.executor`) — do the same way while they hold an
Attempt: keep its lease renewed and turn the renewal's answer into a stop, record the
outcome under the lease while the store cannot take it yet, and name its local log
(docs/DESIGN.md, "Recovery and the start barrier" and "Step timeouts")."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

from domain.errors import FenceError, QlflowError
from qlflow.executor.reports import AttemptReport, report
from qlflow.executor.seam import Completer
from qlflow.executor.step_deadline import STEP_TIMEOUT, StepDeadline
from qlflow.executor.writes import Held, NotStarted, recovered, retrying, until_recorded
from qlflow.runtime import Lease, Runtime
from qlflow.transient import Backoff, transient_errors

log = logging.getLogger("qlflow.executor")

STOP_REQUESTED = "stop_requested"  # the stop's reason when the Run asks for it


class Supervised(Protocol):
    """A running Attempt as its executor holds it."""

    lease: Lease
    renew_now: bool  # renew at once (asked by another thread, or at the step's deadline)
    stop_reason: str | None  # why it is being stopped; None while it runs on


Item = TypeVar("Item", bound=Supervised)


class HeldAttempts(Generic[Item]):
    """The Attempts an executor runs right now, as its other threads reach them:
    `wake(item)` interrupts the item's supervision wait."""

    def __init__(self, wake: Callable[[Item], None]) -> None:
        self._wake = wake
        self._lock = threading.Lock()
        self._items: dict[str, Item] = {}

    def add(self, item: Item) -> None:
        with self._lock:
            self._items[item.lease.attempt_id] = item

    def remove(self, attempt_id: str) -> None:
        with self._lock:
            self._items.pop(attempt_id, None)

    def select(self, run_id: str | None = None) -> list[Item]:
        """Every one held (of one Run, or all)."""
        with self._lock:
            return [i for i in self._items.values() if run_id in (None, i.lease.run_id)]

    def renew_now(self, run_id: str | None) -> None:
        """Renew their leases now instead of waiting for ttl/3, so a new cancel intent
        reaches them at once as `stop_requested`."""
        for item in self.select(run_id):
            item.renew_now = True
            self._wake(item)

    def stop_all(self, reason: str) -> None:
        """Stop every one for `reason` (the executor's own way; a reason set earlier
        stays)."""
        for item in self.select(None):
            if item.stop_reason is None:
                item.stop_reason = reason
            self._wake(item)


class LeaseKeeper:
    """The renewals of one supervised Attempt: every ttl/3 (sooner when its lease
    expires sooner, when asked, or at its step's deadline), tried again with a capped
    backoff while the store cannot answer. A renewal's `stop_requested` or
    `step_timed_out` becomes the Attempt's stop reason."""

    def __init__(self, rt: Runtime, ttl_ms: int, lease: Lease) -> None:
        self._rt = rt
        self.ttl_ms = ttl_ms
        self.interval_s = ttl_ms / 3000
        self._backoff = Backoff()
        self._deadline = StepDeadline()
        self._retried: tuple[type[BaseException], ...] = (QlflowError, *transient_errors())
        self.next_renew = time.monotonic() + renew_after(rt, lease, self.interval_s)

    def wait_s(self, item: Supervised, now: float) -> float:
        """Seconds until this keeper has something to do for `item`."""
        wait = self.next_renew - now
        until_deadline = self._deadline.wait_s(self._rt, item.lease, now)
        if until_deadline is not None and item.stop_reason is None:
            wait = min(wait, until_deadline)
        return wait

    def tick(self, item: Supervised, now: float) -> str | None:
        """Renew if it is due; None, or why the lease is lost (FenceError): then
        nothing the worker writes for the Attempt would be accepted."""
        if item.stop_reason is None and self._deadline.due(self._rt, item.lease, now):
            item.renew_now = True  # the renewal's answer says if it is past its timeout
        if not item.renew_now and now < self.next_renew:
            return None
        item.renew_now = False
        try:
            item.lease = self._rt.renew(item.lease, ttl_ms=self.ttl_ms)
        except FenceError as error:
            return f"lease lost while running: {error}"
        except self._retried as error:
            # the lease may well outlive this: keep trying until the store answers
            self.next_renew = time.monotonic() + min(self.interval_s, self._backoff.failed())
            retrying(self._backoff, item.lease, "renewal", error)
            return None
        self.next_renew = time.monotonic() + renew_after(self._rt, item.lease, self.interval_s)
        recovered(self._backoff, item.lease, "renewal")
        if item.stop_reason is None:
            if item.lease.stop_requested:
                item.stop_reason = STOP_REQUESTED
            elif item.lease.step_timed_out:
                item.stop_reason = STEP_TIMEOUT
        return None


def renew_after(rt: Runtime, lease: Lease, interval_s: float) -> float:
    """Seconds until the next renewal: every ttl/3, and sooner if the lease we hold
    expires earlier than that (a replayed renewal answers with its own expiry). The
    lease expires on the store's clock, so the store's time says how long is left."""
    remaining_s = (lease.expires_at_ms - rt.clock_ms()) / 1000
    return max(0.0, min(interval_s, remaining_s / 3))


def complete_held(
    rt: Runtime,
    held: Held,
    outcome: str,
    result_code: str | None,
    output: Mapping[str, Any] | None,
    execution: Mapping[str, Any] | None,
    *,
    ttl_ms: int,
    completer: Completer | None = None,
) -> tuple[str | None, str | None]:
    """Record the outcome (through `completer`, else `rt.complete`), trying again
    while the store cannot take it (a completion is idempotent: a retry after a lost
    answer is a replay). (status, None), or (None, why) when it could not be
    recorded."""
    complete: Completer = completer if completer is not None else rt.complete
    try:
        status = until_recorded(
            rt,
            held,
            "completion",
            lambda lease: complete(
                lease, outcome, result_code=result_code, output=output, execution=execution
            ),
            ttl_ms=ttl_ms,
        )
    except QlflowError as error:
        log.warning("attempt %s: completion not recorded: %s", held.lease.attempt_id, error)
        return None, str(error)
    return status, None


def cross_start_barrier(
    rt: Runtime, held: Held, log_path: Path, *, ttl_ms: int, stopping: threading.Event
) -> AttemptReport | None:
    """Record the start barrier before anything is spawned (unless the lease was granted
    with it: `lease_attempts(start=True)`), trying again while the store cannot take
    it. None once crossed; else the report of an Attempt given up before it (its lease
    lost, or this host stopping)."""
    if held.lease.started:
        return None
    try:
        until_recorded(rt, held, "start", rt.mark_starting, ttl_ms=ttl_ms, stopping=stopping)
    except FenceError as error:
        log.warning("attempt %s: lease lost before start: %s", held.lease.attempt_id, error)
        return report(held.lease, None, None, None, log_path, error=str(error))
    except NotStarted:
        return not_started(held.lease, log_path, "the executor is shutting down")
    return None


def not_started(lease: Lease, log_path: Path, reason: str) -> AttemptReport:
    """Give the Attempt up before its start barrier: nothing was spawned or recorded,
    and once its lease lapses another worker may lease it."""
    log.info("attempt %s: not started: %s", lease.attempt_id, reason)
    return report(lease, None, None, None, log_path, error=reason)


def run_log_folder(log_dir: Path, run_id: str) -> Path:
    """The folder on this host that holds a Run's local step logs (and task I/O)."""
    return log_dir / run_id.replace(":", "_")


def attempt_log_path(log_dir: Path, lease: Lease) -> Path:
    """The local log file of the leased Attempt."""
    attempt = lease.attempt_id.replace(":", "_")
    return run_log_folder(log_dir, lease.run_id) / f"{lease.step_key}-{attempt}.log"
