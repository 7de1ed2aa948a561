"""Schema versions per component: apply once, apply only what is new, refuse the future."""

from __future__ import annotations

import sqlite3

import psycopg
import pytest

from domain.errors import SchemaError
from eventstore import open_store
from eventstore.migrations import EVENTSTORE_STEPS

STEP_1 = {
    "sqlite": "CREATE TABLE widgets (widget_id TEXT PRIMARY KEY)",
    "postgresql": "CREATE TABLE widgets (widget_id TEXT PRIMARY KEY)",
}
STEP_2 = {
    "sqlite": [
        "ALTER TABLE widgets ADD COLUMN size INTEGER",
        "CREATE INDEX w_size ON widgets (size)",
    ],
    "postgresql": [
        "ALTER TABLE widgets ADD COLUMN size BIGINT",
        "CREATE INDEX w_size ON widgets (size)",
    ],
}


def recorded(store, component):
    return store.query("SELECT version FROM schema_versions WHERE component = ?", (component,))


def test_the_store_records_its_own_schema(store):
    assert recorded(store, "eventstore") == [(len(EVENTSTORE_STEPS),)]


def test_steps_apply_once_and_only_the_new_ones(store):
    assert store.migrate("widgets", [STEP_1]) == 1
    assert store.migrate("widgets", [STEP_1]) == 1  # again: nothing to do
    assert store.migrate("widgets", [STEP_1, STEP_2]) == 2

    assert recorded(store, "widgets") == [(2,)]
    with store.transaction() as tx:
        tx.execute("INSERT INTO widgets (widget_id, size) VALUES (?, ?)", ("w1", 3))
    assert store.query("SELECT widget_id, size FROM widgets") == [("w1", 3)]


def test_a_failing_step_applies_nothing(store):
    broken = {dialect: [sql, "CREATE TABLE widgets (oops)x"] for dialect, sql in STEP_1.items()}

    with pytest.raises((sqlite3.Error, psycopg.Error)):  # the driver's own syntax error
        store.migrate("widgets", [broken])

    assert recorded(store, "widgets") == []
    assert store.migrate("widgets", [STEP_1]) == 1  # widgets was not left half-created


def test_a_step_without_sql_for_the_dialect_is_a_schema_error(store):
    with pytest.raises(SchemaError, match=f"no SQL for {store.dialect}"):
        store.migrate("widgets", [{"oracle": "CREATE TABLE x (y INT)"}])


def test_a_database_newer_than_the_code_is_refused(store_url):
    store = open_store(store_url)
    try:
        store.migrate("widgets", [STEP_1, STEP_2])
        with pytest.raises(SchemaError, match=r"widgets v2 is newer than this qlflow \(knows v1\)"):
            store.migrate("widgets", [STEP_1])
        with store.transaction() as tx:
            tx.execute(
                "UPDATE schema_versions SET version = ? WHERE component = 'eventstore'",
                (len(EVENTSTORE_STEPS) + 1,),
            )
    finally:
        store.close()

    with pytest.raises(SchemaError) as caught:
        open_store(store_url)

    assert str(caught.value) == (
        f"database schema eventstore v{len(EVENTSTORE_STEPS) + 1} is newer than this qlflow "
        f"(knows v{len(EVENTSTORE_STEPS)}); upgrade qlflow"
    )
