"""Delivering failure notifications from the outbox (docs/DESIGN.md "Notifications").

The decision that ends a Run writes one `notification.due` per matching rule to
`notification-<run_id>` in the same commit. A host (`qlflow serve`, or
`deliver_due` called by an embedding host) asks the outbox's read model
(`projections.notifications`) for the pending ones whose retry time has come, tries
each, and records every attempt as `notification.attempted`: at least once, retried
with backoff (`domain.notify.retry_delay_ms`).

A webhook gets a POST of the JSON body, signed when its rule names `secret_env`:
header `X-Qlflow-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256(secret,
"<t>." + body)>`; any 2xx is delivered. A command gets the body on stdin and
`QLFLOW_RUN_ID`, `QLFLOW_RUN_STATUS` in its environment; exit 0 is delivered.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import subprocess
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from domain import streams
from domain.errors import IdempotencyConflict, VersionConflict
from domain.event_types import EventType
from domain.notify import Delivery, attempt_data, attempt_event_id
from domain.records import NewEvent, StreamAppend
from eventstore.store import BaseStore
from projections import notifications as outbox
from projections import registry

log = logging.getLogger("qlflow.notifications")
SIGNATURE_HEADER = "X-Qlflow-Signature"
WEBHOOK_TIMEOUT_S = 10.0
COMMAND_TIMEOUT_S = 60.0
DELIVERER = "host:notifications"
DUE_PAGE = 100  # deliveries tried per call at most; the rest wait for the next


def deliveries(store: BaseStore, *, delivered: bool = True) -> list[Delivery]:
    """The notifications the outbox holds, oldest first (without `delivered`, only
    those pending or failed for good)."""
    return outbox.listed(store, delivered=delivered)


def body_of(delivery: Delivery) -> bytes:
    """The JSON body a webhook or command receives."""
    document = {
        "notification_id": delivery.notification_id,
        "run_id": delivery.run_id,
        "workflow_key": delivery.workflow_key,
        "status": delivery.status,
        "result_code": delivery.result_code,
        "attempt": delivery.attempts + 1,
    }
    return orjson.dumps(document, option=orjson.OPT_SORT_KEYS)


def signature(secret: str, timestamp_s: int, body: bytes) -> str:
    """The signature header's value: `t=<unix seconds>,v1=<hex HMAC-SHA256>` over
    `"<t>." + body` (the timestamp is signed so a receiver can refuse a replay)."""
    mac = hmac.new(secret.encode(), f"{timestamp_s}.".encode() + body, hashlib.sha256)
    return f"t={timestamp_s},v1={mac.hexdigest()}"


@dataclass(frozen=True, slots=True)
class AttemptResult:
    """One delivery attempt as recorded."""

    run_id: str
    rule: int
    attempt: int
    delivered: bool
    error: str | None


Sender = Callable[[Delivery, bytes, int, Mapping[str, str]], str | None]


def send(delivery: Delivery, body: bytes, now_ms: int, env: Mapping[str, str]) -> str | None:
    """Try one delivery; None when delivered, else why not."""
    target = delivery.target
    if "webhook" in target:
        return _post(target, body, now_ms, env)
    return _run_command(target, body, delivery, env)


def _post(
    target: Mapping[str, Any], body: bytes, now_ms: int, env: Mapping[str, str]
) -> str | None:
    headers = {"Content-Type": "application/json", "User-Agent": "qlflow-notify"}
    secret_env = target.get("secret_env")
    if secret_env is not None:
        secret = env.get(secret_env)
        if not secret:
            return f"the secret's environment variable {secret_env} is not set"
        headers[SIGNATURE_HEADER] = signature(secret, now_ms // 1000, body)
    request = urllib.request.Request(target["webhook"], data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=WEBHOOK_TIMEOUT_S) as response:
            status = response.status
    except urllib.error.HTTPError as error:
        return f"HTTP {error.code}"
    except (urllib.error.URLError, OSError, ValueError) as error:
        return f"{type(error).__name__}: {error}"
    return None if 200 <= status < 300 else f"HTTP {status}"


def _run_command(
    target: Mapping[str, Any], body: bytes, delivery: Delivery, env: Mapping[str, str]
) -> str | None:
    child_env = {**env, "QLFLOW_RUN_ID": delivery.run_id, "QLFLOW_RUN_STATUS": delivery.status}
    try:
        done = subprocess.run(
            list(target["command"]),
            input=body,
            env=child_env,
            capture_output=True,
            timeout=COMMAND_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.SubprocessError) as error:
        return f"{type(error).__name__}: {error}"
    return None if done.returncode == 0 else f"exit {done.returncode}"


def deliver_due(
    store: BaseStore,
    now_ms: int | None = None,
    *,
    env: Mapping[str, str] | None = None,
    sender: Sender = send,
) -> list[AttemptResult]:
    """Try the pending notifications whose retry time has come (at most `DUE_PAGE`,
    the longest waiting first), recording each attempt; returns what was tried. An attempt another host recorded first is
    left to it (its record wins; the receiver may see the notification twice)."""
    now = store.clock_ms() if now_ms is None else now_ms
    environment = os.environ if env is None else env
    results = []
    for delivery in outbox.due(store, now, DUE_PAGE):
        stream = streams.notification_stream(delivery.run_id)
        version = store.stream_versions([stream]).get(stream, 0)
        error = sender(delivery, body_of(delivery), now, environment)
        data = attempt_data(delivery, now, error is None, error)
        event = NewEvent(
            attempt_event_id(delivery, data["attempt"]),
            EventType.NOTIFICATION_ATTEMPTED,
            data,
            {"at_ms": now, "causation_id": delivery.notification_id,
             "correlation_id": delivery.run_id, "actor": DELIVERER},
        )  # fmt: skip
        try:
            with store.transaction() as tx:
                registry.commit(tx, [StreamAppend(stream, version, (event,))])
        except (VersionConflict, IdempotencyConflict):
            log.info("notification %s: another host recorded this attempt", delivery.run_id)
            continue
        results.append(
            AttemptResult(delivery.run_id, delivery.rule, data["attempt"], error is None, error)
        )
        if error is None:
            log.info("notification delivered: run %s rule %d", delivery.run_id, delivery.rule)
        else:
            log.warning(
                "notification attempt %d failed: run %s rule %d: %s",
                data["attempt"], delivery.run_id, delivery.rule, error,
            )  # fmt: skip
    return results


class Notifier:
    """A daemon thread that delivers due notifications every `interval_s` (kept off
    the cycle's thread: a slow webhook never delays a cycle)."""

    def __init__(
        self,
        store: BaseStore,
        interval_s: float = 1.0,
        on_attempt: Callable[[AttemptResult], None] | None = None,
    ) -> None:
        self._store = store
        self._interval_s = interval_s
        self._on_attempt = on_attempt
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="qlflow-notifier", daemon=True)

    def start(self) -> Notifier:
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                for result in deliver_due(self._store):
                    if self._on_attempt is not None:
                        self._on_attempt(result)
            except Exception as error:  # a store outage: try again next interval
                log.warning("notifications: %s: %s", type(error).__name__, error)
            self._stop.wait(self._interval_s)

    def close(self) -> None:
        """Stop after the delivery in progress, if any."""
        self._stop.set()
        self._thread.join(timeout=WEBHOOK_TIMEOUT_S + 1)
