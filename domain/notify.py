"""Failure notifications (docs/DESIGN.md, "Notifications"): a Workflow's `notify`
rules, how they are read and written, and the outbox records a Run's terminal
decision adds for the rules its status matches.

A rule is `{on = [statuses], webhook = "https://…", secret_env = "NAME"}` or
`{on = [statuses], command = [argv…]}`. The rules travel from the manifest through
the revision into the plan, so the decision that ends a Run reads them from its
plan: the `notification.due` records go to `notification-<run_id>` in the same
commit as the terminal record, and a crash never loses one.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from domain.errors import PlanError
from domain.event_types import EventType
from domain.ids import NOTIFICATION_EVENT, derive_id
from domain.records import NewEvent, StreamAppend
from domain.streams import notification_stream
from domain.transitions import RUN_TERMINAL, Status

MAX_RULES = 8
DELIVERED = "delivered"  # a delivery state (pending and failed are Status words)
MAX_URL_CHARS = 2048
MAX_ARGV = 64
MAX_ARG_CHARS = 4096
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
_RULE_KEYS = ("on", "webhook", "command", "secret_env")
# a delivery is tried at most this often; backoff doubles from the base, capped
MAX_DELIVERY_ATTEMPTS = 8
BACKOFF_BASE_MS = 1_000
BACKOFF_CAP_MS = 300_000


@dataclass(frozen=True, slots=True)
class NotifyRule:
    """One notify rule: the terminal statuses it fires on (sorted) and its target,
    a webhook (with the name of the environment variable holding its secret) or
    a command's argv."""

    on: tuple[str, ...]
    webhook: str | None = None
    command: tuple[str, ...] = ()
    secret_env: str | None = None


class NotifyError(ValueError):
    """A notify rule breaks a rule: `field` (e.g. "notify[0].on") and the reason."""

    def __init__(self, field: str, reason: str) -> None:
        self.field = field
        self.reason = reason
        super().__init__(f"{field}: {reason}")


def parse_notify(raw: object, field: str = "notify") -> tuple[NotifyRule, ...]:
    """Strictly read a list of rules (manifest TOML or a stored document); raises
    NotifyError naming the field and the reason."""
    if not isinstance(raw, list):
        raise NotifyError(field, f"must be a list of tables, not {type(raw).__name__}")
    if len(raw) > MAX_RULES:
        raise NotifyError(field, f"has {len(raw)} rules; at most {MAX_RULES}")
    return tuple(_rule(item, f"{field}[{index}]") for index, item in enumerate(raw))


def _rule(raw: object, field: str) -> NotifyRule:
    if not isinstance(raw, Mapping):
        raise NotifyError(field, f"must be a table, not {type(raw).__name__}")
    unknown = sorted(str(key) for key in raw if key not in _RULE_KEYS)
    if unknown:
        raise NotifyError(field, f"unknown keys {unknown}; allowed {list(_RULE_KEYS)}")
    on = raw.get("on")
    if not isinstance(on, list) or not on:
        raise NotifyError(f"{field}.on", "must be a non-empty list of terminal statuses")
    for status in on:
        if not isinstance(status, str) or status not in RUN_TERMINAL:
            raise NotifyError(
                f"{field}.on", f"{status!r} is not a terminal status {sorted(RUN_TERMINAL)}"
            )
    if len(set(on)) != len(on):
        raise NotifyError(f"{field}.on", "names a status twice")
    webhook, command = raw.get("webhook"), raw.get("command")
    if (webhook is None) == (command is None):
        raise NotifyError(field, "needs exactly one of webhook or command")
    secret_env = raw.get("secret_env")
    if secret_env is not None:
        if webhook is None:
            raise NotifyError(f"{field}.secret_env", "only a webhook is signed")
        if not isinstance(secret_env, str) or not _ENV_NAME.fullmatch(secret_env):
            raise NotifyError(f"{field}.secret_env", "must be an environment variable name")
    if webhook is not None:
        if not isinstance(webhook, str) or not webhook.startswith(("https://", "http://")):
            raise NotifyError(f"{field}.webhook", "must be an http:// or https:// URL")
        if len(webhook) > MAX_URL_CHARS or any(ch.isspace() for ch in webhook):
            raise NotifyError(f"{field}.webhook", "must be one URL of at most 2048 characters")
        return NotifyRule(tuple(sorted(on)), webhook=webhook, secret_env=secret_env)
    if not isinstance(command, list) or not command or len(command) > MAX_ARGV:
        raise NotifyError(f"{field}.command", f"must be a list of 1 to {MAX_ARGV} strings")
    for arg in command:
        if not isinstance(arg, str) or not arg or len(arg) > MAX_ARG_CHARS or "\0" in arg:
            raise NotifyError(f"{field}.command", f"{arg!r} is not a non-empty string argument")
    return NotifyRule(tuple(sorted(on)), command=tuple(command))


def notify_document(rules: Sequence[NotifyRule]) -> list[dict[str, Any]]:
    """The rules as JSON (what `parse_notify` reads back)."""
    documents = []
    for rule in rules:
        document: dict[str, Any] = {"on": list(rule.on)}
        if rule.webhook is not None:
            document["webhook"] = rule.webhook
            if rule.secret_env is not None:
                document["secret_env"] = rule.secret_env
        else:
            document["command"] = list(rule.command)
        documents.append(document)
    return documents


def plan_notify(raw: object) -> tuple[NotifyRule, ...]:
    """Read stored rules (revision, plan); a bad one is a PlanError."""
    try:
        return parse_notify(raw)
    except NotifyError as error:
        raise PlanError("notify", str(error)) from None


def due_append(
    run_id: str,
    workflow_key: str,
    rules: Sequence[NotifyRule],
    run_terminal: str,
    result_code: str | None,
    terminal_event_id: str,
    metadata: Mapping[str, Any],
) -> StreamAppend | None:
    """The outbox records for a Run ending in `run_terminal`: one `notification.due`
    per matching rule, opening `notification-<run_id>` (a Run ends once, so the
    stream is new: expected version 0). None when no rule matches."""
    events = tuple(
        NewEvent(
            derive_id(NOTIFICATION_EVENT, terminal_event_id, index),
            EventType.NOTIFICATION_DUE,
            {
                "run_id": run_id,
                "workflow_key": workflow_key,
                "rule": index,
                "status": run_terminal,
                "result_code": result_code,
                "target": notify_document([rule])[0],
            },
            dict(metadata),
        )
        for index, rule in enumerate(rules)
        if run_terminal in rule.on
    )
    if not events:
        return None
    return StreamAppend(notification_stream(run_id), 0, events)


def retry_delay_ms(attempts_made: int) -> int | None:
    """How long after its `attempts_made`-th failed attempt a delivery is tried
    again (doubling from 1 s, capped at 5 min), or None: it has failed for good."""
    if attempts_made >= MAX_DELIVERY_ATTEMPTS:
        return None
    return int(min(BACKOFF_CAP_MS, BACKOFF_BASE_MS * 2 ** (attempts_made - 1)))


@dataclass(frozen=True, slots=True)
class Delivery:
    """One notification as its outbox stream leaves it: what is due, how many
    attempts were made, and whether it is delivered, failed for good, or pending
    (then `retry_at_ms` is when it may be tried)."""

    run_id: str
    workflow_key: str
    rule: int
    status: str
    result_code: str | None
    target: Mapping[str, Any]
    notification_id: str
    due_at_ms: int
    attempts: int = 0
    delivered: bool = False
    failed: bool = False
    retry_at_ms: int = 0
    last_error: str | None = None

    @property
    def state(self) -> str:
        """DELIVERED, Status.FAILED (no attempt is left) or Status.PENDING."""
        if self.delivered:
            return DELIVERED
        return Status.FAILED if self.failed else Status.PENDING

    @property
    def is_pending(self) -> bool:
        """Neither delivered nor failed for good: a host will try it again."""
        return not self.delivered and not self.failed


def fold_deliveries(records: Sequence[Any]) -> list[Delivery]:
    """The deliveries of one `notification-<run_id>` stream, by rule (records are
    `domain.records.Record`s in stream order)."""
    by_rule: dict[int, Delivery] = {}
    for record in records:
        rule = record.data.get("rule")
        after = next_delivery(by_rule.get(rule), record)
        if after is not None:
            by_rule[after.rule] = after
    return [by_rule[rule] for rule in sorted(by_rule)]


def next_delivery(before: Delivery | None, record: Any) -> Delivery | None:
    """One delivery after one more record of its outbox stream: `notification.due`
    makes it, `notification.attempted` counts an attempt at it (None: the record is
    not about a delivery `before` holds)."""
    data = record.data
    if record.type == EventType.NOTIFICATION_DUE:
        at_ms = int(record.metadata.get("at_ms", 0))
        return Delivery(
            run_id=data["run_id"],
            workflow_key=data.get("workflow_key", ""),
            rule=data["rule"],
            status=data["status"],
            result_code=data.get("result_code"),
            target=data["target"],
            notification_id=record.event_id,
            due_at_ms=at_ms,
            retry_at_ms=at_ms,
        )
    if record.type != EventType.NOTIFICATION_ATTEMPTED or before is None:
        return None
    retry_at = data["retry_at_ms"]
    return dataclasses.replace(
        before,
        attempts=max(before.attempts, data["attempt"]),
        delivered=before.delivered or data["delivered"],
        failed=not data["delivered"] and retry_at is None,
        retry_at_ms=retry_at if retry_at is not None else before.retry_at_ms,
        last_error=data.get("error"),
    )


def attempt_data(
    delivery: Delivery, now_ms: int, delivered: bool, error: str | None
) -> dict[str, Any]:
    """The `notification.attempted` record of one more attempt at `delivery`: its
    number, outcome and, when it failed, when to try again (None: given up)."""
    attempt = delivery.attempts + 1
    delay = None if delivered else retry_delay_ms(attempt)
    return {
        "rule": delivery.rule,
        "attempt": attempt,
        "delivered": delivered,
        "at_ms": now_ms,
        "retry_at_ms": None if delay is None else now_ms + delay,
        "error": None if delivered else (error or "no reason given")[:500],
    }


def attempt_event_id(delivery: Delivery, attempt: int) -> str:
    """The id of the record of attempt `attempt` (two hosts trying the same attempt
    meet an idempotency or version conflict, not two records)."""
    return derive_id(NOTIFICATION_EVENT, delivery.notification_id, "attempt", attempt)
