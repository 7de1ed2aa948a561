"""The same API as `Runtime`, as coroutines. Each call runs on a worker thread
(`asyncio.to_thread`): the runtime's waits are blocking (pykka futures, database
calls), and awaiting them on the loop thread would stall every other task.

Every method has the signature and docstring of the `Runtime` method it runs."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterable, Mapping
from typing import Any

from actors.supervisor import CycleResult
from domain.aggregate import RunAggregate
from domain.records import Record
from domain.values import AdmissionReceipt, Publication
from projections.audit import TimelineEntry, WhyReport
from projections.rebuild import Progress, RebuildSummary
from projections.verify import VerifyReport
from projections.views import RunView
from qlflow.runtime import Lease, Runtime


class AsyncRuntime:
    """Async facade over a `Runtime`: `await rt.cycle()`, `await rt.close()`."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime

    @classmethod
    async def open(cls, url: str | None, profile: str | None, **options: Any) -> AsyncRuntime:
        """Open a `Runtime` off the event loop and wrap it."""
        return cls(await asyncio.to_thread(Runtime, url, profile, **options))

    async def publish(
        self,
        path_or_manifest: str | os.PathLike[str] | Mapping[str, Any],
        now_ms: int | None = None,
    ) -> Publication:
        """Publish a package folder (or a manifest dict); unchanged content is a no-op."""
        return await asyncio.to_thread(self.runtime.publish, path_or_manifest, now_ms)

    async def withdraw(self, publication_id: str, now_ms: int | None = None) -> None:
        """Stop new starts from this publication (admitted Runs finish)."""
        await asyncio.to_thread(self.runtime.withdraw, publication_id, now_ms)

    async def quarantine(self, publication_id: str, now_ms: int | None = None) -> None:
        """Quarantine a publication: no new starts."""
        await asyncio.to_thread(self.runtime.quarantine, publication_id, now_ms)

    async def revoke_publisher(self, publisher: str, now_ms: int | None = None) -> None:
        """Revoke a publisher's trust: none of its publications may start Workflows."""
        await asyncio.to_thread(self.runtime.revoke_publisher, publisher, now_ms)

    async def start(
        self,
        package: str,
        workflow: str,
        *,
        admission_key: str | None = None,
        run_id: str | None = None,
        timeout_ms: int | None = None,
        now_ms: int | None = None,
    ) -> AdmissionReceipt:
        """Admit a Workflow Run durably; an exact replay returns status "existing"."""
        return await asyncio.to_thread(
            self.runtime.start,
            package,
            workflow,
            admission_key=admission_key,
            run_id=run_id,
            timeout_ms=timeout_ms,
            now_ms=now_ms,
        )

    async def inspect_admission(
        self, run_id: str | None = None, admission_key: str | None = None
    ) -> AdmissionReceipt | None:
        """The durable admission receipt by run id or admission key, or None."""
        return await asyncio.to_thread(self.runtime.inspect_admission, run_id, admission_key)

    async def cancel(self, run_id: str, reason: str = "user", now_ms: int | None = None) -> bool:
        """Record cancel intent (idempotent); the cycle converges the Run. `reason` is
        one of `domain.transitions.CANCEL_REASONS` (user, policy, shutdown, reconcile,
        timeout). True if this call recorded it."""
        return await asyncio.to_thread(self.runtime.cancel, run_id, reason, now_ms)

    async def cycle(self, now_ms: int | None = None) -> CycleResult:
        """One bounded pass of every phase: recovery, cancellation, frontier, admission."""
        return await asyncio.to_thread(self.runtime.cycle, now_ms)

    async def lease_attempts(
        self,
        worker_id: str,
        limit: int = 1,
        ttl_ms: int = 30_000,
        now_ms: int | None = None,
        run_id: str | None = None,
        step_key: str | None = None,
        tasks: Iterable[str] | None = None,
    ) -> list[Lease]:
        """Lease claimed Attempts for a worker, oldest first (`ttl_ms`: 5 s to 10 min)."""
        return await asyncio.to_thread(
            self.runtime.lease_attempts, worker_id, limit, ttl_ms, now_ms, run_id, step_key, tasks
        )

    async def mark_starting(self, lease: Lease, now_ms: int | None = None) -> Lease:
        """The start barrier: claimed+leased -> starting, before anything is spawned."""
        return await asyncio.to_thread(self.runtime.mark_starting, lease, now_ms)

    async def mark_running(self, lease: Lease, now_ms: int | None = None) -> Lease:
        """starting -> running (passes through starting from claimed)."""
        return await asyncio.to_thread(self.runtime.mark_running, lease, now_ms)

    async def renew(self, lease: Lease, ttl_ms: int = 30_000, now_ms: int | None = None) -> Lease:
        """Extend the lease: a new version; `.stop_requested` when the Run has cancel intent."""
        return await asyncio.to_thread(self.runtime.renew, lease, ttl_ms, now_ms)

    async def complete(
        self,
        lease: Lease,
        outcome: str,
        *,
        result_code: str | None = None,
        output: Mapping[str, Any] | None = None,
        now_ms: int | None = None,
    ) -> str:
        """Record the Attempt's outcome (succeeded | failed) under its lease; returns the
        recorded status (cancelled or timed_out when the Run has cancel intent)."""
        return await asyncio.to_thread(
            self.runtime.complete,
            lease,
            outcome,
            result_code=result_code,
            output=output,
            now_ms=now_ms,
        )

    async def get_run(self, run_id: str) -> RunView:
        """The Run with its steps and Attempts, from the read models."""
        return await asyncio.to_thread(self.runtime.get_run, run_id)

    async def runs(self, status: str | None = None, limit: int = 100) -> list[RunView]:
        """Recent Runs, newest first."""
        return await asyncio.to_thread(self.runtime.runs, status, limit)

    async def events(
        self,
        run_id: str | None = None,
        *,
        types: Iterable[str] | None = None,
        since_ms: int | None = None,
        until_ms: int | None = None,
        after_position: int = 0,
        limit: int | None = None,
    ) -> list[Record]:
        """Events of the log by Run, type, time and position."""
        return await asyncio.to_thread(
            self.runtime.events,
            run_id,
            types=types,
            since_ms=since_ms,
            until_ms=until_ms,
            after_position=after_position,
            limit=limit,
        )

    async def why(self, run_id: str, now_ms: int | None = None) -> WhyReport:
        """Why the Run is not terminal (blocked Attempts, leases, holders, expiry), or
        for a terminal Run its root cause."""
        return await asyncio.to_thread(self.runtime.why, run_id, now_ms)

    async def timeline(self, run_id: str) -> list[TimelineEntry]:
        """The Run's events (run, steps and lease streams) in commit order, summarized."""
        return await asyncio.to_thread(self.runtime.timeline, run_id)

    async def step_history(self, run_id: str, step_key: str) -> list[TimelineEntry]:
        """Every event about one Step of a Run."""
        return await asyncio.to_thread(self.runtime.step_history, run_id, step_key)

    async def aggregate_at(self, run_id: str, version: int | None = None) -> RunAggregate:
        """The Run's aggregate as it was at run-stream `version` (None: now)."""
        return await asyncio.to_thread(self.runtime.aggregate_at, run_id, version)

    async def rebuild_projections(self, progress: Progress | None = None) -> RebuildSummary:
        """Replay the whole log into fresh read models and swap them in atomically.
        `progress(done, total)` is called as the replay goes."""
        return await asyncio.to_thread(self.runtime.rebuild_projections, progress)

    async def verify_projections(self, progress: Progress | None = None) -> VerifyReport:
        """Prove the live read models equal a replay of the log (`report.ok`)."""
        return await asyncio.to_thread(self.runtime.verify_projections, progress)

    async def close(self) -> None:
        """Stop the runtime's actors and close the store. Idempotent."""
        await asyncio.to_thread(self.runtime.close)

    async def __aenter__(self) -> AsyncRuntime:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
