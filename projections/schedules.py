"""The read model of schedules: what each head publication declares and each
schedule's cursor (docs/DESIGN.md, "Schedules").

One row per schedule id ever declared, folded from two kinds of record in the
append's transaction:

- `publication.published`: the installation's schedules are re-declared — every
  row of the installation stops being declared, then each schedule the new head
  declares is (again) declared, with its spec, owner and publication;
- the `schedule-<id>` stream: the cursor (status, version, head event,
  `next_fire_at_ms`, the last fire);
- the end of the last fired Run (its `workflow.<terminal>` record, or the
  `retention.removed` record that names it): `last_run_ended_at_ms`.

`work_at_ms` is the domain's answer (`domain.schedule_heads.work_at_ms`) to "from
when does the schedule phase have work here"; a partial index on it is all a cycle
reads, so a dormant schedule costs nothing. The row also keeps the answer for once
the last fired Run has ended (`work_when_ended_ms`, `domain.schedule_heads.work_pair`):
an overlap `queue` schedule has no work while that Run runs, and the Run's end moves
the second answer into `work_at_ms` with one queued UPDATE, no read and no timer.
Every other write picks between the two by the row's own columns in the same
statement, so a Run ending concurrently is never overwritten by a stale answer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from domain.errors import CorruptionError, PlanError
from domain.event_types import EventType, Family, of
from domain.publication import publication_from_json
from domain.records import Record
from domain.retention import removed_runs
from domain.revision import revision_from_json
from domain.schedule_heads import Declaration, declarations, work_pair
from domain.schedule_spec import STORED_OVERLAP, ScheduleSpec
from domain.schedules import ScheduleState, fold_schedule
from domain.streams import PUBLICATION, RETENTION, RUN, SCHEDULE, entity_id, prefix
from domain.transitions import RUN_TERMINAL
from eventstore.api import Reads, Row, Transaction
from eventstore.grants import AUDIT, MOVE, PUBLISHER, READ, RUNTIME
from eventstore.replay import DecodedRecord, decoded_rows
from projections.contract import Folded, Insert

COMPONENT = "projections.schedules"
PUBLISHED = EventType.PUBLICATION_PUBLISHED
STREAM_PREFIXES = (prefix(SCHEDULE), prefix(PUBLICATION), prefix(RUN), prefix(RETENTION))
# plain str values: a StrEnum member's comparison costs several times a str's, and a
# rebuild hands this fold every Run record (docs/DESIGN.md, "Rebuild")
_RUN_ENDS = frozenset(str(of(Family.WORKFLOW, status)) for status in RUN_TERMINAL)
_PUBLISHED = PUBLISHED.value
_RETENTION_REMOVED = EventType.RETENTION_REMOVED.value
_LAST_RUN_RUNNING = "last_run_id IS NOT NULL AND last_run_ended_at_ms IS NULL"
# the types `apply` acts on outside a schedule's own stream
_TYPES_FOLDED = frozenset((_PUBLISHED, _RETENTION_REMOVED, *_RUN_ENDS))

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
# step 2: overlap (docs/DESIGN.md, "Schedules"): the policy, when the last fired Run
# ended (NULL while it runs) and the work once it has; rows made before keep `allow`
# (what their revisions mean) and get their last Run's end from `backfill`
MIGRATIONS.append(
    {
        "sqlite": [
            f"ALTER TABLE schedules ADD COLUMN overlap TEXT NOT NULL DEFAULT '{STORED_OVERLAP}'",
            "ALTER TABLE schedules ADD COLUMN last_run_ended_at_ms INTEGER",
            "ALTER TABLE schedules ADD COLUMN work_when_ended_ms INTEGER",
            "UPDATE schedules SET work_when_ended_ms = work_at_ms",
            """CREATE INDEX schedules_running_run ON schedules (last_run_id)
                WHERE last_run_id IS NOT NULL AND last_run_ended_at_ms IS NULL""",
        ],
    }
)
# PostgreSQL takes the same DDL with BIGINT for the integer columns.
for _step in MIGRATIONS:
    _step["postgresql"] = [stmt.replace("INTEGER", "BIGINT") for stmt in _step["sqlite"]]

TABLES = {"schedules": ("schedule_id",)}
# the runtime moves cursors; a publisher's publish re-declares its installation's rows
reads_ahead = None  # apply reads nothing worth sending ahead
reads_ahead_of_runs = None
GRANTS = {"schedules": {RUNTIME: MOVE, PUBLISHER: MOVE, AUDIT: READ}}

_COLUMNS = (
    "schedule_id, project, installation, package, publisher, workflow_key, cron, timezone, "
    "misfire, params, publication_id, published_at_ms, declared, status, version, "
    "head_event_id, next_fire_at_ms, last_fired_at_ms, last_run_id, overlap, "
    "last_run_ended_at_ms"
)
# the work of a row: the first answer while its last fired Run runs, else the second
_PICK_WORK = """work_at_ms = CASE WHEN last_run_id IS NOT NULL AND last_run_ended_at_ms IS NULL
      THEN CAST(? AS BIGINT) ELSE CAST(? AS BIGINT) END, work_when_ended_ms = ?"""


@dataclass(frozen=True, slots=True)
class ScheduleRow:
    """One row: the declaration, whether the head still declares it, the cursor, and
    when the last fired Run ended (None while it runs, or before any fired)."""

    declaration: Declaration
    declared: bool
    state: ScheduleState | None
    last_run_ended_at_ms: int | None = None

    @property
    def previous_running(self) -> bool:
        """Whether the schedule's last fired Run has not ended yet."""
        last_run = None if self.state is None else self.state.last_run_id
        return last_run is not None and self.last_run_ended_at_ms is None


def apply(tx: Transaction, records: Sequence[Record], folded: Folded | None = None) -> None:
    """Fold freshly appended records into the `schedules` rows."""
    ended: list[tuple[int, str]] = []
    schedule = STREAM_PREFIXES[0]
    for record in records:
        kind = record.type
        if kind == _PUBLISHED:
            _published(tx, record)
        elif record.stream_id.startswith(schedule):
            _cursor(tx, record)
        elif kind in _RUN_ENDS:
            ended.append((record.metadata.get("at_ms", 0), entity_id(record.stream_id)))
        elif kind == _RETENTION_REMOVED:
            ended += [
                (run.get("terminal_at_ms") or 0, run["run_id"]) for run in removed_runs(record.data)
            ]
    if ended:
        # a Run's end is a schedule's news only if it was the last one the schedule
        # fired: one queued statement, served by the partial index of running last Runs
        tx.executemany(
            """UPDATE schedules SET last_run_ended_at_ms = ?, work_at_ms = work_when_ended_ms
               WHERE last_run_id = ? AND last_run_ended_at_ms IS NULL""",
            ended,
        )


class Replay:
    """`apply` for a rebuild, handed the stored rows of every record of a batch
    (`apply_rows`): it keeps those `apply` would act on among those of
    `STREAM_PREFIXES` (a set lookup of the type first, as most records are Run records
    it passes over), makes records of them and applies them, so the rebuild does not
    sort the batch out for it."""

    def __init__(self, tx: Transaction, insert: Insert) -> None:
        del insert
        self._tx = tx

    def apply_rows(self, rows: Sequence[Row], record_of: Callable[[Row], Any]) -> None:
        types, schedule = _TYPES_FOLDED, STREAM_PREFIXES[0]
        self._apply(
            [
                record_of(row)
                for row in rows
                if (row[4] in types and row[2].startswith(STREAM_PREFIXES))
                or row[2].startswith(schedule)
            ]
        )

    def apply(self, records: Sequence[Record]) -> None:
        """`apply_rows` of records (their documents decoded already)."""
        self.apply_rows(decoded_rows(records), DecodedRecord)

    def _apply(self, mine: Sequence[Record]) -> None:
        """Apply the records `apply` acts on, unless they change no row."""
        if not mine:
            return
        schedule = STREAM_PREFIXES[0]
        # a batch of Run ends alone changes a row only if some schedule's last fired
        # Run is still running: asked once (the partial index answers), not once per
        # Run as the UPDATE would (a log of unscheduled Runs asks for nothing)
        ends_alone = all(
            record.type in _RUN_ENDS and not record.stream_id.startswith(schedule)
            for record in mine
        )
        if ends_alone and not self._tx.query(
            f"SELECT 1 FROM schedules WHERE {_LAST_RUN_RUNNING} LIMIT 1"
        ):
            return
        apply(self._tx, mine)

    def flush(self) -> None:
        """Nothing is held back."""


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
            work, _ = work_pair(None, declaration, True)
            tx.execute(
                f"INSERT INTO schedules ({_COLUMNS}, work_at_ms, work_when_ended_ms) VALUES "
                "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 1, NULL, 0, '', NULL, NULL, NULL, ?, "
                "NULL, ?, ?)",
                (*_declared_values(declaration), declaration.spec.overlap, work, work),
            )
            continue
        tx.execute(
            f"""UPDATE schedules SET project = ?, installation = ?, package = ?, publisher = ?,
                 workflow_key = ?, cron = ?, timezone = ?, misfire = ?, params = ?,
                 publication_id = ?, published_at_ms = ?, declared = 1, overlap = ?,
                 {_PICK_WORK}
               WHERE schedule_id = ?""",
            (
                *_declared_values(declaration)[1:],
                declaration.spec.overlap,
                *_picked(work_pair(state, declaration, True)),
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
        _set_work(tx, row.declaration.schedule_id, work_pair(row.state, row.declaration, False))


def _cursor(tx: Transaction, record: Record) -> None:
    schedule_id = record.stream_id[len(STREAM_PREFIXES[0]) :]
    row = _row(tx, schedule_id)
    if row is None:
        raise CorruptionError(f"{record.stream_id}: a schedule stream no publication declares")
    if row.state is not None and record.stream_version <= row.state.version:
        return  # an exact replay hands back records already folded
    state = fold_schedule([record], row.state)
    assert state is not None
    cursor = (
        state.status,
        state.version,
        state.head_event_id,
        state.next_fire_at_ms,
        state.last_fired_at_ms,
        state.last_run_id,
    )
    running, ended = work_pair(state, row.declaration, row.declared)
    if record.type == EventType.SCHEDULE_FIRED:  # its Run was admitted with it: running
        tx.execute(
            """UPDATE schedules SET status = ?, version = ?, head_event_id = ?,
                 next_fire_at_ms = ?, last_fired_at_ms = ?, last_run_id = ?,
                 last_run_ended_at_ms = NULL, work_at_ms = ?, work_when_ended_ms = ?
               WHERE schedule_id = ?""",
            (*cursor, running, ended, schedule_id),
        )
        return
    tx.execute(
        f"""UPDATE schedules SET status = ?, version = ?, head_event_id = ?, next_fire_at_ms = ?,
             last_fired_at_ms = ?, last_run_id = ?, {_PICK_WORK} WHERE schedule_id = ?""",
        (*cursor, running, ended, ended, schedule_id),
    )


def _picked(pair: tuple[int | None, int | None]) -> tuple[int | None, int | None, int | None]:
    """The parameters of `_PICK_WORK` for (work while running, work once ended)."""
    return pair[0], pair[1], pair[1]


def _set_work(tx: Transaction, schedule_id: str, pair: tuple[int | None, int | None]) -> None:
    tx.execute(
        f"UPDATE schedules SET {_PICK_WORK} WHERE schedule_id = ?", (*_picked(pair), schedule_id)
    )


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
        overlap,
        last_run_ended_at_ms,
    ) = values
    spec = ScheduleSpec(
        cron=cron,
        timezone=timezone,
        misfire=misfire,
        params=tuple(sorted(orjson.loads(params).items())),
        overlap=overlap,
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
    return ScheduleRow(declaration, bool(declared), state, last_run_ended_at_ms)


def _row(reader: Reads, schedule_id: str) -> ScheduleRow | None:
    rows = reader.query(f"SELECT {_COLUMNS} FROM schedules WHERE schedule_id = ?", (schedule_id,))
    return _from_values(rows[0]) if rows else None


OVERLAP_STEP = 2  # the schema step that added the overlap columns


def backfill(store: Any, from_version: int) -> int:
    """After an upgrade across `OVERLAP_STEP`, record when each schedule's last fired
    Run ended, from the Runs read model or its retention tombstone (what a rebuild
    folds from the log); a new store has nothing to fill. Returns the rows filled."""
    if from_version == 0 or from_version >= OVERLAP_STEP:
        return 0
    filled = 0
    with store.transaction() as tx:
        found = tx.query(
            """SELECT schedule_id, last_run_id FROM schedules
               WHERE last_run_id IS NOT NULL AND last_run_ended_at_ms IS NULL"""
        )
        for schedule_id, run_id in found:
            ended = tx.query("SELECT status, terminal_at_ms FROM runs WHERE run_id = ?", (run_id,))
            if not ended:
                ended = tx.query(
                    "SELECT status, terminal_at_ms FROM removed_runs WHERE run_id = ?", (run_id,)
                )
            if not ended or ended[0][0] not in RUN_TERMINAL:
                continue
            tx.execute(
                """UPDATE schedules SET last_run_ended_at_ms = ?, work_at_ms = work_when_ended_ms
                   WHERE schedule_id = ?""",
                (ended[0][1] or 0, schedule_id),
            )
            filled += 1
    return filled


# --- readers -----------------------------------------------------------------------------


def row(reader: Reads, schedule_id: str) -> ScheduleRow | None:
    """The schedule's row (declaration, declared, cursor), or None."""
    return _row(reader, schedule_id)


_DUE = "work_at_ms IS NOT NULL AND work_at_ms <= ?"  # a schedule with work (at ?)


def due(
    reader: Reads, now_ms: int, limit: int, after: tuple[int, str] | None = None
) -> list[tuple[int, str]]:
    """Up to `limit` (work_at_ms, schedule id) with work at `now_ms`, in that order,
    after `after`. Reads the partial index only: a schedule with no work is never read."""
    if after is None:
        rows = reader.query(
            f"""SELECT work_at_ms, schedule_id FROM schedules WHERE {_DUE}
                ORDER BY work_at_ms, schedule_id LIMIT ?""",
            (now_ms, limit),
        )
    else:
        rows = reader.query(
            f"""SELECT work_at_ms, schedule_id FROM schedules WHERE {_DUE}
                  AND (work_at_ms > ? OR (work_at_ms = ? AND schedule_id > ?))
                ORDER BY work_at_ms, schedule_id LIMIT ?""",
            (now_ms, after[0], after[0], after[1], limit),
        )
    return [(r[0], r[1]) for r in rows]


def due_probe(now_ms: int) -> tuple[str, list[Any]]:
    """The query whose one row (or none) says whether a schedule has work at `now_ms`
    (the first row `due` would read)."""
    return f"SELECT 1 FROM schedules WHERE {_DUE} LIMIT 1", [now_ms]


def listed(reader: Reads) -> list[ScheduleRow]:
    """Every schedule that is not retired and still declared, or armed and not retired,
    by (package, workflow, id)."""
    rows = reader.query(
        f"""SELECT {_COLUMNS} FROM schedules
            WHERE (status IS NULL AND declared = 1) OR status IN ('active', 'paused')
            ORDER BY package, workflow_key, schedule_id"""
    )
    return [_from_values(values) for values in rows]
