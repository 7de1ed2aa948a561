"""The read model of schedules: what each head publication declares and each
schedule's cursor (docs/DESIGN.md, "Schedules").

One row per schedule id ever declared, folded from two kinds of record in the
append's transaction:

- `publication.published`: the installation's schedules are re-declared — every
  row of the installation stops being declared, then each schedule the new head
  declares is (again) declared, with its spec, owner and publication;
- the `schedule-<id>` stream: the cursor (status, version, head event,
  `next_fire_at_ms`, the last fire).

`work_at_ms` is the domain's answer (`domain.schedule_heads.work_at_ms`) to "from
when does the schedule phase have work here"; a partial index on it is all a cycle
reads, so a dormant schedule costs nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from domain.errors import CorruptionError, PlanError
from domain.event_types import EventType
from domain.publication import publication_from_json
from domain.records import Record
from domain.revision import revision_from_json
from domain.schedule_heads import Declaration, declarations, work_at_ms
from domain.schedule_spec import ScheduleSpec
from domain.schedules import ScheduleState, fold_schedule
from domain.streams import PUBLICATION, SCHEDULE, prefix
from eventstore.api import Reads, Transaction
from eventstore.grants import AUDIT, MOVE, PUBLISHER, READ, RUNTIME

COMPONENT = "projections.schedules"
PUBLISHED = EventType.PUBLICATION_PUBLISHED
STREAM_PREFIXES = (prefix(SCHEDULE), prefix(PUBLICATION))

MIGRATIONS: list[dict[str, Any]] = [
    {
        "sqlite": [
            """CREATE TABLE schedules (
                schedule_id TEXT PRIMARY KEY,
                project TEXT NOT NULL,
                installation TEXT NOT NULL,
                package TEXT NOT NULL,
                publisher TEXT NOT NULL,
                workflow_key TEXT NOT NULL,
                cron TEXT NOT NULL,
                timezone TEXT NOT NULL,
                misfire TEXT NOT NULL,
                params TEXT NOT NULL,
                publication_id TEXT NOT NULL,
                published_at_ms INTEGER NOT NULL,
                declared INTEGER NOT NULL,
                status TEXT,
                version INTEGER NOT NULL,
                head_event_id TEXT NOT NULL,
                next_fire_at_ms INTEGER,
                last_fired_at_ms INTEGER,
                last_run_id TEXT,
                work_at_ms INTEGER
            )""",
            """CREATE INDEX schedules_work ON schedules (work_at_ms, schedule_id)
                WHERE work_at_ms IS NOT NULL""",
            "CREATE INDEX schedules_by_installation ON schedules (project, installation)",
        ],
    }
]
# PostgreSQL takes the same DDL with BIGINT for the integer columns.
MIGRATIONS[0]["postgresql"] = [
    stmt.replace("INTEGER", "BIGINT") for stmt in MIGRATIONS[0]["sqlite"]
]

TABLES = {"schedules": ("schedule_id",)}
# the runtime moves cursors; a publisher's publish re-declares its installation's rows
GRANTS = {"schedules": {RUNTIME: MOVE, PUBLISHER: MOVE, AUDIT: READ}}

_COLUMNS = (
    "schedule_id, project, installation, package, publisher, workflow_key, cron, timezone, "
    "misfire, params, publication_id, published_at_ms, declared, status, version, "
    "head_event_id, next_fire_at_ms, last_fired_at_ms, last_run_id"
)


@dataclass(frozen=True, slots=True)
class ScheduleRow:
    """One row: the declaration, whether the head still declares it, the cursor."""

    declaration: Declaration
    declared: bool
    state: ScheduleState | None


def apply(tx: Transaction, records: Sequence[Record]) -> None:
    """Fold freshly appended records into the `schedules` rows."""
    for record in records:
        if record.type == PUBLISHED:
            _published(tx, record)
        elif record.stream_id.startswith(STREAM_PREFIXES[0]):
            _cursor(tx, record)


def _published(tx: Transaction, record: Record) -> None:
    try:
        publication = publication_from_json(record.data["publication"])
        revision = revision_from_json(record.data["revision"])
    except PlanError:
        # a recorded publication that does not check (tampered with) starts nothing:
        # admission refuses it, and here it declares no schedules
        return
    found = declarations(publication, revision, record.data["published_at_ms"])
    # only rows that change: a publish of an installation without schedules writes none
    tx.execute(
        """UPDATE schedules SET declared = 0 WHERE project = ? AND installation = ?
             AND declared = 1""",
        (publication.project, publication.installation),
    )
    for declaration in found:
        row = _row(tx, declaration.schedule_id)
        state = row.state if row is not None else None
        if row is None:
            tx.execute(
                f"INSERT INTO schedules ({_COLUMNS}, work_at_ms) VALUES "
                "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 1, NULL, 0, '', NULL, NULL, NULL, ?)",
                (
                    *_declared_values(declaration),
                    work_at_ms(None, True, declaration.published_at_ms),
                ),
            )
            continue
        tx.execute(
            """UPDATE schedules SET project = ?, installation = ?, package = ?, publisher = ?,
                 workflow_key = ?, cron = ?, timezone = ?, misfire = ?, params = ?,
                 publication_id = ?, published_at_ms = ?, declared = 1, work_at_ms = ?
               WHERE schedule_id = ?""",
            (
                *_declared_values(declaration)[1:],
                work_at_ms(state, True, declaration.published_at_ms),
                declaration.schedule_id,
            ),
        )
    # rows of the installation no longer declared: their work is now retirement
    rows = tx.query(
        f"""SELECT {_COLUMNS} FROM schedules WHERE project = ? AND installation = ?
              AND declared = 0 AND status IN ('active', 'paused')""",
        (publication.project, publication.installation),
    )
    for values in rows:
        row = _from_values(values)
        _set_work(tx, row.declaration.schedule_id, work_at_ms(row.state, False, 0))


def _cursor(tx: Transaction, record: Record) -> None:
    schedule_id = record.stream_id[len(STREAM_PREFIXES[0]) :]
    row = _row(tx, schedule_id)
    if row is None:
        raise CorruptionError(f"{record.stream_id}: a schedule stream no publication declares")
    if row.state is not None and record.stream_version <= row.state.version:
        return  # an exact replay hands back records already folded
    state = fold_schedule([record], row.state)
    assert state is not None
    tx.execute(
        """UPDATE schedules SET status = ?, version = ?, head_event_id = ?, next_fire_at_ms = ?,
             last_fired_at_ms = ?, last_run_id = ?, work_at_ms = ? WHERE schedule_id = ?""",
        (
            state.status,
            state.version,
            state.head_event_id,
            state.next_fire_at_ms,
            state.last_fired_at_ms,
            state.last_run_id,
            work_at_ms(state, row.declared, row.declaration.published_at_ms),
            schedule_id,
        ),
    )


def _set_work(tx: Transaction, schedule_id: str, at_ms: int | None) -> None:
    tx.execute("UPDATE schedules SET work_at_ms = ? WHERE schedule_id = ?", (at_ms, schedule_id))


def _declared_values(declaration: Declaration) -> tuple[Any, ...]:
    spec = declaration.spec
    return (
        declaration.schedule_id,
        declaration.project,
        declaration.installation,
        declaration.package,
        declaration.publisher,
        declaration.workflow,
        spec.cron,
        spec.timezone,
        spec.misfire,
        orjson.dumps(dict(spec.params), option=orjson.OPT_SORT_KEYS).decode(),
        declaration.publication_id,
        declaration.published_at_ms,
    )


def _from_values(values: Sequence[Any]) -> ScheduleRow:
    (
        schedule_id,
        project,
        installation,
        package,
        publisher,
        workflow,
        cron,
        timezone,
        misfire,
        params,
        publication_id,
        published_at_ms,
        declared,
        status,
        version,
        head_event_id,
        next_fire_at_ms,
        last_fired_at_ms,
        last_run_id,
    ) = values
    spec = ScheduleSpec(
        cron=cron,
        timezone=timezone,
        misfire=misfire,
        params=tuple(sorted(orjson.loads(params).items())),
    )
    declaration = Declaration(
        schedule_id=schedule_id,
        publication_id=publication_id,
        project=project,
        installation=installation,
        package=package,
        publisher=publisher,
        workflow=workflow,
        spec=spec,
        published_at_ms=published_at_ms,
    )
    state = None
    if status is not None:
        state = ScheduleState(
            schedule_id=schedule_id,
            status=status,
            version=version,
            head_event_id=head_event_id,
            next_fire_at_ms=next_fire_at_ms,
            last_fired_at_ms=last_fired_at_ms,
            last_run_id=last_run_id,
        )
    return ScheduleRow(declaration, bool(declared), state)


def _row(reader: Reads, schedule_id: str) -> ScheduleRow | None:
    rows = reader.query(f"SELECT {_COLUMNS} FROM schedules WHERE schedule_id = ?", (schedule_id,))
    return _from_values(rows[0]) if rows else None


# --- readers -----------------------------------------------------------------------------


def row(reader: Reads, schedule_id: str) -> ScheduleRow | None:
    """The schedule's row (declaration, declared, cursor), or None."""
    return _row(reader, schedule_id)


def due(
    reader: Reads, now_ms: int, limit: int, after: tuple[int, str] | None = None
) -> list[tuple[int, str]]:
    """Up to `limit` (work_at_ms, schedule id) with work at `now_ms`, in that order,
    after `after`. Reads the partial index only: a schedule with no work is never read."""
    if after is None:
        rows = reader.query(
            """SELECT work_at_ms, schedule_id FROM schedules WHERE work_at_ms IS NOT NULL
                 AND work_at_ms <= ? ORDER BY work_at_ms, schedule_id LIMIT ?""",
            (now_ms, limit),
        )
    else:
        rows = reader.query(
            """SELECT work_at_ms, schedule_id FROM schedules WHERE work_at_ms IS NOT NULL
                 AND work_at_ms <= ? AND (work_at_ms > ? OR (work_at_ms = ? AND schedule_id > ?))
               ORDER BY work_at_ms, schedule_id LIMIT ?""",
            (now_ms, after[0], after[0], after[1], limit),
        )
    return [(r[0], r[1]) for r in rows]


def listed(reader: Reads) -> list[ScheduleRow]:
    """Every schedule that is not retired and still declared, or armed and not retired,
    by (package, workflow, id)."""
    rows = reader.query(
        f"""SELECT {_COLUMNS} FROM schedules
            WHERE (status IS NULL AND declared = 1) OR status IN ('active', 'paused')
            ORDER BY package, workflow_key, schedule_id"""
    )
    return [_from_values(values) for values in rows]
