"""Prove the live read models equal a replay of the log (docs/DESIGN.md, "Projections").

`verify(store)` builds the replay copy exactly as `rebuild` does (private connection,
shadowing temp tables, the modules' own `apply`), but never swaps it in. The final
catch-up and the comparison run in one snapshot transaction (SQLite: one deferred read
transaction; PostgreSQL: REPEATABLE READ), so the live tables and the copy reflect
the same log position even while the runtime keeps appending — projections are
written in the append's transaction. Nothing is written to the live tables.

Per table: row count and a SHA-256 over the canonical encoding of every row (orjson
of the row's values in column order), rows ordered by the table's key. Where the
database finds both sides' rows equal (`ReplayCopy.same_rows`: each row of either has
an equal row of its key on the other, null-safe column by column, as the swap compares
them), only the live side is read and its sum stands for both. On a
difference, the report lists each key that is missing from the live table, extra in
it, or changed (with the columns that differ, live value beside replayed value).

The log itself is checked on the same read (`projections.log_check.LogCheck`:
contiguous versions, heads, positions, decodable documents): each event is read once
for the check and the folds alike (the check decodes each document and drops it; the
folds decode again the data of the records they make, which costs less than holding
decoded documents did), and each problem is named by stream, version and position.
The folds stop at the first undecodable document (a replay could only stop there) and
nothing is compared; a fold that fails on a broken log is a problem in the report,
never a crash. The stream heads are compared in the
final snapshot, with the log's tail.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from operator import itemgetter
from typing import Any

import orjson

from eventstore.api import EventStore
from projections import registry, snapshots
from projections.log_check import DOCUMENT, LogProblem
from projections.rebuild import DEFAULT_BATCH, Progress, ReplayCopy, check_batch

MAX_DIFFERENCES_PER_TABLE = 100
MISSING = "missing"  # in the replay, not in the live table
EXTRA = "extra"  # in the live table, not in the replay
CHANGED = "changed"  # in both, with different column values
SNAPSHOT = "snapshot"  # a Run snapshot that is not the fold of the log up to its versions


@dataclass(frozen=True, slots=True)
class TableCheck:
    """One table's comparison: rows and checksum on each side."""

    rows: int
    rows_replay: int
    checksum_live: str
    checksum_replay: str

    @property
    def ok(self) -> bool:
        return self.rows == self.rows_replay and self.checksum_live == self.checksum_replay


@dataclass(frozen=True, slots=True)
class Difference:
    """One row that differs: its table, its key, and how."""

    table: str
    key: dict[str, Any]
    kind: str  # missing | extra | changed
    columns: dict[str, tuple[Any, Any]] = field(default_factory=dict)  # column -> (live, replay)
    problem: str | None = None  # what is wrong with a snapshot

    def line(self) -> str:
        key = ", ".join(f"{name}={value!r}" for name, value in self.key.items())
        if self.kind == SNAPSHOT:
            return (
                f"{self.table} [{key}]: not the fold of the log up to its versions: {self.problem}"
            )
        if self.kind == MISSING:
            return f"{self.table} [{key}]: missing from the live table (the replay has it)"
        if self.kind == EXTRA:
            return f"{self.table} [{key}]: in the live table but not in the replay"
        changed = "; ".join(
            f"{column} live={live!r} replay={replay!r}"
            for column, (live, replay) in self.columns.items()
        )
        return f"{self.table} [{key}]: changed: {changed}"


@dataclass(frozen=True, slots=True)
class VerifyReport:
    """Whether every live read-model table equals its replay, at log `position`."""

    ok: bool
    position: int
    tables: dict[str, TableCheck]
    differences: list[Difference]
    truncated: dict[str, int] = field(default_factory=dict)  # table -> differences not listed
    log_problems: list[LogProblem] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def lines(self) -> list[str]:
        """Human sentences: a verdict, then every difference."""
        if self.ok:
            return [
                f"the log is sound and read models match a replay of it up to position "
                f"{self.position} ({len(self.tables)} tables)"
            ]
        lines = []
        if self.log_problems:
            lines.append(f"the log has {len(self.log_problems)} problem(s)")
            lines += [problem.line() for problem in self.log_problems]
        bad = [name for name, check in self.tables.items() if not check.ok]
        bad += sorted({d.table for d in self.differences if d.kind == SNAPSHOT})
        if bad:
            lines.append(
                f"read models differ from a replay at position {self.position}: {', '.join(bad)}"
            )
        lines += [difference.line() for difference in self.differences]
        lines += [
            f"{table}: {count} more differences not listed"
            for table, count in self.truncated.items()
        ]
        return lines


def verify(
    store: EventStore, progress: Progress | None = None, *, batch: int = DEFAULT_BATCH
) -> VerifyReport:
    """Compare every live read-model table with a fresh replay of the log."""
    check_batch(batch)
    registry.migrate_all(store)
    tables: dict[str, TableCheck] = {}
    differences: list[Difference] = []
    truncated: dict[str, int] = {}
    position = 0
    with ReplayCopy.open(store) as copy:
        check = copy.checked()
        copy.replay(progress, batch)
        with copy.snapshot():
            copy.catch_up()
            problems = check.finish(copy.tx, copy.live("streams"))
            if any(problem.kind == DOCUMENT for problem in problems):
                return VerifyReport(False, 0, tables, differences, truncated, problems)
            if copy.failure is not None:
                if not problems:
                    raise copy.failure
                failure = copy.failure
                problems.append(
                    LogProblem(
                        "*", None, None, f"the replay stopped: {type(failure).__name__}: {failure}"
                    )
                )
                return VerifyReport(False, 0, {}, [], {}, problems)
            position = _compare(copy, tables, differences, truncated)
    return VerifyReport(
        ok=not problems
        and all(check.ok for check in tables.values())
        and not any(d.kind == SNAPSHOT for d in differences),
        position=position,
        tables=tables,
        differences=differences,
        truncated=truncated,
        log_problems=problems,
    )


def _compare(
    copy: ReplayCopy,
    tables: dict[str, TableCheck],
    differences: list[Difference],
    truncated: dict[str, int],
) -> int:
    """Compare the replayed copy with the live tables (inside the snapshot that read
    the log's tail); the log position."""
    for table, key in copy.tables.items():
        columns = copy.columns(table)
        live = _rows(copy, copy.live(table), columns, key)
        if copy.same_rows(table):
            # the database found every row equal on both sides: the replay's rows are
            # the live ones, encoded and summed once
            checksum = _checksum(live)
            tables[table] = TableCheck(len(live), len(live), checksum, checksum)
            continue
        replay = _rows(copy, copy.copy(table), columns, key)
        tables[table] = TableCheck(
            rows=len(live),
            rows_replay=len(replay),
            checksum_live=_checksum(live),
            checksum_replay=_checksum(replay),
        )
        if not tables[table].ok:
            found = _differences(table, columns, key, live, replay)
            differences += found[:MAX_DIFFERENCES_PER_TABLE]
            if len(found) > MAX_DIFFERENCES_PER_TABLE:
                truncated[table] = len(found) - MAX_DIFFERENCES_PER_TABLE
    differences += [
        Difference(
            snapshots.TABLE,
            {"run_id": run_id, "run_version": run_v, "steps_version": steps_v},
            SNAPSHOT,
            problem=problem,
        )
        for run_id, run_v, steps_v, problem in snapshots.check(copy.tx, copy.live(snapshots.TABLE))
    ]
    return copy.position


def _rows(
    copy: ReplayCopy, table: str, columns: Sequence[str], key: Sequence[str]
) -> list[tuple[Any, ...]]:
    """Every row of `table` (qualified), ordered by its key."""
    select = ", ".join(f'"{column}"' for column in columns)
    rows = copy.tx.query(f"SELECT {select} FROM {table}")
    # one column's value or a tuple of them: the same order as a tuple of one
    return sorted(rows, key=itemgetter(*(columns.index(k) for k in key)))


def _encode(row: tuple[Any, ...]) -> bytes:
    return orjson.dumps(row, default=str)


def _checksum(rows: list[tuple[Any, ...]]) -> str:
    """The SHA-256 of every row's encoding, each followed by a newline (fed to the
    digest `_CHECKSUM_ROWS` rows at a time)."""
    digest = hashlib.sha256()
    for start in range(0, len(rows), _CHECKSUM_ROWS):
        digest.update(b"\n".join(map(_encode, rows[start : start + _CHECKSUM_ROWS])) + b"\n")
    return digest.hexdigest()


_CHECKSUM_ROWS = 1000


def _differences(
    table: str,
    columns: Sequence[str],
    key: Sequence[str],
    live: list[tuple[Any, ...]],
    replay: list[tuple[Any, ...]],
) -> list[Difference]:
    positions = [columns.index(k) for k in key]

    def key_of(row: tuple[Any, ...]) -> tuple[Any, ...]:
        return tuple(row[p] for p in positions)

    live_by_key = {key_of(row): row for row in live}
    replay_by_key = {key_of(row): row for row in replay}
    found: list[Difference] = []
    for row_key in sorted(live_by_key.keys() | replay_by_key.keys()):
        named = dict(zip(key, row_key, strict=True))
        mine, theirs = live_by_key.get(row_key), replay_by_key.get(row_key)
        if mine is None:
            found.append(Difference(table, named, MISSING))
        elif theirs is None:
            found.append(Difference(table, named, EXTRA))
        elif _encode(mine) != _encode(theirs):
            changed = {
                column: (a, b)
                for column, a, b in zip(columns, mine, theirs, strict=True)
                if _encode((a,)) != _encode((b,))
            }
            found.append(Difference(table, named, CHANGED, changed))
    return found
