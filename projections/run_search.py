"""Finding Runs: the runs list (newest first, filtered, keyset-paged), counting what a
filter matches, and short ids — any unique prefix of a Run or Attempt id names it,
and `short_ids` gives the shortest prefix that always will.

Every query reads the `runs` and `attempts` read models through an index: the
newest-first orders have one each (projections.runs, schema step 2), and an id
prefix is a range on the primary key.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from domain.errors import AmbiguousId, InvalidInput, NotFound
from domain.ids import RUN_ID, TASK_ATTEMPT
from eventstore.api import Reads
from projections import retention

SHORT_HEX = 8  # a short id shows at least this many hex digits
CANDIDATES_SHOWN = 10  # an ambiguous prefix lists at most this many matches
_TOP = "\U0010ffff"  # sorts after every character: prefix <= id < prefix + _TOP
_DERIVED = re.compile(r"[a-z]{3}:[0-9a-f]{32}")
_CURSOR = re.compile(r"([0-9]{1,16})\.(.+)", re.DOTALL)


@dataclass(frozen=True, slots=True)
class RunCursor:
    """A place in the runs list, newest first: (admitted_at_ms desc, run_id asc)."""

    admitted_at_ms: int
    run_id: str

    def token(self) -> str:
        """The cursor as text (`<admitted_at_ms>.<run_id>`), for a URL or a command line."""
        return f"{self.admitted_at_ms}.{self.run_id}"

    @classmethod
    def parse(cls, field_name: str, text: str) -> RunCursor:
        """A cursor from its `token()`; InvalidInput naming `field_name` otherwise."""
        found = _CURSOR.fullmatch(text) if isinstance(text, str) else None
        if found is None:
            raise InvalidInput(field_name, "cursor", f"{field_name} is not a page cursor: {text!r}")
        return cls(int(found.group(1)), found.group(2))


@dataclass(frozen=True, slots=True)
class RunFilter:
    """Which Runs a search wants: exact package, workflow and status; admitted at or
    after `since_ms` and before `until_ms`; run id starting with `id_prefix` (with or
    without the `run:` of a derived id)."""

    package: str | None = None
    workflow: str | None = None
    status: str | None = None
    since_ms: int | None = None
    until_ms: int | None = None
    id_prefix: str | None = None
    rerun_of: str | None = None  # reruns of this Run only (docs/DESIGN.md "Reruns")

    def where(self) -> tuple[list[str], list[Any]]:
        """SQL conditions over the runs table (joined with AND) and their parameters."""
        where: list[str] = []
        params: list[Any] = []
        for column, value in (
            ("package", self.package),
            ("workflow_key", self.workflow),
            ("status", self.status),
            ("rerun_of", self.rerun_of),
        ):
            if value is not None:
                where.append(f"{column} = ?")
                params.append(value)
        if self.since_ms is not None:
            where.append("admitted_at_ms >= ?")
            params.append(self.since_ms)
        if self.until_ms is not None:
            where.append("admitted_at_ms < ?")
            params.append(self.until_ms)
        if self.id_prefix:
            condition, values = prefix_condition("run_id", id_forms(self.id_prefix, RUN_ID))
            where.append(condition)
            params += values
        return where, params


def id_forms(text: str, kind_prefix: str) -> list[str]:
    """The prefixes a typed id may stand for: as typed, and with the kind's own prefix
    (`run:`, `wta:`) put in front when it was left out."""
    text = text.strip()
    if text.startswith(kind_prefix):
        return [text]
    return [text, kind_prefix + text]


def prefix_condition(column: str, prefixes: Sequence[str]) -> tuple[str, list[Any]]:
    """`column` starts with one of `prefixes`: a key range (an index seek on the
    primary key) checked exactly by `substr`."""
    terms = []
    params: list[Any] = []
    for prefix in prefixes:
        terms.append(f"({column} >= ? AND {column} < ? AND substr({column}, 1, ?) = ?)")
        params += [prefix, prefix + _TOP, len(prefix), prefix]
    return "(" + " OR ".join(terms) + ")", params


def list_runs(
    reads: Reads,
    columns: str,
    run_filter: RunFilter,
    *,
    before: RunCursor | None = None,
    after: RunCursor | None = None,
    limit: int = 100,
) -> list[tuple[Any, ...]]:
    """Rows (`columns` of the runs table) matching the filter, newest first: the page
    older than `before`, the page newer than `after`, or the newest page."""
    sql, params = list_sql(columns, run_filter, before=before, after=after, limit=limit)
    rows = reads.query(sql, params)
    return rows[::-1] if after is not None else rows


def list_sql(
    columns: str,
    run_filter: RunFilter,
    *,
    before: RunCursor | None = None,
    after: RunCursor | None = None,
    limit: int = 100,
) -> tuple[str, list[Any]]:
    """The query of `list_runs` and its parameters (`after` pages come oldest first)."""
    if before is not None and after is not None:
        raise InvalidInput("before", "one cursor", "give before or after, not both")
    where, params = run_filter.where()
    if after is not None:
        order = "admitted_at_ms ASC, run_id DESC"
        # written so the index seeks to the cursor: a range, then the tie on run_id
        where.append("admitted_at_ms >= ? AND (admitted_at_ms > ? OR run_id < ?)")
        params += [after.admitted_at_ms, after.admitted_at_ms, after.run_id]
    else:
        order = "admitted_at_ms DESC, run_id ASC"
        if before is not None:
            where.append("admitted_at_ms <= ? AND (admitted_at_ms < ? OR run_id > ?)")
            params += [before.admitted_at_ms, before.admitted_at_ms, before.run_id]
    clause = f"WHERE {' AND '.join(where)}" if where else ""
    return f"SELECT {columns} FROM runs {clause} ORDER BY {order} LIMIT ?", [*params, limit]


def count_runs(reads: Reads, run_filter: RunFilter, at_most: int) -> int:
    """How many Runs match, counted up to `at_most` + 1 (so "more than" can be said)."""
    where, params = run_filter.where()
    clause = f"WHERE {' AND '.join(where)}" if where else ""
    rows = reads.query(
        f"SELECT COUNT(*) FROM (SELECT 1 FROM runs {clause} LIMIT ?) AS matching",
        (*params, at_most + 1),
    )
    return int(rows[0][0])


# --- short ids ---------------------------------------------------------------------------


def resolve_run(reads: Reads, text: str) -> str:
    """The Run id `text` names: the id itself, or a unique prefix of it (the `run:` of
    a derived id may be left out). NotFound when nothing matches; AmbiguousId, listing
    the matches, when several do."""
    try:
        return _resolve(
            reads, "runs", "run_id", "run", text, RUN_ID, "`qlflow runs` lists the runs"
        )
    except NotFound:
        # a Run retention removed says so (docs/DESIGN.md, "Retention")
        wanted = text.strip()
        removed = retention.tombstones_by_prefix(reads, wanted, 2)
        if not removed and not wanted.startswith(RUN_ID):
            removed = retention.tombstones_by_prefix(reads, RUN_ID + wanted, 2)
        if len(removed) == 1:
            raise retention.run_not_found(reads, removed[0]) from None
        raise


def resolve_attempt(reads: Reads, text: str, run_id: str | None = None) -> str:
    """The Attempt id `text` names (the id, or a unique prefix; `wta:` may be left out),
    among the Attempts of `run_id` if given."""
    scope = ("run_id = ?", [run_id]) if run_id is not None else None
    return _resolve(
        reads,
        "attempts",
        "attempt_id",
        "attempt",
        text,
        TASK_ATTEMPT,
        "`qlflow show RUN` lists a Run's Attempts",
        scope,
    )


def _resolve(
    reads: Reads,
    table: str,
    column: str,
    kind: str,
    text: str,
    kind_prefix: str,
    hint: str,
    scope: tuple[str, list[Any]] | None = None,
) -> str:
    if not isinstance(text, str) or not text.strip():
        raise InvalidInput(kind, "text", f"a {kind} id must be a non-empty string, got {text!r}")
    text = text.strip()
    extra, extra_params = (f" AND {scope[0]}", scope[1]) if scope else ("", [])
    if reads.query(f"SELECT 1 FROM {table} WHERE {column} = ?{extra}", (text, *extra_params)):
        return text
    condition, params = prefix_condition(column, id_forms(text, kind_prefix))
    found = [
        row[0]
        for row in reads.query(
            f"SELECT {column} FROM {table} WHERE {condition}{extra} ORDER BY {column} LIMIT ?",
            (*params, *extra_params, CANDIDATES_SHOWN + 1),
        )
    ]
    if not found:
        raise NotFound(f"no {kind} id is or starts with {text!r}; {hint}")
    if len(found) > 1:
        raise AmbiguousId(
            kind, text, tuple(found[:CANDIDATES_SHOWN]), len(found) > CANDIDATES_SHOWN
        )
    return str(found[0])


def short_ids(reads: Reads, run_ids: Sequence[str]) -> dict[str, str]:
    """For each Run id, the shortest text that names it as a prefix — a derived id's hex
    digits without `run:`, at least `SHORT_HEX` of them; any other id whole."""
    derived = sorted({r for r in run_ids if _DERIVED.fullmatch(r) and r.startswith(RUN_ID)})
    shorts = {r: r for r in run_ids}
    for start in range(0, len(derived), 100):
        part = derived[start : start + 100]
        select = (
            "SELECT CAST(? AS TEXT), (SELECT MAX(run_id) FROM runs WHERE run_id < ?), "
            "(SELECT MIN(run_id) FROM runs WHERE run_id > ?)"
        )
        rows = reads.query(
            " UNION ALL ".join([select] * len(part)), [v for r in part for v in (r, r, r)]
        )
        for run_id, previous, following in rows:
            common = max(_common(run_id, previous), _common(run_id, following))
            length = max(len(RUN_ID) + SHORT_HEX, common + 1)
            shorts[run_id] = run_id[len(RUN_ID) : length]
    # a bare short form could also be the start of an id chosen by hand
    bare = [s for r, s in shorts.items() if s != r]
    if bare:
        condition, params = prefix_condition("run_id", bare)
        taken = [
            row[0] for row in reads.query(f"SELECT run_id FROM runs WHERE {condition}", params)
        ]
        for run_id, short in list(shorts.items()):
            if short != run_id and any(t.startswith(short) for t in taken):
                shorts[run_id] = run_id
    return shorts


def _common(a: str, b: str | None) -> int:
    """The length of the common prefix of `a` and `b` (0 for None)."""
    if b is None:
        return 0
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n
