"""What only the PostgreSQL adapter promises: the URL's schema, pool options, clear errors."""

from __future__ import annotations

import pytest

from domain.errors import InvalidInput, SchemaError, StoreUnavailable
from eventstore import open_store
from eventstore.url import with_search_path
from tests.eventstore.builders import event, stream

pytestmark = pytest.mark.pg


def test_tables_live_in_the_schema_the_url_names(pg_url):
    store = open_store(pg_url, pool_max_size=2)
    try:
        [(schema,)] = store.query("SELECT current_schema()")
        tables = store.query(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = ? "
            "ORDER BY table_name",
            (schema,),
        )
    finally:
        store.close()

    assert schema.startswith("t_")
    assert [t for (t,) in tables] == [
        "events",
        "log_attempts",
        "log_chunks",
        "log_prunes",
        "qlflow_append_rights",
        "qlflow_locks",
        "qlflow_position",
        "schema_versions",
        "streams",
    ]


def test_postgres_scheme_is_accepted(pg_url):
    store = open_store("postgres://" + pg_url.split("://", 1)[1])
    try:
        store.append([stream("run-a", 0, event("e1"))])
        assert store.dialect == "postgresql"
        assert [r.event_id for r in store.read_all()] == ["e1"]
    finally:
        store.close()


def test_unknown_option_is_refused(pg_url):
    with pytest.raises(InvalidInput) as caught:
        open_store(pg_url, synchronous="FULL")
    assert (caught.value.field, caught.value.rule) == ("options", "unknown")


def test_a_search_path_without_a_schema_is_a_schema_error(pg_server_url):
    with pytest.raises(SchemaError, match="search_path"):
        open_store(with_search_path(pg_server_url, "t_no_such_schema"), connect_timeout_s=5)


def test_an_unreachable_server_fails_fast_as_store_unavailable():
    with pytest.raises(StoreUnavailable, match="cannot connect to PostgreSQL") as caught:
        open_store("postgresql://postgres@127.0.0.1:9/none", connect_timeout_s=0.5)
    assert caught.value.reason == "unreachable"


def test_reclaim_vacuums_every_table_of_the_store_outside_a_transaction(pg_url):
    # VACUUM is what makes deleted rows' space reusable (whether a row is dead to every
    # snapshot depends on the server's other sessions, so the count is what is checked)
    store = open_store(pg_url)
    try:
        store.append([stream(f"run-{n}", 0, event(f"e{n}")) for n in range(20)])
        with store.transaction() as tx:
            tx.execute("DELETE FROM events WHERE stream_id LIKE 'run-1%'")

        def vacuums() -> dict[str, int]:
            rows = store.query(
                "SELECT relname, vacuum_count FROM pg_stat_user_tables "
                "WHERE schemaname = current_schema()"
            )
            return {name: count for name, count in rows}

        before = vacuums()
        reclaimed = store.reclaim()

        assert sorted(reclaimed) == sorted(before)  # every table, the role owns them all
        assert vacuums() == {name: count + 1 for name, count in before.items()}
    finally:
        store.close()
