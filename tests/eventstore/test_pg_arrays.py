"""The store's arrays in PostgreSQL's binary format come back as they went."""

from __future__ import annotations

import psycopg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eventstore import pg_arrays
from tests.hypothesis_budget import examples

pytestmark = pytest.mark.pg

TEXT = st.text(st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)))
INT8 = st.integers(-(2**63), 2**63 - 1)
INT4 = st.integers(-(2**31), 2**31 - 1)
CASES = {
    "text[]": (pg_arrays.TextArray, TEXT),
    "bigint[]": (pg_arrays.Int8Array, INT8),
    "integer[]": (pg_arrays.Int4Array, INT4),
    "boolean[]": (pg_arrays.BoolArray, st.booleans()),
    "bytea[]": (pg_arrays.ByteaArray, st.binary()),
}


@pytest.fixture(scope="module")
def conn(pg_server_url):
    with psycopg.connect(pg_server_url, autocommit=True) as connection:
        pg_arrays.register(connection)
        yield connection


@pytest.mark.parametrize("sql_type", sorted(CASES))
def test_an_array_comes_back_as_it_went_nulls_and_empty_included(conn, sql_type):
    kind, values = CASES[sql_type]

    @settings(max_examples=examples(60), deadline=None)
    @given(st.lists(st.one_of(st.none(), values), max_size=12))
    def round_trip(items):
        [(back,)] = conn.execute(f"SELECT %b::{sql_type}", (kind(items),)).fetchall()
        assert back == items
        # and as psycopg's own list dumper sends it: the same array on the server
        [(same,)] = conn.execute(
            f"SELECT %b::{sql_type} IS NOT DISTINCT FROM %b::{sql_type}", (kind(items), items)
        ).fetchall()
        assert same or not items  # psycopg sends an empty list untyped

    round_trip()


def test_an_element_of_another_type_is_a_data_error_naming_the_array(conn):
    with pytest.raises(psycopg.DataError, match="Int8Array: an element is not"):
        conn.execute("SELECT %b::bigint[]", (pg_arrays.Int8Array([1, "2"]),))
    with pytest.raises(psycopg.DataError, match="TextArray"):
        conn.execute("SELECT %b::text[]", (pg_arrays.TextArray(["a", 3]),))


def test_a_column_type_without_an_array_class_keeps_the_list():
    values = [["a"], ["b"]]
    assert pg_arrays.column_array("text[]", values) is values
    assert isinstance(pg_arrays.column_array("bigint", [1]), pg_arrays.Int8Array)


def test_rows_sent_as_json_come_back_as_they_went(conn):
    """The upsert's JSON rows: each value of a text, bigint, integer or boolean
    column (NULL included) comes back exactly through `->>` and its cast."""
    columns = [("text", TEXT), ("bigint", INT8), ("integer", INT4), ("boolean", st.booleans())]
    assert {kind for kind, _ in columns} == pg_arrays.JSON_COLUMN_TYPES
    picks = ", ".join(f"(r->>{i})::{kind}" for i, (kind, _) in enumerate(columns))
    row = st.tuples(*(st.one_of(st.none(), values) for _, values in columns))

    @settings(max_examples=examples(60), deadline=None)
    @given(st.lists(row, max_size=6))
    def round_trip(rows):
        back = conn.execute(
            f"SELECT {picks} FROM jsonb_array_elements(%b::jsonb) WITH ORDINALITY AS e(r, o) "
            "ORDER BY o",
            (pg_arrays.JsonRows(rows),),
        ).fetchall()
        assert back == rows

    round_trip()
