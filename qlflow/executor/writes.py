"""A worker's writes while the store may be unavailable: tried again after a capped,
growing pause, with the lease renewed whenever a renewal falls due meanwhile, so an
outage shorter than the lease never costs it. Only a FenceError (the lease is gone)
or an error that is not the store's passes through."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from domain.errors import FenceError, QlflowError
from qlflow.runtime import Lease, Runtime
from qlflow.transient import Backoff, transient_errors

log = logging.getLogger("qlflow.executor")

T = TypeVar("T")


class NotStarted(Exception):
    """The worker stopped before its start barrier was recorded: nothing was spawned."""


@dataclass
class Held:
    """The lease a worker holds right now (renewals replace it)."""

    lease: Lease


def until_recorded(
    rt: Runtime,
    held: Held,
    what: str,
    write: Callable[[Lease], T],
    *,
    ttl_ms: int,
    stopping: threading.Event | None = None,
    unfenced: bool = False,
) -> T:
    """`write(held.lease)` until the store records it. A transient store error is
    tried again after a capped backoff, and a renewal that falls due meanwhile is
    made (`held.lease` is then the renewed lease). FenceError and errors that are not
    the store's propagate. With `stopping` (before anything was spawned): NotStarted
    once it is set, and the lease simply lapses. `unfenced`: `write` is not fenced by
    the lease itself (a read, a log piece), so a renewal refused with FenceError —
    the lease really ended — ends the tries with that error."""
    transient = transient_errors()
    renewal_retried: tuple[type[BaseException], ...] = (QlflowError, *transient)
    backoff = Backoff()
    renew_before_ms = ttl_ms * 2 / 3  # renew once a third of the TTL has passed
    while True:
        try:
            value = write(held.lease)
        except transient as error:
            pause = backoff.failed()
            retrying(backoff, held.lease, what, error)
        else:
            recovered(backoff, held.lease, what)
            return value
        if stopping is not None and stopping.is_set():
            raise NotStarted()
        # the lease expires on the store's clock: compare with the store's time
        renew_in_s = (held.lease.expires_at_ms - rt.clock_ms() - renew_before_ms) / 1000
        (stopping or threading.Event()).wait(max(0.0, min(pause, renew_in_s)))
        if held.lease.expires_at_ms - rt.clock_ms() <= renew_before_ms:
            try:
                held.lease = rt.renew(held.lease, ttl_ms=ttl_ms)
            except FenceError:
                if unfenced:
                    raise
                # a FenceError here may be a completion that did commit: the write
                # itself, tried again, tells (replayed) or fails with its own fence
                log.debug(
                    "attempt %s: renewal refused; the write itself tells", held.lease.attempt_id
                )
            except renewal_retried as error:
                log.debug("attempt %s: renewal failed: %s", held.lease.attempt_id, error)


def retrying(backoff: Backoff, lease: Lease, what: str, error: BaseException) -> None:
    """Log a write the store did not take (the first failure, then every so often)."""
    if backoff.should_log():
        log.warning(
            "attempt %s: %s not recorded yet (%s), trying again; the step keeps running: %s",
            lease.attempt_id,
            what,
            backoff.describe("failed try", "failed tries"),
            error,
        )


def recovered(backoff: Backoff, lease: Lease, what: str) -> None:
    """Log a write recorded after failures (and reset the backoff)."""
    took_s = backoff.failing_for_s
    failures = backoff.succeeded()
    if failures:
        log.warning(
            "attempt %s: %s recorded after %d failed tries (%.1f s)",
            lease.attempt_id,
            what,
            failures,
            took_s,
        )
