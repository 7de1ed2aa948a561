"""Typed errors of qlflow. Every layer raises these; `qlflow.errors` re-exports them.

Each error says what was wrong and, where it helps, what to do about it.
"""

from __future__ import annotations


class QlflowError(Exception):
    """Base of every error qlflow raises on purpose."""


class InvalidInput(QlflowError, ValueError):
    """An argument broke a rule; `field` names it and `rule` names the rule."""

    def __init__(self, field: str, rule: str, message: str | None = None) -> None:
        self.field = field
        self.rule = rule
        super().__init__(message or f"{field}: {rule}")


class AmbiguousId(InvalidInput):
    """A short id names more than one Run (Attempt, schedule): `candidates` lists the
    ids it matches (`more` when there are others besides)."""

    def __init__(self, kind: str, text: str, candidates: tuple[str, ...], more: bool) -> None:
        self.kind = kind
        self.text = text
        self.candidates = candidates
        self.more = more
        listed = ", ".join(candidates) + (", ..." if more else "")
        super().__init__(
            kind,
            "unique prefix",
            f"{text!r} is the start of more than one {kind} id ({listed}); give more of it",
        )


class PlanError(QlflowError, ValueError):
    """An execution plan (or the package it is built from) breaks a rule; `rule` names it."""

    def __init__(self, rule: str, message: str) -> None:
        self.rule = rule
        super().__init__(f"{rule}: {message}")


class ManifestError(QlflowError, ValueError):
    """A package manifest (`qlflow.toml`) is malformed; the message names file, table,
    key, and so do `source`, `table` and `key` (None where the problem has none)."""

    def __init__(
        self,
        message: str,
        *,
        source: str | None = None,
        table: str | None = None,
        key: str | None = None,
    ) -> None:
        self.source = source
        self.table = table
        self.key = key
        super().__init__(message)


class StartGuardError(QlflowError):
    """Admission refused: the publication may not start Workflows (withdrawn,
    quarantined, superseded, publisher revoked, or the Workflow is disabled).
    `reason` names the rule that refused (see domain.start_guard)."""

    reason: str


class AdmissionCollision(QlflowError):
    """The run id or admission key is already bound to a different plan."""


class VersionConflict(QlflowError):
    """A stream was not at the expected version; nothing was written."""

    def __init__(self, stream_id: str, expected: int, actual: int) -> None:
        self.stream_id = stream_id
        self.expected = expected
        self.actual = actual
        super().__init__(
            f"stream {stream_id!r} is at version {actual}, expected {expected}; "
            "nothing was written — reload the stream and decide again"
        )


class IdempotencyConflict(QlflowError):
    """An event id already exists with different content or at another place."""

    def __init__(self, event_id: str, reason: str) -> None:
        self.event_id = event_id
        super().__init__(
            f"event {event_id!r} already exists {reason}; nothing was written — "
            "an event id names exactly one fact"
        )


class FenceError(QlflowError):
    """A worker write presented a lease that is expired, replaced or completed."""


class NotFound(QlflowError, LookupError):
    """The named Run, publication, package, workflow or receipt does not exist."""


class CorruptionError(QlflowError):
    """The log breaks an integrity rule of the fold; the message names the record."""


class SchemaError(QlflowError):
    """The database schema cannot be used by this version of qlflow."""


class LockTimeout(QlflowError, TimeoutError):
    """A store lock was not granted within the store's lock timeout: another
    transaction held it that long. The transaction rolls back and nothing is
    written; try again (a worker write is retried like a busy database)."""


class StoreUnavailable(QlflowError):
    """The store cannot serve the call right now: unreachable, busy past its
    timeout, out of disk space, read-only, or failing I/O. `reason` says which
    ("unreachable", "busy", "disk_full", "read_only", "io_error"). The call wrote
    nothing — or, when it failed at COMMIT, its outcome is unknown; either way the
    same call again is safe (qlflow's writes replay). Try again later."""

    REASONS = ("unreachable", "busy", "disk_full", "read_only", "io_error")

    def __init__(self, reason: str, message: str) -> None:
        self.reason = reason
        super().__init__(message)


class DurabilityWarning(UserWarning):
    """A store was opened with a setting that may lose acknowledged writes on power
    loss or an operating-system crash (SQLite `synchronous=NORMAL` or `OFF`)."""
