"""The embedding API: `qlflow.open(...)` returns a `Runtime`."""

from __future__ import annotations

import atexit
import logging
import os
import threading
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import eventstore
from actors import admission, publishing, workers
from actors import rerun as reruns
from actors import retention as retaining
from actors.authority import OperationAuthority
from actors.retention import RetentionReport
from actors.supervisor import Cycle, CycleResult, PageResult
from domain import retention
from domain.aggregate import RunAggregate
from domain.cancellation import check_cancel_reason
from domain.errors import InvalidInput, QlflowError
from domain.flow import check_priority
from domain.lease_terms import check_lease_ttl, lease_expiry
from domain.records import Record
from domain.values import AdmissionReceipt, Publication
from domain.worker import WorkerInfo
from eventstore.api import StoreUsageError
from projections import audit, rebuild, registry, task_io, verify, views
from projections.audit import TimelineEntry, WhyReport
from projections.rebuild import Progress, RebuildSummary
from projections.run_search import RunCursor
from projections.verify import VerifyReport
from qlflow import archive as archiving
from qlflow import packages
from qlflow.arguments import (
    completions_of,
    flag,
    instant,
    lease_of,
    optional_text,
    positive,
    text,
    text_list,
    texts,
)
from qlflow.flow_control import FlowControl
from qlflow.inspection import Inspection
from qlflow.scheduling import Scheduling

log = logging.getLogger("qlflow")

Lease = workers.Lease
Completion = workers.Completion
Completed = workers.Completed
MAX_BATCH = 1024  # items in one `complete_many` or `cancel_many` call
UNANSWERED_KEPT = 1024  # request ids of raised lease calls a runtime remembers
MAX_REQUEST_ID = 128  # characters of a lease call's request id
__all__ = [
    "Completed", "Completion", "CycleResult", "Lease", "PageResult", "Profile", "Runtime",
    "default_url",
]  # fmt: skip


@dataclass(frozen=True, slots=True)
class Profile:
    """Page sizes of a deployment profile: candidates per page, pages per phase per cycle,
    and the store kind it runs on (docs/DESIGN.md, "Pages, the supervisor and Workflow actors")."""

    name: str
    store: str  # eventstore.SQLITE | eventstore.POSTGRESQL
    page_size: int
    pages_per_phase: int
    log_cap_bytes: int = 1024 * 1024  # of one Attempt's output, head and tail kept
    schedule_page_size: int = 16  # due schedules per page of the schedule phase
    schedule_grace_ms: int = 300_000  # how late an occurrence may still fire on time


PROFILES = {
    "edge": Profile("edge", eventstore.SQLITE, 8, 1, 64 * 1024, 4, 30_000),
    "standalone": Profile("standalone", eventstore.SQLITE, 32, 4),
    "cluster": Profile("cluster", eventstore.POSTGRESQL, 32, 4),
}
DEFAULT_PROFILE = {eventstore.SQLITE: "standalone", eventstore.POSTGRESQL: "cluster"}

EXIT_STOP_TIMEOUT_S = 5.0  # at exit, how long the unit the authority is running may finish


def default_url() -> str:
    """`$QLFLOW_DB`, else `./qlflow.db` (embedded SQLite)."""
    return os.environ.get("QLFLOW_DB") or f"sqlite:///{Path('qlflow.db').resolve()}"


def _given(now_ms: int | None) -> int | None:
    """`now_ms` as given (checked), or None: the unit reads the store's clock."""
    return None if now_ms is None else instant("now_ms", now_ms)


def _completion(
    lease: Lease,
    outcome: str,
    result_code: str | None,
    output: Mapping[str, Any] | None,
    execution: Mapping[str, Any] | None,
    next_work: workers.NextWork | None = None,
) -> Completion:
    """A completion as the caller described it, on copies the caller cannot change
    (anything else wrong in it the domain refuses)."""
    if result_code is not None:
        text("result_code", result_code)
    return Completion(
        lease,
        outcome,
        result_code,
        dict(output) if isinstance(output, Mapping) else output,
        dict(execution) if isinstance(execution, Mapping) else execution,
        next_work,
    )


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
        positive("page_size", page_size, 1, limit)
        chosen = replace(chosen, page_size=page_size)
    return chosen


MAX_RERUN_STEPS = 128  # a plan has at most 128 steps


class Runtime(Inspection, Scheduling, FlowControl):
    """An opened qlflow runtime. Every method is one or a few short transactions;
    nothing runs between calls (the host drives `cycle`)."""

    url: str
    profile: Profile  # the deployment profile's page sizes and limits
    read_only: bool

    def __init__(
        self,
        url: str | None = None,
        profile: str | None = None,
        *,
        page_size: int | None = None,
        read_only: bool = False,
        host_clock: Callable[[], int] | None = None,
        **store_options: Any,
    ) -> None:
        self.url = url or default_url()
        self.profile = resolve_profile(self.url, profile, page_size)
        self.read_only = read_only
        self.log_cap_bytes = self.profile.log_cap_bytes
        self.store = eventstore.open_store(self.url, read_only=read_only, **store_options)
        if host_clock is not None:  # this host's clock (a test's skewed one)
            self.store.set_host_clock(host_clock)
        try:
            registry.migrate_all(self.store)  # read-only: only checks the versions
            self._authority = OperationAuthority(self.store)
        except BaseException:
            self.store.close()
            raise
        self._completions = workers.GroupedCompletions(self._authority, MAX_BATCH)
        self._worker_writes = workers.GroupedWorkerWrites(self._authority, MAX_BATCH)
        # request ids of lease calls that raised: only a call sent again with one looks
        # for what the first granted (the newest UNANSWERED_KEPT of them)
        self._unanswered: dict[str, None] = {}
        self._unanswered_lock = threading.Lock()
        self._cancels = workers.grouped_cancels(self._authority, MAX_BATCH)
        self._cycle = Cycle(
            self._authority,
            self.profile.page_size,
            self.profile.pages_per_phase,
            self.profile.schedule_page_size,
            self.profile.schedule_grace_ms,
        )
        self._closed = False
        self._close_lock = threading.Lock()
        # a host that never calls close() (an exception out of its loop, say) still
        # exits, with the store closed; close() itself takes this hook away again
        reference = weakref.ref(self)

        def close_at_exit() -> None:
            runtime = reference()
            if runtime is not None:
                runtime._close(stop_timeout_s=EXIT_STOP_TIMEOUT_S)

        self._close_at_exit = close_at_exit
        atexit.register(close_at_exit)

    # -- packages and admission -------------------------------------------
    def publish(
        self,
        path_or_manifest: str | os.PathLike[str] | Mapping[str, Any],
        now_ms: int | None = None,
    ) -> Publication:
        """Publish a package folder (or a manifest dict); unchanged content is a no-op."""
        revision_input = packages.load(path_or_manifest)
        now = self._now(now_ms)
        return self._authority.execute(
            lambda tx: publishing.publish_in_tx(tx, revision_input, now), name="publish"
        )

    def withdraw(self, publication_id: str, now_ms: int | None = None) -> None:
        """Stop new starts from this publication (admitted Runs finish)."""
        publication_id, now = text("publication_id", publication_id), self._now(now_ms)
        self._authority.execute(
            lambda tx: publishing.withdraw_in_tx(tx, publication_id, now), name="withdraw"
        )

    def quarantine(self, publication_id: str, now_ms: int | None = None) -> None:
        """Quarantine a publication: no new starts."""
        publication_id, now = text("publication_id", publication_id), self._now(now_ms)
        self._authority.execute(
            lambda tx: publishing.quarantine_in_tx(tx, publication_id, now), name="quarantine"
        )

    def revoke_publisher(self, publisher: str, now_ms: int | None = None) -> None:
        """Revoke a publisher's trust: none of its publications may start Workflows."""
        publisher, now = text("publisher", publisher), self._now(now_ms)
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
        params: Mapping[str, Any] | None = None,
        priority: int | None = None,
        now_ms: int | None = None,
    ) -> AdmissionReceipt:
        """Admit a Workflow Run durably; an exact replay returns status "existing".

        `params` gives the Workflow's declared parameters (name -> str, int or
        bool); defaults fill the rest and the plan binds them all. `priority`
        (-1000..1000; None: the Workflow's, 0 unless declared): workers lease the
        steps of higher-priority Runs first (docs/DESIGN.md "Flow control")."""
        package, workflow = text("package", package), text("workflow", workflow)
        if timeout_ms is not None:
            positive("timeout_ms", timeout_ms)
        if priority is not None:
            check_priority(priority)
        return admission.start(
            self._authority,
            package,
            workflow,
            admission_key=admission_key,
            run_id=run_id,
            timeout_ms=timeout_ms,
            params=params,
            priority=priority,
            now_ms=self._now(now_ms),
        )

    def rerun(
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
        run_id = text("run_id", run_id)
        admission_key = optional_text("admission_key", admission_key)
        if from_steps is not None:
            from_steps = text_list("from_steps", from_steps, MAX_RERUN_STEPS)
        return reruns.rerun(
            self._authority,
            run_id,
            from_steps=from_steps,
            plan=plan,
            admission_key=admission_key,
            params=params,
            now_ms=self._now(now_ms),
        )

    def inspect_admission(
        self, run_id: str | None = None, admission_key: str | None = None
    ) -> AdmissionReceipt | None:
        """The durable admission receipt by run id or admission key, or None."""
        run_id = optional_text("run_id", run_id)
        admission_key = optional_text("admission_key", admission_key)
        return admission.inspect_admission(self.store, run_id=run_id, admission_key=admission_key)

    # -- the cycle -----------------------------------------------------------
    def cancel(self, run_id: str, reason: str = "user", now_ms: int | None = None) -> bool:
        """Record cancel intent (idempotent) and, in the same commit, end what no
        worker holds; the completion of the last held Attempt (or, for a worker that
        never reports, the cycle) converges the rest. `reason` is one of
        `domain.transitions.CANCEL_REASONS` (user, policy, shutdown, reconcile,
        timeout). True if this call recorded it."""
        run_id, reason = text("run_id", run_id), check_cancel_reason(reason)
        if now_ms is None:  # on the store's clock: shares a commit with concurrent callers
            answer = self._cancels.submit(workers.CancelRequest(run_id, reason))
            if isinstance(answer, QlflowError):
                raise answer
            return answer
        return workers.cancel(self._authority, run_id, reason, _given(now_ms))

    def cancel_many(
        self, run_ids: Iterable[str], reason: str = "user", now_ms: int | None = None
    ) -> list[bool]:
        """`cancel` for several Runs in one commit; for each Run, in order, True if this
        call recorded its intent. A Run that does not exist (NotFound) or a bad reason
        refuses the whole call and writes nothing."""
        ids, reason = text_list("run_ids", run_ids, MAX_BATCH), check_cancel_reason(reason)
        if not ids:
            return []
        return workers.cancel_many(self._authority, ids, reason, _given(now_ms))

    def cycle(self, now_ms: int | None = None) -> CycleResult:
        """One bounded pass of every phase: recovery, cancellation, schedule, frontier,
        claim."""
        return self._cycle.run(self._now(now_ms))

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
        start: bool = False,
        slots: int | None = None,
        host: str | None = None,
        request_id: str | None = None,
    ) -> list[Lease]:
        """Lease claimed Attempts for a worker, oldest first (`ttl_ms`: 5 s to 10 min).

        `start=True`: each grant also crosses the start barrier in the same commit (the
        Attempt is `starting`, `Lease.started` is set): for an executor that spawns at
        once; `mark_running` stays optional and `complete` is accepted from starting.
        `slots` (how many Attempts this worker runs at once) and `host` are recorded on
        the grants, for `workers()`; a lease of a step with a timeout carries its
        `step_deadline_ms` once started.

        `request_id` (1 to 128 characters, new for each call, e.g. a uuid): a call that
        raised, sent again with the same one to this runtime, is answered the leases
        the first granted (if its COMMIT went through and the answer was lost) that
        are still live and that no one recorded running, and leases nothing new;
        none found, it leases as asked."""
        worker_id = text("worker_id", worker_id)
        positive("limit", limit, 1, 1024)
        check_lease_ttl(ttl_ms)  # refused even when there is nothing to lease
        lease_expiry(self._now(now_ms), ttl_ms)  # likewise a lease that could never expire
        task_set = None if tasks is None else texts("tasks", tasks)
        run_id = optional_text("run_id", run_id)
        step_key = optional_text("step_key", step_key)
        said = None if slots is None and host is None else WorkerInfo(host=host, slots=slots)
        request_id = optional_text("request_id", request_id)
        if request_id is not None and len(request_id) > MAX_REQUEST_ID:
            raise InvalidInput(
                "request_id",
                "max_length",
                f"request_id holds at most {MAX_REQUEST_ID} characters, got {len(request_id)}",
            )
        try:
            leases = workers.lease_attempts(
                self._authority,
                worker_id,
                limit=limit,
                ttl_ms=ttl_ms,
                now_ms=_given(now_ms),
                run_id=run_id,
                step_key=step_key,
                tasks=task_set,
                start=flag("start", start),
                worker=said,
                request_id=request_id,
                sent_again=request_id is not None and request_id in self._unanswered,
            )
        except Exception:
            if request_id is not None:
                with self._unanswered_lock:
                    self._unanswered[request_id] = None
                    while len(self._unanswered) > UNANSWERED_KEPT:
                        del self._unanswered[next(iter(self._unanswered))]
            raise
        if request_id is not None:
            with self._unanswered_lock:
                self._unanswered.pop(request_id, None)
        return leases

    def mark_starting(self, lease: Lease, now_ms: int | None = None) -> Lease:
        """The start barrier: claimed+leased -> starting, before anything is spawned."""
        return workers.mark_starting(
            self._authority, lease_of(lease), _given(now_ms), self._worker_writes
        )

    def mark_running(self, lease: Lease, now_ms: int | None = None) -> Lease:
        """starting -> running (passes through starting from claimed)."""
        return workers.mark_running(
            self._authority, lease_of(lease), _given(now_ms), self._worker_writes
        )

    def renew(self, lease: Lease, ttl_ms: int = 30_000, now_ms: int | None = None) -> Lease:
        """Extend the lease: a new version; `.stop_requested` when the Run has cancel intent."""
        return workers.renew(
            self._authority, lease_of(lease), ttl_ms, _given(now_ms), self._worker_writes
        )

    def complete(
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
        done = self._complete(
            _completion(lease_of(lease), outcome, result_code, output, execution), now_ms
        )
        assert done.status is not None
        return done.status

    def complete_and_lease(
        self,
        lease: Lease,
        outcome: str,
        *,
        result_code: str | None = None,
        output: Mapping[str, Any] | None = None,
        execution: Mapping[str, Any] | None = None,
        limit: int = 1,
        ttl_ms: int = 30_000,
        tasks: Iterable[str] | None = None,
        slots: int | None = None,
        host: str | None = None,
        run_id: str | None = None,
        now_ms: int | None = None,
    ) -> Completed:
        """`complete`, then in the same commit what `lease_attempts(lease.worker_id,
        limit, ttl_ms, run_id=run_id, tasks=tasks, start=True, slots=slots, host=host)`
        right after it would lease (the Attempts the completion made ready among them): the
        worker's next work without a lease commit of its own. Returns the recorded
        status and those leases (`Completed.next_leases`, started); raises as
        `complete`. A completion sent again after its commit (a replay: its answer was
        lost) is answered the leases that commit granted whose Attempts no one recorded
        running yet, and leases nothing new: a caller that did get the first answer
        must not start those twice."""
        lease = lease_of(lease)
        positive("limit", limit, 1, 1024)
        check_lease_ttl(ttl_ms)
        lease_expiry(self._now(now_ms), ttl_ms)
        said = None if slots is None and host is None else WorkerInfo(host=host, slots=slots)
        next_work = workers.NextWork(
            lease.worker_id,
            ttl_ms,
            limit,
            None if tasks is None else frozenset(texts("tasks", tasks)),
            said,
            optional_text("run_id", run_id),
        )
        return self._complete(
            _completion(lease, outcome, result_code, output, execution, next_work), now_ms
        )

    def _complete(self, completion: Completion, now_ms: int | None) -> Completed:
        if now_ms is None:  # on the store's clock: shares a commit with concurrent callers
            return self._completions.complete(completion)
        (done,) = workers.complete_many(self._authority, [completion], _given(now_ms))
        if done.error is not None:
            raise done.error
        return done

    def complete_many(
        self, completions: Iterable[Completion], now_ms: int | None = None
    ) -> list[Completed]:
        """Record several Attempts' outcomes in one commit, each exactly as `complete`
        would; the answers come in the same order. A bad argument in any of them (an
        unknown outcome, output that is not a JSON object) refuses the whole call
        (InvalidInput) and writes nothing; a completion its lease no longer allows
        (expired, replaced, the Run ended: FenceError) is answered with that error in
        `Completed.error`, nothing written for it, and the others are recorded."""
        checked = completions_of("completions", completions, MAX_BATCH)
        if not checked:
            return []
        return workers.complete_many(self._authority, checked, _given(now_ms))

    # -- reading -----------------------------------------------------------
    def get_run(self, run_id: str) -> views.RunView:
        """The Run with its steps and Attempts, from the read models."""
        return views.get_run(self.store, text("run_id", run_id))

    def task_inputs(self, lease: Lease) -> task_io.TaskInputs:
        """What the leased step is given: `{"params": {...}, "needs": {key: output or
        None}}` (the Run's parameters, the succeeded output of each step it needs)."""
        lease = lease_of(lease)
        return task_io.step_inputs(self._run_holding(lease), lease.step_key)

    def _run_holding(self, lease: Lease) -> views.RunView:
        """The leased Attempt's Run with (at least) its step and the steps it needs:
        from the Run this process's last write left, if that holds the Attempt (the
        grant of the lease left it, and what a step is given was settled before its
        Attempt was claimed), else as the read models hold it (docs/DESIGN.md "What a
        step is given")."""
        aggregate = self._authority.aggregates.get(lease.run_id)
        if aggregate is not None and lease.attempt_id in aggregate.attempts:
            step = aggregate.steps[lease.step_key]
            return views.view_of_aggregate(aggregate, (step.key, *step.needs))
        return views.get_run(self.store, lease.run_id)

    def _publication_of(self, run_id: str) -> str:
        """The publication the Run was admitted with (a Run's never changes): from its
        aggregate when this process holds one, else its read-model row."""
        aggregate = self._authority.aggregates.get(run_id)
        if aggregate is not None:
            return aggregate.run.plan.publication_id
        return views.get_run(self.store, text("run_id", run_id)).publication_id

    def task_definition(self, lease: Lease) -> task_io.TaskDefinitionView:
        """The leased Task's command, env, files and package folder, from the revision
        the Run was admitted with."""
        lease = lease_of(lease)
        return task_io.task_definition(
            self.store, self._publication_of(lease.run_id), lease.task_ref
        )

    def runs(
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
    ) -> list[views.RunView]:
        """Runs newest first (by admission), filtered: status, package, workflow,
        admitted in [since_ms, until_ms), run id prefix, reruns of one Run (`rerun_of`). A
        page: the newest `limit`, or those older than `before` / newer than `after`
        (`views.cursor_of(run)`)."""
        run_filter = self._run_filter(package, workflow, status, since_ms, until_ms, id_prefix)
        run_filter = replace(run_filter, rerun_of=optional_text("rerun_of", rerun_of))
        for name, cursor in (("before", before), ("after", after)):
            if cursor is not None and not isinstance(cursor, RunCursor):
                raise InvalidInput(name, "cursor", f"{name} must be a RunCursor, got {cursor!r}")
        return views.list_runs(
            self.store, run_filter, before=before, after=after, limit=positive("limit", limit)
        )

    def events(
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
        if not isinstance(newest_first, bool):
            raise InvalidInput("newest_first", "bool", "newest_first must be a bool")
        return views.events(
            self.store,
            optional_text("run_id", run_id),
            types=None if types is None else texts("types", types),
            since_ms=None if since_ms is None else instant("since_ms", since_ms),
            until_ms=None if until_ms is None else instant("until_ms", until_ms),
            after_position=positive("after_position", after_position, 0),
            before_position=(
                None if before_position is None else positive("before_position", before_position)
            ),
            limit=None if limit is None else positive("limit", limit),
            newest_first=newest_first,
        )

    def why(self, run_id: str, now_ms: int | None = None, log_lines: int = 10) -> WhyReport:
        """Why the Run is not terminal (blocked Attempts, leases, holders, expiry), or
        for a terminal Run its root cause; and every step that failed, timed out or
        was lost, with the last `log_lines` lines of its log."""
        positive("log_lines", log_lines, 0, 1000)
        return audit.why(self.store, text("run_id", run_id), self._now(now_ms), log_lines)

    def timeline(self, run_id: str, mutations: bool = True) -> list[TimelineEntry]:
        """The Run's events (run, steps and lease streams) in commit order, summarized;
        `mutations=False` leaves out the StepRunMutations (each repeats a step event)."""
        if not isinstance(mutations, bool):
            raise InvalidInput("mutations", "bool", "mutations must be a bool")
        return audit.timeline(self.store, text("run_id", run_id), mutations=mutations)

    def step_history(self, run_id: str, step_key: str) -> list[TimelineEntry]:
        """Every event about one Step of a Run."""
        return audit.step_history(self.store, text("run_id", run_id), text("step_key", step_key))

    def aggregate_at(self, run_id: str, version: int | None = None) -> RunAggregate:
        """The Run's aggregate as it was at run-stream `version` (None: now)."""
        if version is not None:
            positive("version", version)
        return audit.aggregate_at(self.store, text("run_id", run_id), version)

    def rebuild_projections(self, progress: Progress | None = None) -> RebuildSummary:
        """Replay the whole log into fresh read models and swap them in atomically.
        `progress(done, total)` is called as the replay goes."""
        summary = rebuild.rebuild(self.store, progress)
        log.info("rebuilt read models from %d events", summary.events)
        return summary

    def verify_projections(self, progress: Progress | None = None) -> VerifyReport:
        """Prove the live read models equal a replay of the log (`report.ok`)."""
        return verify.verify(self.store, progress)

    def retain(
        self,
        finished_before_ms: int,
        *,
        batch: int = retention.DEFAULT_BATCH,
        max_batches: int | None = None,
        dry_run: bool = False,
        now_ms: int | None = None,
        progress: Callable[[RetentionReport], None] | None = None,
        archive: str | os.PathLike[str] | None = None,
    ) -> RetentionReport:
        """Remove the Runs that finished before `finished_before_ms` (and are not the
        source of a running rerun) with their events, read-model rows and logs, `batch`
        Runs per transaction, each batch named by a retention record (docs/DESIGN.md,
        "Retention"). `dry_run=True` writes nothing and says what would go. With
        `archive`, each batch is first written to that SQLite file (`qlflow export`'s
        layout) and fsync'd; an existing file must be an archive of this store."""
        dry_run = flag("dry_run", dry_run)
        archiver = None
        if archive is not None:
            if not isinstance(archive, (str, os.PathLike)) or not str(archive):
                raise InvalidInput("archive", "path", f"archive must be a path, got {archive!r}")
            identity = archiving.store_identity(self.store)
            target = archiving.check_archive(Path(archive), identity)
            archiver = archiving.Archiver(target, identity, self.url)
        if max_batches is not None:
            positive("max_batches", max_batches)
        if self.read_only and not dry_run:
            raise StoreUsageError(
                "this store was opened read-only: retention removes Runs, open it again "
                "without read_only (or pass dry_run=True)"
            )
        return retaining.retain(
            self._authority,
            finished_before_ms,
            now_ms=self._now(now_ms),
            batch=batch,
            max_batches=max_batches,
            dry_run=dry_run,
            progress=progress,
            archiver=None if dry_run else archiver,
        )

    def reclaim(self) -> list[str]:
        """Make the space of what retention removed reusable now (docs/DESIGN.md,
        "Retention"): VACUUM of the store's tables on PostgreSQL, nothing on SQLite;
        the tables reclaimed. Not in a transaction; takes the tables' owner."""
        return self.store.reclaim()

    def close(self) -> None:
        """Stop the runtime's actors and close the store. Idempotent."""
        # a process that never calls it still exits: the atexit hook closes the store
        self._close(stop_timeout_s=None)

    def _close(self, stop_timeout_s: float | None) -> None:
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        atexit.unregister(self._close_at_exit)
        self._authority.stop(stop_timeout_s)
        self.store.close()

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
