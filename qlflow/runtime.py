"""The embedding API (SPEC §10): `qlflow.open(...)` returns a `Runtime`."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import eventstore
from actors import workers
from actors.authority import OperationAuthority
from actors.supervisor import Cycle, CycleResult
from domain.errors import InvalidInput
from domain.text import is_storable_text
from projections import registry, views

log = logging.getLogger("qlflow")

Lease = workers.Lease


@dataclass(frozen=True, slots=True)
class Profile:
    """Page sizes of a deployment profile, and the store kind it runs on."""

    name: str
    store: str  # eventstore.SQLITE | eventstore.POSTGRESQL
    page_size: int
    pages_per_phase: int


PROFILES = {
    "edge": Profile("edge", eventstore.SQLITE, 8, 1),
    "standalone": Profile("standalone", eventstore.SQLITE, 32, 4),
    "cluster": Profile("cluster", eventstore.POSTGRESQL, 32, 4),
}
DEFAULT_PROFILE = {eventstore.SQLITE: "standalone", eventstore.POSTGRESQL: "cluster"}

OUTCOMES = ("succeeded", "failed")
RUN_STATUSES = frozenset({"running", "succeeded", "failed", "cancelled", "timed_out"})
MAX_MS = 2**53 - 1  # every instant and duration fits a JSON number exactly
CANCEL_REASONS = ("user", "policy", "shutdown", "reconcile", "timeout")


def default_url() -> str:
    """`$QLFLOW_DB`, else `./qlflow.db` (embedded SQLite)."""
    return os.environ.get("QLFLOW_DB") or f"sqlite:///{Path('qlflow.db').resolve()}"


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


def _now(now_ms: int | None) -> int:
    if now_ms is None:
        return wall_clock_ms()
    return _instant("now_ms", now_ms)


def _instant(field: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_MS:
        raise InvalidInput(
            field,
            "non-negative integer",
            f"{field} must be an int from 0 to {MAX_MS} (milliseconds), got {value!r}",
        )
    return value


def _text(field: str, value: Any) -> str:
    """A non-empty string of UTF-8 text without NUL (both stores can hold it)."""
    if not is_storable_text(value):
        raise InvalidInput(
            field,
            "non-empty string",
            f"{field} must be a non-empty string of UTF-8 text without NUL, got {value!r}",
        )
    return value


def _optional_text(field: str, value: Any) -> str | None:
    return None if value is None else _text(field, value)


def _texts(field: str, values: Any) -> frozenset[str]:
    """An iterable of texts (not one string) as a set."""
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise InvalidInput(
            field,
            "iterable of strings",
            f"{field} must be a list of strings, got {type(values).__name__}",
        )
    return frozenset(_text(f"{field}[]", value) for value in values)


def _positive(field: str, value: Any, low: int = 1, high: int = MAX_MS) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        bound = f"between {low} and {high}"
        raise InvalidInput(
            field, "integer range", f"{field} must be an integer {bound}, got {value!r}"
        )
    return value


def resolve_profile(url: str, profile: str | None, page_size: int | None) -> Profile:
    kind = eventstore.store_kind(url)
    if profile is None:
        profile = DEFAULT_PROFILE[kind]
    if profile not in PROFILES:
        raise InvalidInput(
            "profile",
            "one of edge, standalone, cluster",
            f"unknown profile {profile!r}; use edge, standalone or cluster",
        )
    chosen = PROFILES[profile]
    if chosen.store != kind:
        raise InvalidInput(
            "profile",
            "matches the store",
            f"profile {profile!r} runs on {chosen.store}, but the url is {kind}",
        )
    if page_size is not None:
        limit = 128 if profile == "cluster" else chosen.page_size
        _positive("page_size", page_size, 1, limit)
        chosen = Profile(chosen.name, chosen.store, page_size, chosen.pages_per_phase)
    return chosen


class Runtime:
    """An opened qlflow runtime. Every method is one or a few short transactions;
    nothing runs between calls (the host drives `cycle`)."""

    def __init__(
        self,
        url: str | None = None,
        profile: str | None = None,
        *,
        page_size: int | None = None,
        **store_options: Any,
    ) -> None:
        self.url = url or default_url()
        self.profile = resolve_profile(self.url, profile, page_size)
        self.store = eventstore.open_store(self.url, **store_options)
        try:
            registry.migrate_all(self.store)
            self._authority = OperationAuthority(self.store)
        except BaseException:
            self.store.close()
            raise
        self._cycle = Cycle(self._authority, self.profile.page_size, self.profile.pages_per_phase)
        self._closed = False

    # -- packages and admission -------------------------------------------
    def publish(
        self, path_or_manifest: str | os.PathLike | Mapping[str, Any], now_ms: int | None = None
    ):
        """Publish a package folder (or a manifest dict); unchanged content is a no-op."""
        from actors import publishing
        from qlflow import packages

        revision_input = packages.load(path_or_manifest)
        now = _now(now_ms)
        return self._authority.execute(
            lambda tx: publishing.publish_in_tx(tx, revision_input, now), name="publish"
        )

    def withdraw(self, publication_id: str, now_ms: int | None = None) -> None:
        """Stop new starts from this publication (admitted Runs finish)."""
        from actors import publishing

        publication_id, now = _text("publication_id", publication_id), _now(now_ms)
        self._authority.execute(
            lambda tx: publishing.withdraw_in_tx(tx, publication_id, now), name="withdraw"
        )

    def quarantine(self, publication_id: str, now_ms: int | None = None) -> None:
        """Quarantine a publication: no new starts."""
        from actors import publishing

        publication_id, now = _text("publication_id", publication_id), _now(now_ms)
        self._authority.execute(
            lambda tx: publishing.quarantine_in_tx(tx, publication_id, now), name="quarantine"
        )

    def revoke_publisher(self, publisher: str, now_ms: int | None = None) -> None:
        """Revoke a publisher's trust: none of its publications may start Workflows."""
        from actors import publishing

        publisher, now = _text("publisher", publisher), _now(now_ms)
        self._authority.execute(
            lambda tx: publishing.revoke_publisher_in_tx(tx, publisher, now), name="revoke"
        )

    def start(
        self,
        package: str,
        workflow: str,
        *,
        admission_key: str | None = None,
        run_id: str | None = None,
        timeout_ms: int | None = None,
        now_ms: int | None = None,
    ):
        """Admit a Workflow Run (SPEC §4); an exact replay returns status "existing"."""
        from actors import admission

        package, workflow = _text("package", package), _text("workflow", workflow)
        if timeout_ms is not None:
            _positive("timeout_ms", timeout_ms)
        return admission.start(
            self._authority,
            package,
            workflow,
            admission_key=admission_key,
            run_id=run_id,
            timeout_ms=timeout_ms,
            now_ms=_now(now_ms),
        )

    def inspect_admission(self, run_id: str | None = None, admission_key: str | None = None):
        """The durable admission receipt by run id or admission key, or None."""
        from actors import admission

        run_id = _optional_text("run_id", run_id)
        admission_key = _optional_text("admission_key", admission_key)
        return admission.inspect_admission(self.store, run_id=run_id, admission_key=admission_key)

    # -- the cycle -----------------------------------------------------------
    def cancel(self, run_id: str, reason: str = "user", now_ms: int | None = None) -> bool:
        """Record cancel intent (idempotent); the cycle converges the Run."""
        run_id = _text("run_id", run_id)
        if reason not in CANCEL_REASONS:
            raise InvalidInput(
                "reason",
                "cancel reason",
                f"reason must be one of {', '.join(CANCEL_REASONS)}, got {reason!r}",
            )
        return workers.cancel(self._authority, run_id, reason, _now(now_ms))

    def cycle(self, now_ms: int | None = None) -> CycleResult:
        """One bounded pass of every phase: recovery, cancellation, frontier, admission."""
        return self._cycle.run(_now(now_ms))

    # -- workers -----------------------------------------------------------
    def lease_attempts(
        self,
        worker_id: str,
        limit: int = 1,
        ttl_ms: int = 30_000,
        now_ms: int | None = None,
        run_id: str | None = None,
        step_key: str | None = None,
        tasks: Iterable[str] | None = None,
    ) -> list[Lease]:
        """Lease claimed Attempts for a worker, oldest first."""
        worker_id = _text("worker_id", worker_id)
        _positive("limit", limit, 1, 1024)
        _positive("ttl_ms", ttl_ms, 5_000, 600_000)
        task_set = None if tasks is None else _texts("tasks", tasks)
        run_id = _optional_text("run_id", run_id)
        step_key = _optional_text("step_key", step_key)
        return workers.lease_attempts(
            self._authority,
            worker_id,
            limit=limit,
            ttl_ms=ttl_ms,
            now_ms=_now(now_ms),
            run_id=run_id,
            step_key=step_key,
            tasks=task_set,
        )

    def mark_starting(self, lease: Lease, now_ms: int | None = None) -> Lease:
        """The start barrier: claimed+leased -> starting, before anything is spawned."""
        return workers.mark_starting(self._authority, _lease(lease), _now(now_ms))

    def mark_running(self, lease: Lease, now_ms: int | None = None) -> Lease:
        """starting -> running (passes through starting from claimed)."""
        return workers.mark_running(self._authority, _lease(lease), _now(now_ms))

    def renew(self, lease: Lease, ttl_ms: int = 30_000, now_ms: int | None = None) -> Lease:
        """Extend the lease: a new version; `.stop_requested` when the Run has cancel intent."""
        _positive("ttl_ms", ttl_ms, 5_000, 600_000)
        return workers.renew(self._authority, _lease(lease), ttl_ms, _now(now_ms))

    def complete(
        self,
        lease: Lease,
        outcome: str,
        *,
        result_code: str | None = None,
        output: Mapping[str, Any] | None = None,
        now_ms: int | None = None,
    ) -> str:
        """Record the Attempt's outcome under its lease; returns the recorded status."""
        if outcome not in OUTCOMES:
            raise InvalidInput(
                "outcome",
                "succeeded or failed",
                f"outcome must be 'succeeded' or 'failed', got {outcome!r}",
            )
        if output is not None and not isinstance(output, Mapping):
            raise InvalidInput("output", "JSON object", "output must be a mapping (a JSON object)")
        if result_code is not None:
            _text("result_code", result_code)
        return workers.complete(
            self._authority,
            _lease(lease),
            outcome,
            result_code=result_code,
            output=dict(output) if output is not None else None,
            now_ms=_now(now_ms),
        )

    # -- reading -----------------------------------------------------------
    def get_run(self, run_id: str) -> views.RunView:
        """The Run with its steps and Attempts, from the read models."""
        return views.get_run(self.store, _text("run_id", run_id))

    def runs(self, status: str | None = None, limit: int = 100) -> list[views.RunView]:
        """Recent Runs, newest first."""
        if status is not None and (not isinstance(status, str) or status not in RUN_STATUSES):
            raise InvalidInput(
                "status",
                "run status",
                f"status must be one of {', '.join(sorted(RUN_STATUSES))}, got {status!r}",
            )
        return views.list_runs(self.store, status=status, limit=_positive("limit", limit))

    def events(
        self,
        run_id: str | None = None,
        *,
        types: Iterable[str] | None = None,
        since_ms: int | None = None,
        until_ms: int | None = None,
        after_position: int = 0,
        limit: int | None = None,
    ):
        """Events of the log by Run, type, time and position."""
        return views.events(
            self.store,
            _optional_text("run_id", run_id),
            types=None if types is None else _texts("types", types),
            since_ms=None if since_ms is None else _instant("since_ms", since_ms),
            until_ms=None if until_ms is None else _instant("until_ms", until_ms),
            after_position=_positive("after_position", after_position, 0),
            limit=None if limit is None else _positive("limit", limit),
        )

    def why(self, run_id: str, now_ms: int | None = None):
        """Why the Run is not terminal (blocked Attempts, leases, holders, expiry), or
        for a terminal Run its root cause."""
        from projections import audit

        return audit.why(self.store, _text("run_id", run_id), _now(now_ms))

    def timeline(self, run_id: str):
        """The Run's events (run, steps and lease streams) in commit order, summarized."""
        from projections import audit

        return audit.timeline(self.store, _text("run_id", run_id))

    def step_history(self, run_id: str, step_key: str):
        """Every event about one Step of a Run."""
        from projections import audit

        return audit.step_history(self.store, _text("run_id", run_id), _text("step_key", step_key))

    def aggregate_at(self, run_id: str, version: int | None = None):
        """The Run's aggregate as it was at run-stream `version` (None: now)."""
        from projections import audit

        if version is not None:
            _positive("version", version)
        return audit.aggregate_at(self.store, _text("run_id", run_id), version)

    def rebuild_projections(self, progress=None):
        """Replay the whole log into fresh read models and swap them in atomically."""
        from projections import rebuild

        summary = rebuild.rebuild(self.store, progress)
        log.info("rebuilt read models from %d events", summary.events)
        return summary

    def verify_projections(self, progress=None):
        """Prove the live read models equal a replay of the log (report.ok)."""
        from projections import verify

        return verify.verify(self.store, progress)

    def close(self) -> None:
        """Stop the runtime's actors and close the store. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._authority.stop()
        self.store.close()

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _lease(lease: Any) -> Lease:
    if not isinstance(lease, Lease):
        raise InvalidInput(
            "lease", "Lease", f"expected a Lease from lease_attempts, got {type(lease).__name__}"
        )
    for name in ("lease_id", "attempt_id", "run_id", "step_key", "task_ref", "worker_id"):
        _text(f"lease.{name}", getattr(lease, name))
    _positive("lease.version", lease.version)
    _instant("lease.expires_at_ms", lease.expires_at_ms)
    if not isinstance(lease.stop_requested, bool):
        raise InvalidInput("lease.stop_requested", "bool", "lease.stop_requested must be a bool")
    return lease
