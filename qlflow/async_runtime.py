"""The same API as `Runtime`, as coroutines. Each call runs on a worker thread
(`asyncio.to_thread`): the runtime's waits are blocking (pykka futures, database
calls), and awaiting them on the loop thread would stall every other task.

Every method has the signature and docstring of the `Runtime` method it runs."""

from __future__ import annotations

import asyncio
import functools
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from actors.backfill import BackfillResult
from actors.supervisor import CycleResult
from domain.aggregate import RunAggregate
from domain.params import ParamDefinition
from domain.records import Record
from domain.values import AdmissionReceipt, Publication
from eventstore.logs import LogState, Piece, Pruned
from projections.audit import TimelineEntry, WhyReport
from projections.package_views import PackageView
from projections.rebuild import Progress, RebuildSummary
from projections.run_search import RunCursor
from projections.schedule_views import ScheduleView
from projections.step_logs import LAST_LINES, LogAttempt, LogChunk
from projections.task_io import TaskDefinitionView, TaskInputs
from projections.verify import VerifyReport
from projections.views import RunView
from qlflow.runtime import Completed, Completion, Lease, Runtime


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
        params: Mapping[str, Any] | None = None,
        now_ms: int | None = None,
    ) -> AdmissionReceipt:
        """Admit a Workflow Run durably; an exact replay returns status "existing".

        `params` gives the Workflow's declared parameters (name -> str, int or
        bool); defaults fill the rest and the plan binds them all."""
        return await asyncio.to_thread(
            self.runtime.start,
            package,
            workflow,
            admission_key=admission_key,
            run_id=run_id,
            timeout_ms=timeout_ms,
            params=params,
            now_ms=now_ms,
        )

    async def rerun(
        self,
        run_id: str,
        from_steps: Sequence[str] | None = None,
        plan: str = "same",
        admission_key: str | None = None,
        *,
        params: Mapping[str, Any] | None = None,
        now_ms: int | None = None,
    ) -> AdmissionReceipt:
        """Admit a new Run from finished Run `run_id` (docs/DESIGN.md "Reruns"): the
        steps that succeeded and are neither `from_steps` nor downstream of them are
        reused, the rest run. `plan` is "same" (the source's plan) or "head" (the
        package's current head; `params` may change then)."""
        return await asyncio.to_thread(
            self.runtime.rerun,
            run_id,
            from_steps,
            plan,
            admission_key,
            params=params,
            now_ms=now_ms,
        )

    async def backfill_schedule(
        self,
        schedule_id: str,
        from_ms: int,
        to_ms: int,
        *,
        max_runs: int = 1_000,
        dry_run: bool = False,
        now_ms: int | None = None,
    ) -> BackfillResult:
        """Admit one Run per occurrence of the schedule in [from_ms, to_ms), with the
        live firing's admission key (so never two Runs for one occurrence), at most
        `max_runs` (1..1000), in bounded transactions; `dry_run` lists them only."""
        return await asyncio.to_thread(
            self.runtime.backfill_schedule,
            schedule_id,
            from_ms,
            to_ms,
            max_runs=max_runs,
            dry_run=dry_run,
            now_ms=now_ms,
        )

    async def inspect_admission(
        self, run_id: str | None = None, admission_key: str | None = None
    ) -> AdmissionReceipt | None:
        """The durable admission receipt by run id or admission key, or None."""
        return await asyncio.to_thread(self.runtime.inspect_admission, run_id, admission_key)

    async def cancel(self, run_id: str, reason: str = "user", now_ms: int | None = None) -> bool:
        """Record cancel intent (idempotent) and, in the same commit, end what no
        worker holds; the cycle converges the rest. `reason` is one of
        `domain.transitions.CANCEL_REASONS` (user, policy, shutdown, reconcile,
        timeout). True if this call recorded it."""
        return await asyncio.to_thread(self.runtime.cancel, run_id, reason, now_ms)

    async def cancel_many(
        self, run_ids: Iterable[str], reason: str = "user", now_ms: int | None = None
    ) -> list[bool]:
        """`cancel` for several Runs in one commit; for each Run, in order, True if this
        call recorded its intent. A Run that does not exist (NotFound) or a bad reason
        refuses the whole call and writes nothing."""
        return await asyncio.to_thread(self.runtime.cancel_many, run_ids, reason, now_ms)

    async def cycle(self, now_ms: int | None = None) -> CycleResult:
        """One bounded pass of every phase: recovery, cancellation, schedule, frontier,
        admission."""
        return await asyncio.to_thread(self.runtime.cycle, now_ms)

    async def schedules(self) -> list[ScheduleView]:
        """Every schedule of a head publication that is not retired, by package,
        Workflow and id, with its cursor (next fire, last fire, paused)."""
        return await asyncio.to_thread(self.runtime.schedules)

    async def pause_schedule(self, schedule_id: str, now_ms: int | None = None) -> bool:
        """Stop a schedule's fires until it is resumed. True if this call paused it
        (False: it was paused already). NotFound for an unknown id."""
        return await asyncio.to_thread(self.runtime.pause_schedule, schedule_id, now_ms)

    async def resume_schedule(self, schedule_id: str, now_ms: int | None = None) -> bool:
        """Fire a paused schedule again, from its first occurrence after `now_ms`:
        what it missed while paused is not fired. True if this call resumed it."""
        return await asyncio.to_thread(self.runtime.resume_schedule, schedule_id, now_ms)

    async def lease_attempts(
        self,
        worker_id: str,
        limit: int = 1,
        ttl_ms: int = 30_000,
        now_ms: int | None = None,
        run_id: str | None = None,
        step_key: str | None = None,
        tasks: Iterable[str] | None = None,
        start: bool = False,
    ) -> list[Lease]:
        """Lease claimed Attempts for a worker, oldest first (`ttl_ms`: 5 s to 10 min).

        `start=True`: each grant also crosses the start barrier in the same commit (the
        Attempt is `starting`, `Lease.started` is set): for an executor that spawns at
        once; `mark_running` stays optional and `complete` is accepted from starting."""
        return await asyncio.to_thread(
            self.runtime.lease_attempts,
            worker_id,
            limit,
            ttl_ms,
            now_ms,
            run_id,
            step_key,
            tasks,
            start,
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
        execution: Mapping[str, Any] | None = None,
        now_ms: int | None = None,
    ) -> str:
        """Record the Attempt's outcome (succeeded | failed) under its lease; returns the
        recorded status (cancelled or timed_out when the Run has cancel intent).

        `output` is what the task returned (passed to the steps that need it);
        `execution` how it ran — `exit_code`, `signal`, `pid`, `log_path`, `stopped_by`,
        `error` — shown with the Attempt and passed nowhere."""
        return await asyncio.to_thread(
            self.runtime.complete,
            lease,
            outcome,
            result_code=result_code,
            output=output,
            execution=execution,
            now_ms=now_ms,
        )

    async def complete_many(
        self, completions: Iterable[Completion], now_ms: int | None = None
    ) -> list[Completed]:
        """Record several Attempts' outcomes in one commit, each exactly as `complete`
        would; the answers come in the same order. A bad argument in any of them (an
        unknown outcome, output that is not a JSON object) refuses the whole call
        (InvalidInput) and writes nothing; a completion its lease no longer allows
        (expired, replaced, the Run ended: FenceError) is answered with that error in
        `Completed.error`, nothing written for it, and the others are recorded."""
        return await asyncio.to_thread(self.runtime.complete_many, completions, now_ms)

    async def get_run(self, run_id: str) -> RunView:
        """The Run with its steps and Attempts, from the read models."""
        return await asyncio.to_thread(self.runtime.get_run, run_id)

    async def task_inputs(self, lease: Lease) -> TaskInputs:
        """What the leased step is given: `{"params": {...}, "needs": {key: output or
        None}}` (the Run's parameters, the succeeded output of each step it needs)."""
        return await asyncio.to_thread(self.runtime.task_inputs, lease)

    async def task_definition(self, lease: Lease) -> TaskDefinitionView:
        """The leased Task's command, env, files and package folder, from the revision
        the Run was admitted with."""
        return await asyncio.to_thread(self.runtime.task_definition, lease)

    async def runs(
        self,
        status: str | None = None,
        limit: int = 100,
        *,
        package: str | None = None,
        workflow: str | None = None,
        since_ms: int | None = None,
        until_ms: int | None = None,
        id_prefix: str | None = None,
        before: RunCursor | None = None,
        after: RunCursor | None = None,
        rerun_of: str | None = None,
    ) -> list[RunView]:
        """Runs newest first (by admission), filtered: status, package, workflow,
        admitted in [since_ms, until_ms), run id prefix, reruns of one Run (`rerun_of`). A
        page: the newest `limit`, or those older than `before` / newer than `after`
        (`views.cursor_of(run)`)."""
        return await asyncio.to_thread(
            self.runtime.runs,
            status,
            limit,
            package=package,
            workflow=workflow,
            since_ms=since_ms,
            until_ms=until_ms,
            id_prefix=id_prefix,
            before=before,
            after=after,
            rerun_of=rerun_of,
        )

    async def events(
        self,
        run_id: str | None = None,
        *,
        types: Iterable[str] | None = None,
        since_ms: int | None = None,
        until_ms: int | None = None,
        after_position: int = 0,
        limit: int | None = None,
        before_position: int | None = None,
        newest_first: bool = False,
    ) -> list[Record]:
        """Events of the log by Run, type, time and position (after `after_position`,
        before `before_position`), in position order or `newest_first`."""
        return await asyncio.to_thread(
            self.runtime.events,
            run_id,
            types=types,
            since_ms=since_ms,
            until_ms=until_ms,
            after_position=after_position,
            limit=limit,
            before_position=before_position,
            newest_first=newest_first,
        )

    async def clock_ms(self) -> int:
        """The store's time as last seen (docs/DESIGN.md, "One clock per store"): what
        every call without `now_ms` decides at — PostgreSQL's clock, read by each write
        in the round trip of its first statement and estimated between writes from
        this host's clock; SQLite's host clock."""
        return self.runtime.clock_ms()

    async def why(self, run_id: str, now_ms: int | None = None, log_lines: int = 10) -> WhyReport:
        """Why the Run is not terminal (blocked Attempts, leases, holders, expiry), or
        for a terminal Run its root cause; and every step that failed, timed out or
        was lost, with the last `log_lines` lines of its log."""
        return await asyncio.to_thread(self.runtime.why, run_id, now_ms, log_lines)

    async def timeline(self, run_id: str, mutations: bool = True) -> list[TimelineEntry]:
        """The Run's events (run, steps and lease streams) in commit order, summarized;
        `mutations=False` leaves out the StepRunMutations (each repeats a step event)."""
        return await asyncio.to_thread(self.runtime.timeline, run_id, mutations)

    async def step_history(self, run_id: str, step_key: str) -> list[TimelineEntry]:
        """Every event about one Step of a Run."""
        return await asyncio.to_thread(self.runtime.step_history, run_id, step_key)

    # -- finding out what happened (qlflow.inspection) ---------------------------------
    async def append_log(
        self, attempt_id: str, pieces: Sequence[Piece], *, left_out: int = 0
    ) -> LogState:
        """Append output of a running Attempt to its log in the store: pieces of
        `(stream, at_ms, bytes)`, stream stdout | stderr | qlflow (a note of the
        executor). The log keeps the first and the last `log_cap_bytes / 2` bytes and
        marks what it dropped between them, counting `left_out` bytes the writer read
        but could not send. Returns what the log now holds."""
        return await asyncio.to_thread(
            functools.partial(self.runtime.append_log, left_out=left_out), attempt_id, pieces
        )

    async def log_attempts(
        self, run_id: str, step_key: str | None = None, attempt: int | str | None = None
    ) -> list[LogAttempt]:
        """The Attempts of a Run (of one step; one of them: its number in the step, or
        its id) in claim order, each with what its log holds."""
        return await asyncio.to_thread(self.runtime.log_attempts, run_id, step_key, attempt)

    async def logs(
        self,
        run_id: str,
        step_key: str | None = None,
        attempt: int | str | None = None,
        *,
        after: Mapping[str, int] | None = None,
    ) -> list[LogChunk]:
        """The output of a Run's steps as stored (of one step; of one Attempt: its number
        in the step or its id), Attempt by Attempt in claim order, chunks in order.
        `after` maps attempt ids to the last seq already read, to follow a running step."""
        return await asyncio.to_thread(self.runtime.logs, run_id, step_key, attempt, after=after)

    async def last_log_lines(self, attempt_id: str, count: int = LAST_LINES) -> list[str]:
        """The last `count` lines of one Attempt's log (none when it wrote nothing)."""
        return await asyncio.to_thread(self.runtime.last_log_lines, attempt_id, count)

    async def prune_logs(self, before_ms: int) -> Pruned:
        """Delete every step log last written before `before_ms` (never an event)."""
        return await asyncio.to_thread(self.runtime.prune_logs, before_ms)

    async def resolve_run_id(self, text_or_prefix: str) -> str:
        """The Run id a person typed: the id, or any unique prefix of it (with or without
        `run:`). NotFound when none matches; AmbiguousId listing the matches."""
        return await asyncio.to_thread(self.runtime.resolve_run_id, text_or_prefix)

    async def resolve_attempt_id(self, text_or_prefix: str, run_id: str | None = None) -> str:
        """The Attempt id a person typed (the id or a unique prefix, `wta:` optional),
        among one Run's Attempts if `run_id` is given."""
        return await asyncio.to_thread(self.runtime.resolve_attempt_id, text_or_prefix, run_id)

    async def short_run_ids(self, run_ids: Sequence[str]) -> dict[str, str]:
        """The shortest prefix that names each Run (at least 8 hex digits of a derived
        id, without `run:`; an id chosen by hand whole)."""
        return await asyncio.to_thread(self.runtime.short_run_ids, run_ids)

    async def count_runs(
        self,
        *,
        package: str | None = None,
        workflow: str | None = None,
        status: str | None = None,
        since_ms: int | None = None,
        until_ms: int | None = None,
        id_prefix: str | None = None,
        at_most: int = 10_000,
    ) -> int:
        """How many Runs `runs(...)` with these filters would list without a limit,
        counted up to `at_most` + 1."""
        return await asyncio.to_thread(
            self.runtime.count_runs,
            package=package,
            workflow=workflow,
            status=status,
            since_ms=since_ms,
            until_ms=until_ms,
            id_prefix=id_prefix,
            at_most=at_most,
        )

    async def packages(self, package: str | None = None) -> list[PackageView]:
        """Every package installation (of one package name): its generations newest
        first, the current head, withdrawn or quarantined ones, its publisher's trust."""
        return await asyncio.to_thread(self.runtime.packages, package)

    async def workflow_params(self, package: str, workflow: str) -> list[ParamDefinition]:
        """The parameters `workflow` of the head of `package` declares (name, type,
        default, description), by name: what a start form offers. NotFound for an
        unknown package or Workflow."""
        return await asyncio.to_thread(self.runtime.workflow_params, package, workflow)

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
