"""Structured logs of what a host's commits did (docs/DESIGN.md, "Observability").

One store observer turns the records each commit appended into log records on the
`qlflow.events` logger — a lease, a completion, a retry, an interruption, a Run's
end, a schedule's fire or skip — and each StoreUnavailable into a store error, each
carrying the ids a log search needs in `record.qlflow`. `JsonFormatter` prints any
log record as one JSON object per line (`qlflow serve --log-format json`); the
default formatter prints the message alone.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import orjson

from domain import event_types, streams
from domain.event_types import EventType, Family
from domain.records import Record
from domain.transitions import (
    ATTEMPT_INTERRUPTED,
    ATTEMPT_TERMINAL,
    RETRY_CHANGE,
    RUN_TERMINAL,
    WORKER_SHUTDOWN,
)
from eventstore.api import EventStore
from eventstore.observers import Commit

log = logging.getLogger("qlflow.events")
_HELD = 65_536  # attempt id -> (run id, step key) of the claims and leases seen


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time (epoch ms), level, logger, message, and the
    fields a qlflow event carries (`record.qlflow`)."""

    def format(self, record: logging.LogRecord) -> str:
        document: dict[str, Any] = {
            "ts_ms": int(record.created * 1000),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        fields = getattr(record, "qlflow", None)
        if isinstance(fields, dict):
            document.update(fields)
        if record.exc_info:
            document["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(document, default=str).decode()


def emit(event: str, message: str, *, level: int = logging.INFO, **fields: Any) -> None:
    """Log one qlflow event with its fields (`event` names it in JSON)."""
    if log.isEnabledFor(level):
        log.log(level, message, extra={"qlflow": {"event": event, **fields}})


class _CommitLog:
    """Turns a commit's records into qlflow events."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # commits of a PostgreSQL store come from many threads
        self._attempts: OrderedDict[str, tuple[str, str]] = OrderedDict()
        ended = {event_types.of(Family.ATTEMPT, s): self._attempt_ended
                 for s in ATTEMPT_TERMINAL}  # fmt: skip
        runs = {event_types.of(Family.WORKFLOW, s): self._run_ended for s in RUN_TERMINAL}
        self._handlers: dict[str, Callable[[Record], None]] = {
            EventType.ATTEMPT_CLAIMED: self._claimed,
            EventType.LEASE_GRANTED: self._granted,
            event_types.of(Family.STEP, RETRY_CHANGE[1]): self._step_ready,
            EventType.SCHEDULE_FIRED: self._fired,
            EventType.SCHEDULE_SKIPPED: self._skipped,
            **ended,
            **runs,
        }

    def __call__(self, commit: Commit) -> None:
        if not log.isEnabledFor(logging.INFO):
            return
        handlers = self._handlers
        with self._lock:
            for record in commit.records:
                handler = handlers.get(record.type)
                if handler is not None:
                    handler(record)

    def _hold(self, attempt_id: str, run_id: str, step_key: str) -> None:
        self._attempts[attempt_id] = (run_id, step_key)
        if len(self._attempts) > _HELD:
            self._attempts.popitem(last=False)

    def _claimed(self, record: Record) -> None:
        data = record.data
        self._hold(data["attempt_id"], streams.entity_id(record.stream_id), data["step_key"])

    def _granted(self, record: Record) -> None:
        data = record.data
        self._hold(data["attempt_id"], data["run_id"], data["step_key"])
        emit(
            "lease",
            f"lease {data['lease_id']} of attempt {data['attempt_id']} "
            f"({data['run_id']}/{data['step_key']}) to {data['worker_id']}",
            run_id=data["run_id"],
            step_key=data["step_key"],
            attempt_id=data["attempt_id"],
            lease_id=data["lease_id"],
            task_ref=data["task_ref"],
            worker_id=data["worker_id"],
            expires_at_ms=data["expires_at_ms"],
        )

    def _attempt_ended(self, record: Record) -> None:
        data = record.data
        run_id = streams.entity_id(record.stream_id)
        step_key = self._attempts.pop(data["attempt_id"], (run_id, None))[1]
        outcome = event_types.name(record.type)
        interrupted = outcome == ATTEMPT_INTERRUPTED or data.get("result_code") == WORKER_SHUTDOWN
        emit(
            "interruption" if interrupted else "completion",
            f"attempt {data['attempt_id']} ({run_id}/{step_key}): {outcome}"
            + (f" ({data['result_code']})" if data.get("result_code") else ""),
            run_id=run_id,
            step_key=step_key,
            attempt_id=data["attempt_id"],
            outcome=outcome,
            result_code=data.get("result_code"),
        )

    def _step_ready(self, record: Record) -> None:
        data = record.data
        if (data.get("from"), data.get("to")) != RETRY_CHANGE or data.get("retry_at_ms") is None:
            return
        run_id = streams.entity_id(record.stream_id)
        emit(
            "retry",
            f"step {run_id}/{data['step_key']}: attempt {data['attempt_id']} failed, "
            f"retry at {data['retry_at_ms']}",
            run_id=run_id,
            step_key=data["step_key"],
            attempt_id=data["attempt_id"],
            retry_at_ms=data["retry_at_ms"],
        )

    def _run_ended(self, record: Record) -> None:
        run_id = streams.entity_id(record.stream_id)
        status = event_types.name(record.type)
        emit(
            "run_ended",
            f"run {run_id}: {status}",
            run_id=run_id,
            status=status,
            result_code=record.data.get("result_code"),
        )

    def _fired(self, record: Record) -> None:
        data = record.data
        schedule_id = streams.entity_id(record.stream_id)
        emit(
            "schedule_fired",
            f"schedule {schedule_id}: fired for {data['scheduled_for_ms']}, run {data['run_id']}",
            schedule_id=schedule_id,
            run_id=data["run_id"],
            scheduled_for_ms=data["scheduled_for_ms"],
        )

    def _skipped(self, record: Record) -> None:
        data = record.data
        schedule_id = streams.entity_id(record.stream_id)
        emit(
            "schedule_skipped",
            f"schedule {schedule_id}: skipped {data['from_ms']}..{data['to_ms']} "
            f"({data['reason']})",
            schedule_id=schedule_id,
            reason=data["reason"],
            from_ms=data["from_ms"],
            to_ms=data["to_ms"],
        )


def _store_error(reason: str) -> None:
    emit("store_error", f"store unavailable ({reason})", level=logging.WARNING, reason=reason)


def log_commits(store: EventStore) -> Callable[[], None]:
    """Log what every commit of `store` does, and its errors; returns what stops it."""
    remove_commits = store.observers.on_commit(_CommitLog())
    remove_errors = store.observers.on_error(_store_error)

    def stop() -> None:
        remove_commits()
        remove_errors()

    return stop
