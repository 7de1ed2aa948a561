"""The dashboard's one door to qlflow: every read a page makes and every action it
takes goes through `Dashboard`, and nothing else in `qlflow.ui` touches the runtime.

Every call is the public Runtime API (`runs` and `count_runs` for the runs list,
`packages`, `get_run`, `timeline`, `why`, `step_history`, `log_attempts` and `logs`
for step logs, `workflow_params` and `start`, `cancel`, `schedules`, `pause_schedule`
and `resume_schedule`); no query is written here. The routes only render what this
module (and the two it mixes in) returns.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import eventstore
from domain.errors import InvalidInput, NotFound
from domain.transitions import ATTEMPT_TERMINAL, RUN_RUNNING, RUN_TERMINAL, STEP_TERMINAL
from domain.values import AdmissionReceipt
from projections.audit import TimelineEntry, WhyReport
from projections.package_views import PackageView
from projections.run_search import RunCursor
from projections.step_logs import LogAttempt, LogChunk
from projections.views import RunView, StepView
from projections.workers import WorkerView
from qlflow.cli.retry_words import waiting_retry
from qlflow.clock import wall_clock_ms
from qlflow.runtime import Runtime
from qlflow.ui.dag import Layout, depths, layout
from qlflow.ui.log_lines import LogLine, lines
from qlflow.ui.schedule_list import Schedules
from qlflow.ui.starting import Starting

RUN_STATUSES = (RUN_RUNNING, *sorted(RUN_TERMINAL))
PAGE_SIZES = (25, 50, 100, 200)
DEFAULT_PAGE_SIZE = 50
COUNT_CAP = 10_000  # the runs page counts matches up to this, then says "10,000+"
LOG_LINES = 2_000  # the step page shows each Attempt's last this many lines (unless asked all)

# --- the runs list -----------------------------------------------------------------------


Cursor = RunCursor  # a place in the runs list, newest first: (admitted_at_ms desc, run_id asc)


@dataclass(frozen=True, slots=True)
class RunQuery:
    """What the runs page asks for. `before`: the page older than that cursor;
    `after`: the page newer than it; neither: the newest page."""

    package: str | None = None
    workflow: str | None = None
    status: str | None = None
    since_ms: int | None = None  # admitted at or after
    until_ms: int | None = None  # admitted before
    id_prefix: str | None = None
    before: Cursor | None = None
    after: Cursor | None = None
    limit: int = DEFAULT_PAGE_SIZE

    def __post_init__(self) -> None:
        if self.status is not None and self.status not in RUN_STATUSES:
            raise InvalidInput(
                "status",
                "run status",
                f"status must be one of {', '.join(RUN_STATUSES)}, got {self.status!r}",
            )
        if self.limit not in PAGE_SIZES:
            raise InvalidInput(
                "limit",
                "page size",
                f"limit must be one of {', '.join(map(str, PAGE_SIZES))}, got {self.limit!r}",
            )
        if self.before is not None and self.after is not None:
            raise InvalidInput("before", "one cursor", "give before or after, not both")

    @property
    def filtered(self) -> bool:
        return any(
            value is not None
            for value in (
                self.package,
                self.workflow,
                self.status,
                self.since_ms,
                self.until_ms,
                self.id_prefix,
            )
        )


@dataclass(frozen=True, slots=True)
class RunRow:
    """One line of the runs list."""

    run_id: str
    package: str
    workflow_key: str
    status: str
    admitted_at_ms: int
    terminal_at_ms: int | None
    cancel_reason: str | None
    result_code: str | None
    error_code: str | None
    step_count: int
    open_steps: int

    @property
    def cursor(self) -> Cursor:
        return Cursor(self.admitted_at_ms, self.run_id)

    @classmethod
    def of(cls, run: RunView) -> RunRow:
        return cls(
            run.run_id,
            run.package,
            run.workflow_key,
            run.status,
            run.admitted_at_ms,
            run.terminal_at_ms,
            run.cancel_reason,
            run.result_code,
            run.error_code,
            run.step_count,
            run.open_steps,
        )


@dataclass(frozen=True, slots=True)
class RunsPage:
    rows: tuple[RunRow, ...]
    older: Cursor | None  # the cursor of the next (older) page, if there is one
    newer: Cursor | None  # the cursor of the previous (newer) page, if there is one
    matching: int  # Runs that match the filters, counted up to COUNT_CAP (+1)
    short_ids: dict[str, str]  # each row's shortest unique prefix, as `qlflow runs` shows it

    @property
    def matching_capped(self) -> bool:
        return self.matching > COUNT_CAP


# --- one Run ---------------------------------------------------------------------------------


RERUNS_SHOWN = 20  # the Runs that rerun one a run page names at most


@dataclass(frozen=True, slots=True)
class RunDetail:
    run: RunView
    steps: tuple[StepView, ...]  # in dependency order
    dag: Layout
    timeline: tuple[TimelineEntry, ...]
    why: WhyReport
    stamp: str
    now_ms: int
    retries: dict[str, str]  # step key -> "retry 2 of 3 at <time>" while it waits for one
    rerun_as: tuple[str, ...] = ()  # the Runs that rerun this one, newest first


@dataclass(frozen=True, slots=True)
class AttemptLog:
    """What one Attempt's log holds as lines, or what a follower's poll added to it."""

    run_id: str
    step_key: str
    attempt_number: int
    attempt_id: str
    status: str
    live: bool  # more may come: the Attempt has not ended (or its last poll found lines)
    lines: tuple[LogLine, ...]
    after: int  # the last seq read: a follower's place (0: nothing yet)
    earlier: int  # lines before `lines` that the page leaves out (see LOG_LINES)
    written_bytes: int
    dropped_bytes: int
    last_at_ms: int | None


@dataclass(frozen=True, slots=True)
class StepDetail:
    run: RunView
    step: StepView
    dependants: tuple[str, ...]
    history: tuple[TimelineEntry, ...]
    logs: tuple[AttemptLog, ...]  # one per Attempt, in claim order
    stamp: str
    now_ms: int
    retry: str  # "retry 2 of 3 at <time>" while the step waits for one, else ""

    @property
    def live(self) -> bool:
        """Whether the step may still change (a new Attempt, an Attempt ending): its
        page polls until it has ended. Each Attempt's log is tailed on its own."""
        return self.step.status not in STEP_TERMINAL


# --- packages --------------------------------------------------------------------------------


Installation = PackageView  # one installation: its generations (newest first), its publisher


# --- the adapter -----------------------------------------------------------------------------


class Dashboard(Starting, Schedules):
    """Reads and actions of the dashboard over one opened Runtime (the start form and
    the schedules are in `qlflow.ui.starting` and `qlflow.ui.schedule_list`)."""

    def __init__(self, runtime: Runtime, clock: Callable[[], int] | None = None) -> None:
        self.runtime = runtime
        self._clock = clock or wall_clock_ms
        self.denied = denied_errors(runtime)

    def now_ms(self) -> int:
        return self._clock()

    # -- workers --------------------------------------------------------------------------
    def workers(self) -> list[WorkerView]:
        """The workers that run an Attempt now or were seen in the last hour
        (`Runtime.workers`)."""
        return self.runtime.workers(now_ms=self.now_ms())

    # -- runs -----------------------------------------------------------------------------
    def runs(self, query: RunQuery) -> RunsPage:
        """A page of Runs, newest first, filtered; keyset-paged (no OFFSET), so every page
        is as cheap as the first (an index per order: see `Runtime.runs`)."""
        filters: dict[str, Any] = {
            "package": query.package,
            "workflow": query.workflow,
            "status": query.status,
            "since_ms": query.since_ms,
            "until_ms": query.until_ms,
            "id_prefix": query.id_prefix,
        }
        found = [
            RunRow.of(run)
            for run in self.runtime.runs(
                limit=query.limit + 1, before=query.before, after=query.after, **filters
            )
        ]
        more = len(found) > query.limit
        if query.after is not None:
            rows = found[-query.limit :] if more else found  # the page just newer than `after`
            newer = rows[0].cursor if more and rows else None
            older = rows[-1].cursor if rows else None
        else:
            rows = found[: query.limit]
            older = rows[-1].cursor if more else None
            newer = rows[0].cursor if query.before is not None and rows else None
        matching = self.runtime.count_runs(at_most=COUNT_CAP, **filters)
        short = self.runtime.short_run_ids([row.run_id for row in rows]) if rows else {}
        return RunsPage(tuple(rows), older, newer, matching, short)

    def names(self) -> tuple[list[str], list[str]]:
        """Package and workflow names ever published, for the filter boxes' suggestions.
        A role that may not read publications (PostgreSQL's runtime role) gets none."""
        packages: set[str] = set()
        workflows: set[str] = set()
        try:
            for installation in self.runtime.packages():
                packages.add(installation.package)
                for publication in installation.generations:
                    workflows.update(publication.workflows)
        except self.denied:
            return [], []
        return sorted(packages), sorted(workflows)

    # -- one Run --------------------------------------------------------------------------
    def run(self, run_id: str) -> RunDetail:
        """The Run, its steps in dependency order, the DAG, the timeline (RunEvents and
        lease records) and `why` (running) or the root cause (terminal)."""
        now = self.now_ms()
        run = self.runtime.get_run(run_id)
        # a StepRunMutation repeats the step event that caused it: the page leaves them out
        timeline = tuple(self.runtime.timeline(run_id, mutations=False))
        return RunDetail(
            run=run,
            steps=in_dependency_order(run.steps),
            dag=layout(run.steps),
            timeline=timeline,
            why=self.runtime.why(run_id, now_ms=now),
            stamp=stamp(run),
            now_ms=now,
            retries={key: waiting_retry(step, now) for key, step in run.steps.items()},
            rerun_as=tuple(
                r.run_id for r in self.runtime.runs(limit=RERUNS_SHOWN, rerun_of=run_id)
            ),
        )

    def stamp(self, run_id: str) -> str:
        """A short value that changes whenever the Run's page would (see `stamp`)."""
        return stamp(self.runtime.get_run(run_id))

    def step(self, run_id: str, step_key: str, all_lines: bool = False) -> StepDetail:
        """One step of a Run: its Attempts with their logs (the last LOG_LINES lines of
        each unless `all_lines`), its history, the steps that need it."""
        now = self.now_ms()
        run = self.runtime.get_run(run_id)
        step = run.steps.get(step_key)
        if step is None:
            raise NotFound(f"run {run_id!r} has no step {step_key!r}")
        named = self.runtime.log_attempts(run_id, step_key)  # before the chunks: see tail
        chunks = self.runtime.logs(run_id, step_key)
        return StepDetail(
            run=run,
            step=step,
            dependants=tuple(k for k, s in sorted(run.steps.items()) if step_key in s.needs),
            history=tuple(self.runtime.step_history(run_id, step_key)),
            logs=tuple(
                attempt_log(
                    a, chunks, None, 0, following=False, keep=None if all_lines else LOG_LINES
                )
                for a in named
            ),
            stamp=step_stamp(run, step),
            now_ms=now,
            retry=waiting_retry(step, now),
        )

    def step_stamp(self, run_id: str, step_key: str) -> str:
        """A short value that changes whenever the step's page would, but for its logs
        (see `step_stamp`)."""
        run = self.runtime.get_run(run_id)
        step = run.steps.get(step_key)
        if step is None:
            raise NotFound(f"run {run_id!r} has no step {step_key!r}")
        return step_stamp(run, step)

    def tail(
        self, run_id: str, attempt_id: str, after: int, open_stream: str | None = None
    ) -> AttemptLog:
        """The lines an Attempt of the Run logged after seq `after` (a live tail's poll);
        `open_stream`: the stream of the follower's last line if that has not ended.
        NotFound when the Run has no such Attempt."""
        (named,) = self.runtime.log_attempts(run_id, None, attempt_id)
        # its status is read before its chunks: output stored before it ended is in them
        chunks = self.runtime.logs(run_id, None, attempt_id, after={attempt_id: after})
        return attempt_log(named, chunks, open_stream, after, following=True)

    # -- packages -------------------------------------------------------------------------
    def packages(self) -> list[Installation]:
        """Every installation with its generations and its publisher's trust."""
        return self.runtime.packages()

    # -- actions --------------------------------------------------------------------------
    def rerun(self, run_id: str, from_step: str | None) -> AdmissionReceipt:
        """Rerun a finished Run (from `from_step` and what follows it, else from what did
        not succeed). The key is the source and the step: a second click gives the same
        rerun, never another (docs/DESIGN.md, "Reruns")."""
        key = f"dashboard-rerun:{run_id}:{from_step or ''}"
        from_steps = [from_step] if from_step else None
        return self.runtime.rerun(run_id, from_steps, admission_key=key, now_ms=self.now_ms())

    def cancel(self, run_id: str) -> bool:
        """Record a user cancel intent (idempotent); what no worker holds ends with it,
        the rest when its workers' completions are recorded."""
        self.runtime.get_run(run_id)  # an unknown id is a NotFound, not a silent no-op
        return self.runtime.cancel(run_id, "user", now_ms=self.now_ms())


def attempt_log(
    named: LogAttempt,
    chunks: list[LogChunk],
    open_stream: str | None,
    after: int,
    *,
    following: bool,
    keep: int | None = None,
) -> AttemptLog:
    """`named`'s part of `chunks` as lines, the last `keep` of them (None: all);
    `following`: a live tail's poll."""
    own = [c for c in chunks if c.attempt_id == named.attempt_id]
    found = lines(own, open_stream)
    ended = named.status in ATTEMPT_TERMINAL
    log = named.log
    return AttemptLog(
        run_id=named.run_id,
        step_key=named.step_key,
        attempt_number=named.attempt_number,
        attempt_id=named.attempt_id,
        status=named.status,
        # a follower polls once more after the end: output stored as it ended
        live=not ended or (following and bool(own)),
        lines=tuple(found[-keep:] if keep is not None else found),
        after=own[-1].seq if own else after,
        earlier=max(0, len(found) - keep) if keep is not None else 0,
        written_bytes=log.written_bytes if log else 0,
        dropped_bytes=log.dropped_bytes if log else 0,
        last_at_ms=log.last_at_ms if log else None,
    )


def denied_errors(runtime: Runtime) -> tuple[type[BaseException], ...]:
    """The errors the runtime's store raises when the connected role lacks a privilege
    (PostgreSQL's least-privilege roles); none on SQLite."""
    return eventstore.denied_errors()


def stamp(run: RunView) -> str:
    """Changes with every RunEvent (the Run's version) and every lease change of its
    Attempts (grants and renewals do not move the Run's version)."""
    parts: list[object] = [run.run_id, run.version, run.status]
    for key in sorted(run.steps):
        for attempt in run.steps[key].attempts:
            parts += [attempt.attempt_id, attempt.lease_version, attempt.expires_at_ms]
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:16]


def step_stamp(run: RunView, step: StepView) -> str:
    """Changes with the step's status and epoch, its Attempts' states and leases, and
    the Run's status; not with log output (each Attempt's log is tailed on its own)."""
    parts: list[object] = [run.run_id, run.status, step.step_key, step.status, step.epoch]
    for attempt in step.attempts:
        parts += [attempt.attempt_id, attempt.status, attempt.lease_version]
        parts += [attempt.expires_at_ms, attempt.ended_at_ms]
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:16]


def in_dependency_order(steps: dict[str, StepView]) -> tuple[StepView, ...]:
    """Steps by depth, then key: a step after everything it needs."""
    depth = depths({key: step.needs for key, step in steps.items()})
    return tuple(sorted(steps.values(), key=lambda s: (depth[s.step_key], s.step_key)))


def short_id(value: str, keep: int = 8) -> str:
    """An id cut for a table: the part before the first ':' and `keep` characters."""
    head, colon, tail = value.partition(":")
    if colon and len(tail) > keep:
        return f"{head}:{tail[:keep]}"
    return value if len(value) <= keep + 4 else value[: keep + 4]
