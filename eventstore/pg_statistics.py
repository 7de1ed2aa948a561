"""The planner's statistics of a PostgreSQL store follow its growth (docs/DESIGN.md
"A fresh store").

A plan PostgreSQL keeps (a prepared statement's generic plan, a statement inside
`qlflow_append`) is made for the tables as their statistics describe them, and is
made again only when those change. Made while a table was small it may scan the whole
table, and it keeps doing so as the table grows until something analyses it:
autovacuum does, where it runs. So the store does too: after the migration that
creates the tables, and each time the log has grown `GROWTH` times since the last
analysis this process knows of (counted in global positions), the commit that
crosses the mark analyses the store's tables, once per process and mark. The marks
grow geometrically: a few analyses while a store is young, then rarely.
"""

from __future__ import annotations

import threading

FIRST_AT = 1_000  # the first mark, in events: before it the tables are tiny
GROWTH = 4

# the tables of the store's schema this role owns (ANALYZE skips, with a warning, a
# table another role owns: a least-privilege role leaves them to autovacuum)
OWNED_TABLES_SQL = (
    "SELECT c.relname FROM pg_class c WHERE c.relnamespace = "
    "current_schema()::regnamespace AND c.relkind IN ('r', 'p') "
    "AND pg_has_role(c.relowner, 'USAGE')"
)
NEVER_ANALYSED = " AND c.reltuples < 0"
EVENTS_ESTIMATE_SQL = (
    "SELECT greatest(c.reltuples, 0)::bigint FROM pg_class c WHERE c.oid = to_regclass('events')"
)


def analyse_sql(quoted_tables: list[str]) -> str:
    """ANALYZE of the tables, skipping any another session is analysing or vacuuming
    right now rather than waiting for it."""
    return f"ANALYZE (SKIP_LOCKED) {', '.join(quoted_tables)}"


class GrowthMarks:
    """When this process analyses the store's tables next."""

    def __init__(self, events_known: int) -> None:
        self._next = max(FIRST_AT, events_known * GROWTH)
        self._lock = threading.Lock()

    @property
    def next_mark(self) -> int:
        """The global position whose commit analyses next."""
        return self._next

    def crossed(self, position: int) -> bool:
        """Whether a commit that reached `position` is the one to analyse (then the
        next mark moves on, so no other commit of this process analyses for it)."""
        with self._lock:
            if position < self._next:
                return False
            self._next = position * GROWTH
            return True
