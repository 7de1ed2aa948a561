"""Transaction.upsert: rows replace the rows with their key, new rows are inserted,
and rows given with their stored values end as given, on both stores."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eventstore import InvalidInput, open_store
from tests.hypothesis_budget import examples

ITEMS = {
    "sqlite": "CREATE TABLE items (item_id TEXT PRIMARY KEY, state TEXT, n INTEGER, note TEXT)",
    "postgresql": (
        "CREATE TABLE items (item_id TEXT PRIMARY KEY, state TEXT, n BIGINT, note TEXT)"
    ),
}
INDEX = {dialect: "CREATE INDEX items_state ON items (state, n)" for dialect in ITEMS}
OTHERS = {dialect: "CREATE TABLE others (other_id TEXT PRIMARY KEY, n BIGINT)" for dialect in ITEMS}
COLUMNS = ("item_id", "state", "n", "note")
KEYS = st.sampled_from([f"i{k}" for k in range(6)])
VALUES = st.tuples(
    st.sampled_from(["new", "run", "done", None]),
    st.one_of(st.none(), st.integers(-(2**40), 2**40)),
    # text a store can hold: no NUL (PostgreSQL), no lone surrogate (not UTF-8)
    st.one_of(
        st.none(),
        st.text(
            st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)), max_size=8
        ),
    ),
)


@pytest.fixture
def items_store(store):
    store.migrate("test-items", [ITEMS, INDEX, OTHERS])
    return store


def _table(store) -> dict:
    found = store.query(f"SELECT {', '.join(COLUMNS)} FROM items")
    return {row[0]: tuple(row[1:]) for row in found}


def test_upserted_rows_end_as_given_whether_new_or_read_before(items_store):
    @settings(max_examples=examples(40), deadline=None)
    @given(
        st.dictionaries(KEYS, VALUES, max_size=6),
        st.dictionaries(KEYS, VALUES, max_size=6),
        st.booleans(),
    )
    def upsert(before, after, with_stored):
        with items_store.transaction() as tx:
            tx.execute("DELETE FROM items")
            for key, values in before.items():
                tx.execute("INSERT INTO items VALUES (?, ?, ?, ?)", (key, *values))
        with items_store.transaction() as tx:
            stored = {row[0]: tuple(row) for row in tx.query("SELECT * FROM items")}
            rows = [(key, *after[key]) for key in sorted(after)]
            tx.upsert(
                "items",
                COLUMNS,
                ("item_id",),
                rows,
                stored=[stored.get(row[0]) for row in rows] if with_stored else None,
            )
        assert _table(items_store) == {**before, **after}

    upsert()


def test_stored_values_that_do_not_match_the_rows_are_refused_and_write_nothing(items_store):
    with pytest.raises(InvalidInput, match="stored"), items_store.transaction() as tx:
        tx.upsert("items", COLUMNS, ("item_id",), [("a", "new", 1, None)], stored=[])
    assert _table(items_store) == {}


def test_on_sqlite_a_row_read_before_is_written_in_the_columns_that_differ(sqlite_url):
    """The cheap path is taken: a column whose value did not change is not written
    (shown by telling the store a stale value for `note` it then leaves alone)."""
    items_store = open_store(sqlite_url)
    items_store.migrate("test-items", [ITEMS, INDEX])
    with items_store.transaction() as tx:
        tx.execute("INSERT INTO items VALUES ('a', 'new', 1, 'kept')")
    with items_store.transaction() as tx:
        tx.upsert(
            "items",
            COLUMNS,
            ("item_id",),
            [("a", "run", 2, "stale")],
            stored=[("a", "new", 1, "stale")],
        )
    assert _table(items_store) == {"a": ("run", 2, "kept")}
    items_store.close()


# one write of a transaction: an upsert of `items` or `others` (key, n), or an UPDATE
# of an `items` row (key, n)
WRITES = st.lists(
    st.tuples(st.sampled_from(["items", "others", "update"]), KEYS, st.integers(0, 99)),
    max_size=12,
)


def test_writes_of_one_transaction_end_as_made_one_after_another(items_store):
    """Upserts of several tables, of one table several times (one row among them), and
    statements between them, all in one transaction: each sees the rows of the writes
    before it (a store may send several as one statement, never in a way that changes
    what they write)."""

    @settings(max_examples=examples(40), deadline=None)
    @given(WRITES)
    def write(writes):
        with items_store.transaction() as tx:
            tx.execute("DELETE FROM items")
            tx.execute("DELETE FROM others")
        expected: dict[str, dict] = {"items": {}, "others": {}}
        with items_store.transaction() as tx:
            for kind, key, n in writes:
                if kind == "update":
                    tx.execute("UPDATE items SET note = ? WHERE item_id = ?", (f"u{n}", key))
                    if key in expected["items"]:
                        expected["items"][key] = (*expected["items"][key][:2], f"u{n}")
                elif kind == "items":
                    tx.upsert("items", COLUMNS, ("item_id",), [(key, "run", n, None)])
                    expected["items"][key] = ("run", n, None)
                else:
                    tx.upsert("others", ("other_id", "n"), ("other_id",), [(key, n)])
                    expected["others"][key] = n
        assert _table(items_store) == expected["items"]
        others = items_store.query("SELECT other_id, n FROM others")
        assert dict(others) == expected["others"]

    write()
