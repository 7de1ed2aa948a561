"""The dashboard's one door to qlflow: every read a page makes and every action it
takes goes through `Dashboard`, and nothing else in `qlflow.ui` touches the runtime.

Most calls are the public Runtime API (`get_run`, `timeline`, `why`, `step_history`,
`start`, `cancel`). Where that API has no call for what a page needs, the query is
written here over the runtime's store and read models; each such method says
"Workaround:" in its docstring, so it can be swapped for the API call once it exists.
Later features (parameters, outputs, logs, schedules, search filters) are new
methods and fields here; the routes only render what this module returns.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from domain.errors import InvalidInput, NotFound
from domain.ids import RUN_ID
from domain.streams import STEPS, category
from domain.transitions import RUN_RUNNING, RUN_TERMINAL
from domain.values import Publication
from projections import publications as publication_reads
from projections.audit import TimelineEntry, WhyReport
from projections.views import RunView, StepView
from qlflow.clock import wall_clock_ms
from qlflow.runtime import Runtime
from qlflow.ui.dag import Layout, depths, layout

RUN_STATUSES = (RUN_RUNNING, *sorted(RUN_TERMINAL))
PAGE_SIZES = (25, 50, 100, 200)
DEFAULT_PAGE_SIZE = 50
COUNT_CAP = 10_000  # the runs page counts matches up to this, then says "10,000+"

# --- the runs list -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Cursor:
    """A place in the runs list, newest first: (admitted_at_ms desc, run_id asc)."""

    admitted_at_ms: int
    run_id: str

    def token(self) -> str:
        return f"{self.admitted_at_ms}.{self.run_id}"

    @classmethod
    def parse(cls, field_name: str, text: str) -> Cursor:
        ms, dot, run_id = text.partition(".")
        if not dot or not ms.isdigit() or not run_id or len(ms) > 16:
            raise InvalidInput(field_name, "cursor", f"{field_name} is not a page cursor: {text!r}")
        return cls(int(ms), run_id)


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


_ROW_COLUMNS = ", ".join(RunRow.__dataclass_fields__)


@dataclass(frozen=True, slots=True)
class RunsPage:
    rows: tuple[RunRow, ...]
    older: Cursor | None  # the cursor of the next (older) page, if there is one
    newer: Cursor | None  # the cursor of the previous (newer) page, if there is one
    matching: int  # Runs that match the filters, counted up to COUNT_CAP (+1)

    @property
    def matching_capped(self) -> bool:
        return self.matching > COUNT_CAP


# --- one Run ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RunDetail:
    run: RunView
    steps: tuple[StepView, ...]  # in dependency order
    dag: Layout
    timeline: tuple[TimelineEntry, ...]
    why: WhyReport
    stamp: str
    now_ms: int


@dataclass(frozen=True, slots=True)
class StepDetail:
    run: RunView
    step: StepView
    dependants: tuple[str, ...]
    history: tuple[TimelineEntry, ...]
    log_paths: tuple[tuple[int, str], ...]  # (attempt number, path) the executor reported
    now_ms: int


# --- packages --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Installation:
    """One package installation: its generations (newest first) and its publisher."""

    project: str
    installation: str
    package: str
    publisher: str
    publisher_status: str  # active | revoked
    generations: tuple[Publication, ...] = field(default_factory=tuple)

    @property
    def head(self) -> Publication | None:
        return next((p for p in self.generations if p.head), None)


# --- the adapter -----------------------------------------------------------------------------


class Dashboard:
    """Reads and actions of the dashboard over one opened Runtime."""

    def __init__(self, runtime: Runtime, clock: Callable[[], int] | None = None) -> None:
        self.runtime = runtime
        self._clock = clock or wall_clock_ms
        self.denied = denied_errors(runtime)

    def now_ms(self) -> int:
        return self._clock()

    # -- runs -----------------------------------------------------------------------------
    def runs(self, query: RunQuery) -> RunsPage:
        """A page of Runs, newest first, filtered.

        Workaround: `Runtime.runs` filters by status only and has no cursor, so this
        queries the `runs` read model. Keyset pagination (no OFFSET) keeps every page
        as cheap as the first; no index covers admitted_at_ms yet, so each page is a
        scan of the table (see bench/ui.py for what that costs at 100,000 Runs)."""
        where, params = self._filters(query)
        if query.after is not None:
            order = "admitted_at_ms ASC, run_id DESC"
            where.append("(admitted_at_ms > ? OR (admitted_at_ms = ? AND run_id < ?))")
            params += [query.after.admitted_at_ms, query.after.admitted_at_ms, query.after.run_id]
        else:
            order = "admitted_at_ms DESC, run_id ASC"
            if query.before is not None:
                where.append("(admitted_at_ms < ? OR (admitted_at_ms = ? AND run_id > ?))")
                params += [
                    query.before.admitted_at_ms,
                    query.before.admitted_at_ms,
                    query.before.run_id,
                ]
        clause = f"WHERE {' AND '.join(where)}" if where else ""
        store = self.runtime.store
        # Sort only (admitted_at_ms, run_id), then read the page's rows by key: without
        # an index the sort sees every matching row, and narrow rows halve its cost.
        found = [
            RunRow(*row)
            for row in store.query(
                f"SELECT {_ROW_COLUMNS} FROM runs WHERE run_id IN "
                f"(SELECT run_id FROM runs {clause} ORDER BY {order} LIMIT ?) ORDER BY {order}",
                (*params, query.limit + 1),
            )
        ]
        more = len(found) > query.limit
        rows = found[: query.limit]
        if query.after is not None:
            rows.reverse()
            newer = rows[0].cursor if more and rows else None
            older = rows[-1].cursor if rows else None
        else:
            older = rows[-1].cursor if more else None
            newer = rows[0].cursor if query.before is not None and rows else None
        return RunsPage(tuple(rows), older, newer, self._count(query))

    def _filters(self, query: RunQuery) -> tuple[list[str], list[Any]]:
        where: list[str] = []
        params: list[Any] = []
        for column, value in (
            ("package", query.package),
            ("workflow_key", query.workflow),
            ("status", query.status),
        ):
            if value is not None:
                where.append(f"{column} = ?")
                params.append(value)
        if query.since_ms is not None:
            where.append("admitted_at_ms >= ?")
            params.append(query.since_ms)
        if query.until_ms is not None:
            where.append("admitted_at_ms < ?")
            params.append(query.until_ms)
        if query.id_prefix:
            # a prefix typed without the run id's own prefix ("3f2a" for "run:3f2a…")
            prefixes = sorted({query.id_prefix, RUN_ID + query.id_prefix})
            if query.id_prefix.startswith(RUN_ID):
                prefixes = [query.id_prefix]
            terms = []
            for prefix in prefixes:
                if self.runtime.store.dialect == "sqlite":
                    # SQLite compares text bytewise: a key range on the primary key finds
                    # the prefix's ids without a scan. (PostgreSQL's collation may not.)
                    terms.append("(run_id >= ? AND run_id < ? AND substr(run_id, 1, ?) = ?)")
                    params += [prefix, prefix + "\U0010ffff", len(prefix), prefix]
                else:
                    terms.append("substr(run_id, 1, ?) = ?")
                    params += [len(prefix), prefix]
            where.append("(" + " OR ".join(terms) + ")")
        return where, params

    def _count(self, query: RunQuery) -> int:
        where, params = self._filters(query)
        clause = f"WHERE {' AND '.join(where)}" if where else ""
        rows = self.runtime.store.query(
            f"SELECT COUNT(*) FROM (SELECT 1 FROM runs {clause} LIMIT ?) AS matching",
            (*params, COUNT_CAP + 1),
        )
        return int(rows[0][0])

    def names(self) -> tuple[list[str], list[str]]:
        """Package and workflow names ever published, for the filter boxes' suggestions.

        Workaround: no Runtime call lists publications; this reads their read model.
        A role that may not read it (PostgreSQL's runtime role) gets no suggestions."""
        packages: set[str] = set()
        workflows: set[str] = set()
        try:
            for publication in publication_reads.publications(self.runtime.store):
                packages.add(publication.package)
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
        timeline = tuple(
            # Workaround: Runtime.timeline has no `mutations=False`; a StepRunMutation
            # repeats the step event that caused it, so the page leaves them out.
            entry
            for entry in self.runtime.timeline(run_id)
            if category(entry.stream_id) != STEPS
        )
        return RunDetail(
            run=run,
            steps=in_dependency_order(run.steps),
            dag=layout(run.steps),
            timeline=timeline,
            why=self.runtime.why(run_id, now_ms=now),
            stamp=stamp(run),
            now_ms=now,
        )

    def stamp(self, run_id: str) -> str:
        """A short value that changes whenever the Run's page would (see `stamp`)."""
        return stamp(self.runtime.get_run(run_id))

    def step(self, run_id: str, step_key: str) -> StepDetail:
        """One step of a Run: its Attempts, its history, the steps that need it."""
        run = self.runtime.get_run(run_id)
        step = run.steps.get(step_key)
        if step is None:
            raise NotFound(f"run {run_id!r} has no step {step_key!r}")
        logs = tuple(
            (attempt.attempt_number, str(attempt.output["log_path"]))
            for attempt in step.attempts
            if isinstance(attempt.output, dict) and attempt.output.get("log_path")
        )
        return StepDetail(
            run=run,
            step=step,
            dependants=tuple(k for k, s in sorted(run.steps.items()) if step_key in s.needs),
            history=tuple(self.runtime.step_history(run_id, step_key)),
            log_paths=logs,
            now_ms=self.now_ms(),
        )

    # -- packages -------------------------------------------------------------------------
    def packages(self) -> list[Installation]:
        """Every installation with its generations and its publisher's trust.

        Workaround: no Runtime call lists publications or publishers; this reads the
        publication read model through the runtime's store."""
        store = self.runtime.store
        grouped: dict[tuple[str, str], list[Publication]] = {}
        for publication in publication_reads.publications(store):
            grouped.setdefault((publication.project, publication.installation), []).append(
                publication
            )
        installations = []
        for (project, installation), generations in sorted(grouped.items()):
            newest = max(generations, key=lambda p: p.generation)
            trust = publication_reads.publisher_status(store, newest.publisher) or "active"
            installations.append(
                Installation(
                    project=project,
                    installation=installation,
                    package=newest.package,
                    publisher=newest.publisher,
                    publisher_status=trust,
                    generations=tuple(sorted(generations, key=lambda p: -p.generation)),
                )
            )
        return installations

    # -- actions --------------------------------------------------------------------------
    def start(self, package: str, workflow: str) -> Any:
        """Admit a Run of `workflow` from the head of `package` (an installation or
        package name); the runtime's start guard decides whether it may."""
        return self.runtime.start(package, workflow, now_ms=self.now_ms())

    def cancel(self, run_id: str) -> bool:
        """Record a user cancel intent (idempotent); the cycle converges the Run."""
        self.runtime.get_run(run_id)  # an unknown id is a NotFound, not a silent no-op
        return self.runtime.cancel(run_id, "user", now_ms=self.now_ms())


def denied_errors(runtime: Runtime) -> tuple[type[BaseException], ...]:
    """The errors a store raises when the connected role lacks a privilege (PostgreSQL's
    least-privilege roles); none on SQLite. psycopg is imported only for PostgreSQL."""
    if runtime.store.dialect != "postgresql":
        return ()
    from psycopg import errors

    return (errors.InsufficientPrivilege,)


def stamp(run: RunView) -> str:
    """Changes with every RunEvent (the Run's version) and every lease change of its
    Attempts (grants and renewals do not move the Run's version)."""
    parts: list[object] = [run.run_id, run.version, run.status]
    for key in sorted(run.steps):
        for attempt in run.steps[key].attempts:
            parts += [attempt.attempt_id, attempt.lease_version, attempt.expires_at_ms]
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
