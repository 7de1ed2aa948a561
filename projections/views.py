"""Query side: Run views from the read models (or from a Run aggregate: the state at
some version), and event queries over the log."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

import orjson

from domain import execution as execution_rules
from domain.aggregate import RunAggregate
from domain.errors import InvalidInput
from domain.records import Record
from domain.transitions import RUN_RUNNING, STEP_TERMINAL, Status
from eventstore.api import EventStore
from projections import retention, run_search
from projections.run_search import RunCursor, RunFilter
from projections.run_streams import read_whole_runs


@dataclass(frozen=True, slots=True)
class AttemptView:
    """One Task Attempt of a step: its status, its latest lease (id, version, status,
    holder, expiry), when it started and ended, what the task returned (`output`)
    and how it ran (`execution`: exit code, signal, pid, log path; domain.execution)."""

    attempt_id: str
    status: str
    attempt_number: int
    lease_id: str | None
    lease_version: int | None
    lease_status: str | None
    worker_id: str | None
    expires_at_ms: int | None
    started_at_ms: int | None
    ended_at_ms: int | None
    result_code: str | None
    output: dict[str, Any] | None
    execution: dict[str, Any] | None = None

    def _ran(self, key: str) -> Any:
        return None if self.execution is None else self.execution.get(key)

    @property
    def exit_code(self) -> int | None:
        """The process's exit code (None: it did not exit, or no process ran)."""
        return self._ran("exit_code")  # type: ignore[no-any-return]

    @property
    def signal(self) -> str | None:
        """The signal that ended the process ("SIGTERM"), or None."""
        return self._ran("signal")  # type: ignore[no-any-return]

    @property
    def pid(self) -> int | None:
        """The process id the executor ran it as, or None."""
        return self._ran("pid")  # type: ignore[no-any-return]

    @property
    def log_path(self) -> str | None:
        """Where the executor's host kept the Attempt's log file, or None."""
        return self._ran("log_path")  # type: ignore[no-any-return]

    @property
    def stopped_by(self) -> str | None:
        """Who stopped the process (stop_requested, shutdown, killed), or None."""
        return self._ran("stopped_by")  # type: ignore[no-any-return]

    @property
    def error(self) -> str | None:
        """What the executor said went wrong (start failure, unreadable output), or None."""
        return self._ran("error")  # type: ignore[no-any-return]


@dataclass(frozen=True, slots=True)
class StepView:
    """One step of a Run: its StepRun's status, result code and epoch (bumped by every
    change), what it needs, and its Attempts in claim order. `output` is the
    succeeded Attempt's output; `retry_at_ms` is set while the step waits for a
    retry (plan v2), of at most `max_attempts` Attempts a worker reports failed."""

    step_key: str
    step_run_id: str
    task_ref: str
    needs: tuple[str, ...]
    status: str
    result_code: str | None
    epoch: int
    attempts: list[AttemptView] = field(default_factory=list)
    max_attempts: int = 1
    retry_at_ms: int | None = None
    # a rerun reused it (docs/DESIGN.md "Reruns"): {"run_id", "attempt_id"} of its origin
    reused_from: dict[str, str] | None = None
    reused_output: dict[str, Any] | None = None

    @property
    def output(self) -> dict[str, Any] | None:
        """The output of the step's succeeded Attempt (or the reused one), or None."""
        if self.reused_from is not None:
            return self.reused_output
        for attempt in self.attempts:
            if attempt.status == Status.SUCCEEDED:
                return attempt.output
        return None

    @property
    def failed_attempts(self) -> int:
        """Attempts a worker reported failed (lost ones are not counted)."""
        return sum(1 for attempt in self.attempts if attempt.status == Status.FAILED)


@dataclass(frozen=True, slots=True)
class RunView:
    """A Run: what was admitted (package, workflow, publication, plan digest, admission
    key), its status and version, deadline, cancel intent, outcome codes, and its
    steps by step key (empty in `runs()` listings)."""

    run_id: str
    package: str
    workflow_key: str
    publication_id: str
    plan_digest: str
    admission_key: str | None
    status: str
    version: int
    admitted_at_ms: int
    deadline_ms: int | None
    cancel_requested_at_ms: int | None
    cancel_reason: str | None
    result_code: str | None
    error_code: str | None
    terminal_at_ms: int | None
    step_count: int = 0
    open_steps: int = 0  # steps not terminal yet
    params: dict[str, Any] = field(default_factory=dict)  # bound by a plan v2
    steps: dict[str, StepView] = field(default_factory=dict)
    rerun_of: str | None = None  # the Run this one reruns (docs/DESIGN.md "Reruns")

    @property
    def terminal(self) -> bool:
        """Whether the Run has ended (succeeded, failed, cancelled or timed out)."""
        return self.status != RUN_RUNNING


_RUN_COLUMNS = (
    "run_id, package, workflow_key, publication_id, plan_digest, admission_key, status, "
    "version, admitted_at_ms, deadline_ms, cancel_requested_at_ms, cancel_reason, "
    "result_code, error_code, terminal_at_ms, step_count, open_steps, params, rerun_of"
)


def _run_view(row: tuple[Any, ...]) -> RunView:
    *values, params, rerun_of = row
    return replace(
        RunView(*values), params=orjson.loads(params) if params else {}, rerun_of=rerun_of
    )


_ATTEMPT_COLUMNS = tuple(f.name for f in fields(AttemptView))  # the attempts table's names


def get_run(store: EventStore, run_id: str) -> RunView:
    """The Run as the read models hold it, with its steps and their Attempts."""
    rows = store.query(f"SELECT {_RUN_COLUMNS} FROM runs WHERE run_id = ?", (run_id,))
    if not rows:
        raise retention.run_not_found(store, run_id)
    attempts: dict[str, list[AttemptView]] = {}
    for step_key, *values in store.query(
        f"""SELECT step_key, {", ".join(_ATTEMPT_COLUMNS)}
            FROM attempts WHERE run_id = ? ORDER BY claimed_position""",
        (run_id,),
    ):
        columns = dict(zip(_ATTEMPT_COLUMNS, values, strict=True))
        for json_column in ("output", "execution"):
            if columns[json_column] is not None:
                columns[json_column] = orjson.loads(columns[json_column])
        attempts.setdefault(step_key, []).append(AttemptView(**columns))
    steps = {}
    for (
        key,
        step_run_id,
        task_ref,
        needs,
        status,
        result_code,
        epoch,
        limit,
        retry_at,
        reused_from,
        reused_output,
    ) in store.query(
        """SELECT step_key, step_run_id, task_ref, needs, status, result_code, epoch,
                      max_attempts, retry_at_ms, reused_from, reused_output
               FROM step_runs WHERE run_id = ? ORDER BY step_key""",
        (run_id,),
    ):
        steps[key] = StepView(
            key,
            step_run_id,
            task_ref,
            tuple(n for n in needs.split(",") if n),
            status,
            result_code,
            epoch,
            attempts.get(key, []),
            max_attempts=limit,
            retry_at_ms=retry_at if status == Status.READY else None,
            reused_from=orjson.loads(reused_from) if reused_from else None,
            reused_output=orjson.loads(reused_output) if reused_output else None,
        )
    return replace(_run_view(rows[0]), steps=steps)


def list_runs(
    store: EventStore,
    run_filter: RunFilter | None = None,
    *,
    before: RunCursor | None = None,
    after: RunCursor | None = None,
    limit: int = 100,
) -> list[RunView]:
    """Runs (without steps) matching the filter, newest first: the newest page, or the
    page older than `before` / newer than `after` (see projections.run_search)."""
    rows = run_search.list_runs(
        store, _RUN_COLUMNS, run_filter or RunFilter(), before=before, after=after, limit=limit
    )
    return [_run_view(row) for row in rows]


def cursor_of(run: RunView) -> RunCursor:
    """The place of `run` in the runs list (for `before=` / `after=`)."""
    return RunCursor(run.admitted_at_ms, run.run_id)


def events(
    store: EventStore,
    run_id: str | None = None,
    *,
    types: Iterable[str] | None = None,
    since_ms: int | None = None,
    until_ms: int | None = None,
    after_position: int = 0,
    before_position: int | None = None,
    limit: int | None = None,
    newest_first: bool = False,
) -> list[Record]:
    """Events of the log filtered by Run, type, time and position (after
    `after_position`, before `before_position`): in position order, or newest first
    (the newest `limit` of them)."""
    if after_position < 0:
        raise InvalidInput("after_position", "non-negative", "after_position must be >= 0")
    if limit is not None and limit < 1:
        raise InvalidInput("limit", "positive", "limit must be a positive integer")
    wanted_types = frozenset(types) if types is not None else None
    upper = before_position

    def inside(record: Record) -> bool:
        position = record.global_position
        return position > after_position and (upper is None or position < upper)

    source: Iterable[Record]
    if run_id is not None:
        whole = read_whole_runs(store, [run_id]).get(run_id)
        records = [] if whole is None else [*whole.run, *whole.steps]
        records += [r for lease in (whole.leases.values() if whole else ()) for r in lease]
        source = sorted(
            (r for r in records if inside(r)),
            key=lambda r: r.global_position,
            reverse=newest_first,
        )
    elif newest_first:
        source = _backwards(store, after_position, upper)
    else:
        source = itertools.takewhile(inside, store.iter_all(after_position))
    found: list[Record] = []
    for record in source:
        if wanted_types is not None and record.type not in wanted_types:
            continue
        at_ms = record.metadata.get("at_ms")
        if since_ms is not None and (at_ms is None or at_ms < since_ms):
            continue
        if until_ms is not None and (at_ms is None or at_ms >= until_ms):
            continue
        found.append(record)
        if limit is not None and len(found) >= limit:
            break
    return found


def _backwards(
    store: EventStore, after: int, before: int | None, batch: int = 1000
) -> Iterable[Record]:
    """The log's events with after < position < before, newest first, read one window
    of positions at a time (ascending reads, each window reversed)."""
    high = store.head_position() + 1 if before is None else before
    while high - 1 > after:
        low = max(after, high - 1 - batch)
        window = [r for r in store.read_all(low, batch) if r.global_position < high]
        yield from reversed(window)
        high = low + 1


def view_of_aggregate(aggregate: RunAggregate, step_keys: Iterable[str] | None = None) -> RunView:
    """A Run aggregate (the state at some version) in the shape of the read models'
    RunView, with what only the read models know (times of attempts, end of the
    Run) left empty. `step_keys`: the views of those steps only (what a step's inputs
    need: it and its needs), the Run's own fields as ever."""
    run = aggregate.run
    plan = run.plan
    wanted = None if step_keys is None else frozenset(step_keys)
    steps = {}
    for key, step in aggregate.steps.items():
        if wanted is not None and key not in wanted:
            continue
        attempts = []
        for attempt_id in step.attempt_ids:
            attempt = aggregate.attempts[attempt_id]
            lease = attempt.lease
            # the aggregate keeps the output as logged; how it ran is not folded there
            output, execution = execution_rules.split({"output": attempt.output})
            attempts.append(
                AttemptView(
                    attempt_id=attempt.attempt_id,
                    status=attempt.status,
                    attempt_number=attempt.attempt_number,
                    lease_id=lease.lease_id if lease else None,
                    lease_version=lease.version if lease else None,
                    lease_status=lease.status if lease else None,
                    worker_id=attempt.worker_id or (lease.worker_id if lease else None),
                    expires_at_ms=lease.expires_at_ms if lease else None,
                    started_at_ms=None,
                    ended_at_ms=None,
                    result_code=attempt.result_code,
                    output=output,
                    execution=execution,
                )
            )
        steps[key] = StepView(
            step_key=key,
            step_run_id=step.step_run_id,
            task_ref=step.task_ref,
            needs=tuple(step.needs),
            status=step.status,
            result_code=step.result_code,
            epoch=step.epoch,
            attempts=attempts,
            max_attempts=plan.step(key).max_attempts,
            retry_at_ms=step.retry_at_ms if step.status == Status.READY else None,
            reused_from=_origin(step.reused_from),
            reused_output=_plain(step.reused_from["output"]) if step.reused_from else None,
        )
    return RunView(
        run_id=run.run_id,
        package=plan.package,
        workflow_key=plan.workflow_key,
        publication_id=plan.publication_id,
        plan_digest=plan.plan_digest,
        admission_key=run.admission_key,
        status=run.status,
        version=run.version,
        admitted_at_ms=run.admitted_at_ms,
        deadline_ms=run.deadline_ms,
        cancel_requested_at_ms=run.cancel_requested_at_ms,
        cancel_reason=run.cancel_reason,
        result_code=run.result_code,
        error_code=run.error_code,
        terminal_at_ms=None,
        step_count=len(aggregate.steps),
        open_steps=sum(1 for s in aggregate.steps.values() if s.status not in STEP_TERMINAL),
        params=plan.param_values,
        steps=steps,
    )


def _origin(reused_from: Any) -> dict[str, str] | None:
    """A reused step's origin as the read model holds it: {run_id, attempt_id}."""
    if reused_from is None:
        return None
    return {"run_id": reused_from["run_id"], "attempt_id": reused_from["attempt_id"]}


def _plain(value: Any) -> Any:
    """A folded JSON value (read-only mappings inside) as plain dicts and lists."""
    if isinstance(value, Mapping):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return value
