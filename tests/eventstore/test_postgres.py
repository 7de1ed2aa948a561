"""What only the PostgreSQL adapter promises: the URL's schema, pool options, clear errors."""

from __future__ import annotations

import time

import pytest

from domain.errors import InvalidInput, SchemaError, StoreUnavailable
from eventstore import open_store, pg_append, pg_statistics
from eventstore.pg_unavailable import RANDOM_PAGE_COST
from eventstore.postgres_store import (
    FILLED_PAGE_BYTES,
    SPARSE_MIN_PAGES,
    index_entry_bytes,
    sparse_index,
    sparse_indexes,
)
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


def _events_estimate(store) -> float:
    [(rows,)] = store.query("SELECT reltuples FROM pg_class WHERE oid = to_regclass('events')")
    return rows


def test_a_commit_that_grows_the_log_past_a_mark_analyses_the_tables(pg_url, monkeypatch):
    monkeypatch.setattr(pg_statistics, "FIRST_AT", 8)
    store = open_store(pg_url, pool_max_size=2)
    try:
        assert _events_estimate(store) == 0  # analysed empty when created
        store.append([stream("run-a", 0, *(event(f"a{i}") for i in range(5)))])
        assert _events_estimate(store) == 0  # positions 1-5: under the first mark
        store.append([stream("run-b", 0, *(event(f"b{i}") for i in range(5)))])
        assert _events_estimate(store) == 10  # position 10 crossed 8: analysed
        assert store._growth.next_mark == 40  # the next, GROWTH times further
        store.append([stream("run-c", 0, *(event(f"c{i}") for i in range(5)))])
        assert _events_estimate(store) == 10
    finally:
        store.close()
    again = open_store(pg_url, pool_max_size=2)  # another process: from the estimate
    try:
        assert again._growth.next_mark == 10 * pg_statistics.GROWTH
    finally:
        again.close()


def _prepared(sql: str, types: str) -> str:
    parts = sql.split("%b")  # the store's %b marks as numbered parameters
    numbered = "".join(f"{part}${n}" for n, part in enumerate(parts[:-1], 1)) + parts[-1]
    return f"PREPARE kept({types}) AS {numbered}"


def _generic_plan(store, sql: str, types: str, values: str) -> str:
    """The plan the server would keep for `sql` (its %b marks as parameters of `types`)."""
    with store.transaction() as tx:
        tx.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        tx.execute(_prepared(sql, types))
        try:
            return "\n".join(row[0] for row in tx.query(f"EXPLAIN EXECUTE kept({values})"))
        finally:
            tx.execute("DEALLOCATE kept")


def _plans_kept(store, sql: str, types: str, values: str, runs: int = 8) -> int:
    """How many of `runs` executions of `sql` prepared used the kept (generic) plan."""
    with store.transaction() as tx:
        tx.execute(_prepared(sql, types))
        for _ in range(runs):
            tx.query(f"EXECUTE kept({values})")
        [(generic,)] = tx.query(
            "SELECT generic_plans FROM pg_prepared_statements WHERE name = 'kept'"
        )
        tx.execute("DEALLOCATE kept")
    return generic


def test_kept_plans_of_the_tail_read_and_the_locks_never_scan_and_are_kept(pg_url):
    from eventstore.postgres_store import LOCK_ALL_SQL, TAIL_SQL, TRY_LOCK_EACH_SQL

    store = open_store(pg_url, pool_max_size=2)
    try:
        for n in range(40):  # a table big enough that a join could choose to scan it
            store.append([stream(f"run-s{n}", 0, *(event(f"s{n}-{i}") for i in range(25)))])
        with store.transaction() as tx:
            tx.execute("ANALYZE events")
        tail = _generic_plan(store, TAIL_SQL, "text[], bigint[]", "'{run-s1}', '{3}'")
        # the server plans each call of a statement until it finds its kept plan no
        # worse than the calls' own (after five): these keys' estimates must not differ
        kept = [
            _plans_kept(store, sql, "text[]", "'{a}'") for sql in (LOCK_ALL_SQL, TRY_LOCK_EACH_SQL)
        ]
    finally:
        store.close()
    assert "Index" in tail and "Seq Scan on events" not in tail, tail
    assert kept == [3, 3]


def _function_settings(store) -> dict[str, list[str] | None]:
    with store.transaction() as tx:
        rows = tx.query(
            "SELECT p.proname, p.proconfig FROM pg_proc p"
            " WHERE p.pronamespace = current_schema()::regnamespace"
            " AND p.proname IN ('qlflow_append_core', 'qlflow_lock_heads')"
        )
    return {name: config for name, config in rows}


def test_the_append_and_the_heads_lock_plan_their_statements_once(pg_url):
    # the heads' FOR UPDATE (`= ANY (array)`) was planned again at every append
    generic = "plan_cache_mode=force_generic_plan"
    store = open_store(pg_url, pool_max_size=2)
    try:
        fresh = _function_settings(store)
        with store.transaction() as tx:  # as a store at step 10 has them
            for name, types in (
                ("qlflow_append_core", pg_append.CORE_TYPES),
                ("qlflow_lock_heads", "text[], boolean"),
            ):
                tx.execute(f"ALTER FUNCTION {name}({types}) RESET plan_cache_mode")
            tx.execute("UPDATE schema_versions SET version = 10 WHERE component = 'eventstore'")
        before = _function_settings(store)
    finally:
        store.close()
    store = open_store(pg_url, pool_max_size=2)  # migrates 10 -> 11
    try:
        migrated = _function_settings(store)
        positions = store.append([stream("run-s1", 0, event("planned-once"))])
    finally:
        store.close()
    assert all(generic in config for config in fresh.values()), fresh
    assert len(fresh) == 2
    assert not any(generic in config for config in before.values()), before
    assert migrated == fresh
    assert len(positions) == 1


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


def _primary_key_pages(store) -> tuple[str, int]:
    [(name, pages)] = store.query(
        "SELECT c.relname, pg_relation_size(c.oid) / current_setting('block_size')::int "
        "FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
        "WHERE i.indrelid = to_regclass('events') AND i.indisprimary"
    )
    return name, pages


def test_reclaim_rebuilds_a_primary_key_that_removals_left_sparse(pg_url):
    # positions only increase: a leaf page of removed positions is never refilled, and
    # one kept event on it keeps it (retention keeps a schedule's fires, its records)
    store = open_store(pg_url)
    try:
        events = 60_000
        store.append([stream(f"run-{n}", 0, event(f"e{n}")) for n in range(events)])
        name, full = _primary_key_pages(store)
        assert full >= SPARSE_MIN_PAGES
        assert store.reclaim() and _primary_key_pages(store) == (name, full)  # dense: kept
        with store.transaction() as tx:  # all but every 28th position, as a removed Run
            tx.execute("DELETE FROM events WHERE global_position % 28 <> 0")
        assert _primary_key_pages(store) == (name, full)  # VACUUM alone frees no leaf
        [(indexes,)] = store.query("SELECT pg_indexes_size(to_regclass('events'))")

        # a row another session's snapshot may still see keeps its entries (the suite's
        # other tests share the server), so the next reclaim makes the rebuild again
        deadline = time.monotonic() + 60
        while True:
            store.reclaim()
            _name, rebuilt = _primary_key_pages(store)
            if rebuilt * 10 < full or time.monotonic() > deadline:
                break
        assert rebuilt * 10 < full  # a 28th of the entries in about a 28th of the pages
        # the table's other indexes (event ids, stream ids), as sparse, are rebuilt too
        [(after,)] = store.query("SELECT pg_indexes_size(to_regclass('events'))")
        assert after * 10 < indexes
        # dense now: the next reclaim leaves every one of them as it is
        files = (
            "SELECT indexrelid::regclass::text, pg_relation_filenode(indexrelid) FROM pg_index"
            " WHERE indrelid = to_regclass('events') ORDER BY 1"
        )
        before = store.query(files)
        store.reclaim()
        assert store.query(files) == before
        kept = store.read_all()
        assert [r.global_position for r in kept] == list(range(28, events + 1, 28))
        store.append([stream("run-after", 0, event("after"))])  # the key still keys
        assert store.read_all(after_position=kept[-1].global_position)[0].event_id == "after"
    finally:
        store.close()


def test_an_index_is_sparse_under_half_its_fresh_pages_and_past_a_minimum_size():
    positions = FILLED_PAGE_BYTES / index_entry_bytes(8)  # a bigint key: 20 bytes an entry
    assert int(positions) == 366
    assert not sparse_index(SPARSE_MIN_PAGES - 1, 0, 8)  # small: never worth it
    assert sparse_index(1000, 1000 * positions / 2 - 1, 8)
    assert not sparse_index(1000, 1000 * positions / 2, 8)
    # a wider key fills a page with fewer entries: 37-byte event ids, 52 bytes each
    assert index_entry_bytes(37) == 52
    assert not sparse_index(1000, 1000 * FILLED_PAGE_BYTES / 52 / 2, 37)
    assert sparse_index(1000, 1000 * FILLED_PAGE_BYTES / 52 / 2 - 1, 37)
    # each index is judged on its own: the sparse one alone is rebuilt; one whose key
    # width is not known yet, or an invalid copy, never
    rows = 100_000.0
    facts = [
        ("events_pkey", 1000, rows, True, 8.0),  # 100 a page: sparse (366 fresh)
        ("events_event_id_key", 1000, rows, True, 37.0),  # 100 a page: dense (141)
        ("events_stream_key", 5000, rows, True, None),
        ("events_pkey_ccnew", 5000, rows, False, 8.0),
    ]
    assert sparse_indexes(facts) == ["events_pkey"]


# the append's lock of its heads (qlflow_append), as the function's kept plan sees it
_HEADS_FOR_UPDATE = (
    'SELECT 1 FROM streams h WHERE h.stream_id = ANY (%b) ORDER BY h.stream_id COLLATE "C" '
    "FOR UPDATE"
)


def test_a_table_of_a_few_hundred_rows_is_read_by_key_not_scanned(pg_url):
    # with the server's default price of a random page (4), a generic plan scans a
    # table of a few hundred rows for three keys, and keeps scanning as it grows until
    # the next ANALYZE; the store's sessions price cached pages (RANDOM_PAGE_COST)
    store = open_store(pg_url, pool_max_size=2)
    try:
        store.append([stream(f"run-h{n}", 0, event(f"h{n}")) for n in range(600)])
        with store.transaction() as tx:
            tx.execute("ANALYZE streams")
        [(price,)] = store.query("SELECT current_setting('random_page_cost')")
        plan = _generic_plan(store, _HEADS_FOR_UPDATE, "text[]", "'{run-h1,run-h2,run-h3}'")
    finally:
        store.close()
    assert float(price) <= RANDOM_PAGE_COST
    assert "Index" in plan and "Seq Scan on streams" not in plan, plan
