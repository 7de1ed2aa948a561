"""Query side: Run views from the read models, and event queries over the log."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import orjson

from domain.errors import InvalidInput, NotFound
from domain.records import Record


@dataclass(frozen=True, slots=True)
class AttemptView:
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
    output: dict | None


@dataclass(frozen=True, slots=True)
class StepView:
    step_key: str
    step_run_id: str
    task_ref: str
    needs: tuple[str, ...]
    status: str
    result_code: str | None
    epoch: int
    attempts: list[AttemptView] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class RunView:
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
    steps: dict[str, StepView] = field(default_factory=dict)

    @property
    def terminal(self) -> bool:
        return self.status != "running"


_RUN_COLUMNS = (
    "run_id, package, workflow_key, publication_id, plan_digest, admission_key, status, "
    "version, admitted_at_ms, deadline_ms, cancel_requested_at_ms, cancel_reason, "
    "result_code, error_code, terminal_at_ms"
)


def get_run(store, run_id: str) -> RunView:
    """The Run as the read models hold it, with its steps and their Attempts."""
    rows = store.query(f"SELECT {_RUN_COLUMNS} FROM runs WHERE run_id = ?", (run_id,))
    if not rows:
        raise NotFound(f"run {run_id!r} does not exist; `qlflow runs` lists the runs")
    attempts: dict[str, list[AttemptView]] = {}
    for row in store.query(
        """SELECT step_key, attempt_id, status, attempt_number, lease_id, lease_version,
                  lease_status, worker_id, expires_at_ms, started_at_ms, ended_at_ms,
                  result_code, output
           FROM attempts WHERE run_id = ? ORDER BY claimed_position""",
        (run_id,),
    ):
        output = orjson.loads(row[12]) if row[12] is not None else None
        attempts.setdefault(row[0], []).append(AttemptView(*row[1:12], output))
    steps = {}
    for key, step_run_id, task_ref, needs, status, result_code, epoch in store.query(
        """SELECT step_key, step_run_id, task_ref, needs, status, result_code, epoch
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
        )
    return RunView(*rows[0], steps=steps)


def list_runs(store, *, status: str | None = None, limit: int = 100) -> list[RunView]:
    """The most recently admitted Runs (without steps), newest first."""
    where, params = ("WHERE status = ?", [status]) if status else ("", [])
    rows = store.query(
        f"SELECT {_RUN_COLUMNS} FROM runs {where} ORDER BY admitted_at_ms DESC, run_id LIMIT ?",
        (*params, limit),
    )
    return [RunView(*row) for row in rows]


def events(
    store,
    run_id: str | None = None,
    *,
    types: Iterable[str] | None = None,
    since_ms: int | None = None,
    until_ms: int | None = None,
    after_position: int = 0,
    limit: int | None = None,
) -> list[Record]:
    """Events of the log in position order, filtered by Run, type and time."""
    if after_position < 0:
        raise InvalidInput("after_position", "non-negative", "after_position must be >= 0")
    if limit is not None and limit < 1:
        raise InvalidInput("limit", "positive", "limit must be a positive integer")
    wanted_types = frozenset(types) if types is not None else None
    if run_id is not None:
        streams = [f"run-{run_id}", f"steps-{run_id}"]
        streams += [
            f"lease-{a}"
            for (a,) in store.query("SELECT attempt_id FROM attempts WHERE run_id = ?", (run_id,))
        ]
        source: Iterable[Record] = sorted(
            (
                r
                for s in streams
                for r in store.read_stream(s)
                if r.global_position > after_position
            ),
            key=lambda r: r.global_position,
        )
    else:
        source = store.iter_all(after_position)
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
