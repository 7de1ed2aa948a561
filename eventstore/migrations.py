"""Schema versions per component, and the event store's own schema.

`schema_versions(component, version)` records how many steps of each component's
list have been applied. A component's steps are append-only: step N+1 is added,
never edited, once step N has shipped. Higher layers register their own component
(`store.migrate("projections", steps)`); the store migrates "eventstore" at open.
"""

from __future__ import annotations

from collections.abc import Sequence

from domain.errors import InvalidInput, SchemaError
from eventstore import locks, pg_append
from eventstore.api import MigrationStep
from eventstore.transaction import BaseTransaction

EVENTSTORE_COMPONENT = "eventstore"

# Ids compare by code point on both dialects (PostgreSQL: COLLATE "C"), which
# streams_with_prefix's range scan relies on.
EVENTSTORE_STEPS: tuple[MigrationStep, ...] = (
    {
        "sqlite": [
            "CREATE TABLE streams (stream_id TEXT PRIMARY KEY, version INTEGER NOT NULL)"
            " WITHOUT ROWID",
            "CREATE TABLE events ("
            " global_position INTEGER PRIMARY KEY,"
            " event_id TEXT NOT NULL UNIQUE,"
            " stream_id TEXT NOT NULL,"
            " stream_version INTEGER NOT NULL,"
            " type TEXT NOT NULL,"
            " data TEXT NOT NULL,"
            " metadata TEXT NOT NULL,"
            " UNIQUE (stream_id, stream_version))",
        ],
        "postgresql": [
            'CREATE TABLE streams (stream_id TEXT COLLATE "C" PRIMARY KEY,'
            " version BIGINT NOT NULL)",
            "CREATE TABLE events ("
            " global_position BIGINT PRIMARY KEY,"
            ' event_id TEXT COLLATE "C" NOT NULL UNIQUE,'
            ' stream_id TEXT COLLATE "C" NOT NULL,'
            " stream_version BIGINT NOT NULL,"
            " type TEXT NOT NULL,"
            " data TEXT NOT NULL,"
            " metadata TEXT NOT NULL,"
            " UNIQUE (stream_id, stream_version))",
            # one row; its lock serialises position assignment (see postgres_store)
            "CREATE TABLE qlflow_position ("
            " singleton BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (singleton),"
            " last BIGINT NOT NULL)",
            "INSERT INTO qlflow_position (singleton, last) VALUES (TRUE, 0)",
        ],
    },
    # PostgreSQL: events are written through the append functions (eventstore.pg_append)
    {"sqlite": [], "postgresql": list(pg_append.MIGRATION)},
    # PostgreSQL: the append function's checks and compare-and-set, set-based
    {"sqlite": [], "postgresql": list(pg_append.SET_BASED)},
    # PostgreSQL: the append function refuses an event its fold could not decode
    {"sqlite": [], "postgresql": list(pg_append.SHAPED)},
    # PostgreSQL: named locks are row locks only the writing roles may take
    {"sqlite": [], "postgresql": list(locks.LOCK_TABLE_MIGRATION)},
    # PostgreSQL: the append function again, now knowing `step.reused` (docs/DESIGN.md
    # "Reruns"), for schemas whose function was made before it
    {"sqlite": [], "postgresql": list(pg_append.SHAPED)},
    # PostgreSQL: the append function again, now knowing the `retention` stream and
    # `retention.removed` (docs/DESIGN.md "Retention")
    {"sqlite": [], "postgresql": list(pg_append.SHAPED)},
    # PostgreSQL: the append function again, now knowing the notification- outbox
    # (docs/DESIGN.md "Notifications")
    {"sqlite": [], "postgresql": list(pg_append.SHAPED)},
    # PostgreSQL: the append function again, now knowing the limit- streams and
    # `workflow.dequeued` (docs/DESIGN.md "Flow control")
    {"sqlite": [], "postgresql": list(pg_append.SHAPED)},
    # PostgreSQL: the append that aborts its transaction when refused, sent with COMMIT
    # (docs/DESIGN.md "Two round trips")
    {"sqlite": [], "postgresql": list(pg_append.ABORTING)},
    # PostgreSQL: the append's core and the heads' lock plan their statements once
    # (docs/DESIGN.md "Two round trips")
    {"sqlite": [], "postgresql": list(pg_append.PLANNED_ONCE)},
)


def apply_steps(tx: BaseTransaction, component: str, steps: Sequence[MigrationStep]) -> int:
    """Apply `steps` beyond the recorded version of `component` inside `tx` (which must
    already have the schema_versions table); return the version now recorded."""
    if not isinstance(component, str) or not component:
        raise InvalidInput("component", "non_empty", "a schema component needs a non-empty name")
    rows = tx.query("SELECT version FROM schema_versions WHERE component = ?", (component,))
    recorded = rows[0][0] if rows else 0
    known = len(steps)
    check_version(component, recorded, known)
    for number in range(recorded + 1, known + 1):
        for statement in statements_for(steps[number - 1], tx.dialect, component, number):
            tx.execute(statement)
    if known > recorded:
        tx.execute(
            "INSERT INTO schema_versions (component, version) VALUES (?, ?) "
            "ON CONFLICT (component) DO UPDATE SET version = excluded.version",
            (component, known),
        )
    return known


def check_version(component: str, recorded: int, known: int) -> bool:
    """True when the recorded schema version of `component` is the one this code knows
    (False: steps to apply); SchemaError when the database is newer than the code."""
    if recorded > known:
        raise SchemaError(
            f"database schema {component} v{recorded} is newer than this qlflow "
            f"(knows v{known}); upgrade qlflow"
        )
    return recorded == known


def statements_for(step: MigrationStep, dialect: str, component: str, number: int) -> list[str]:
    """The SQL statements of one schema step for the store kind `dialect`."""
    try:
        sql = step[dialect]
    except (KeyError, TypeError) as exc:
        raise SchemaError(f"schema step {component} v{number} has no SQL for {dialect}") from exc
    return [sql] if isinstance(sql, str) else list(sql)
