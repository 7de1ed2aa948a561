"""Reading the log: read_all, iter_all, prefixes, heads, durability across reopen."""

from __future__ import annotations

import pytest

from domain.errors import InvalidInput
from eventstore import open_store
from tests.eventstore.builders import event, stream


@pytest.fixture
def seven(store):
    """Seven events over three streams, in three calls."""
    store.append([stream("run-a", 0, event("a1"), event("a2"), event("a3"))])
    store.append([stream("run-b", 0, event("b1")), stream("steps-a", 0, event("s1"))])
    store.append([stream("run-a", 3, event("a4"), event("a5"))])
    return store.read_all()


def test_read_all_is_in_position_order(store, seven):
    assert [r.event_id for r in seven] == ["a1", "a2", "a3", "b1", "s1", "a4", "a5"]
    positions = [r.global_position for r in seven]
    assert positions == sorted(positions) and len(set(positions)) == 7


@pytest.mark.parametrize(("skip", "limit"), [(0, None), (0, 3), (2, 2), (5, 10), (7, 5), (3, 0)])
def test_read_all_after_position_and_limit(store, seven, skip, limit):
    after = seven[skip - 1].global_position if skip else 0
    expected = seven[skip:] if limit is None else seven[skip : skip + limit]

    assert store.read_all(after_position=after, limit=limit) == expected


def test_read_all_refuses_a_negative_limit(store, seven):
    with pytest.raises(InvalidInput) as caught:
        store.read_all(limit=-1)
    assert caught.value.field == "limit"


@pytest.mark.parametrize("batch", [1, 2, 3, 7, 5000])
def test_iter_all_yields_the_same_as_read_all(store, seven, batch):
    assert list(store.iter_all(batch=batch)) == seven
    assert list(store.iter_all(after_position=seven[3].global_position, batch=batch)) == seven[4:]


def test_iter_all_holds_nothing_between_batches(store, seven):
    records = store.iter_all(batch=2)
    first = next(records)
    store.append([stream("run-c", 0, event("c1"))])  # would block or fail if a batch held on

    assert [first, *records][-1].event_id == "c1"


def test_iter_all_refuses_a_bad_batch(store):
    with pytest.raises(InvalidInput):
        list(store.iter_all(batch=0))


def test_streams_with_prefix_is_exact_and_sorted(store):
    ids = ["run-b", "run-a", "run-a-x", "schedule-x", "steps-a", "steps-b-1", "lease-r"]
    for stream_id in ids:
        store.append([stream(stream_id, 0, event(f"e-{stream_id}"))])

    assert store.streams_with_prefix("run-") == ["run-a", "run-a-x", "run-b"]
    assert store.streams_with_prefix("run-a") == ["run-a", "run-a-x"]
    assert store.streams_with_prefix("s") == ["schedule-x", "steps-a", "steps-b-1"]
    assert store.streams_with_prefix("zzz") == []
    assert store.streams_with_prefix("") == sorted(ids)


def test_empty_store(store):
    assert store.read_all() == []
    assert list(store.iter_all()) == []
    assert store.head_position() == 0
    assert store.read_stream("run-a") == []
    assert store.stream_versions([]) == {}


def test_reopening_keeps_everything(store_url):
    first = open_store(store_url)
    try:
        first.append([stream("run-a", 0, event("a1", x=1.5), event("a2"))])
        first.append([stream("run-b", 0, event("b1"))])
        before = first.read_all()
    finally:
        first.close()

    again = open_store(store_url)
    try:
        assert again.read_all() == before
        assert again.stream_versions(["run-a", "run-b"]) == {"run-a": 2, "run-b": 1}
        [next_record] = again.append([stream("run-a", 2, event("a3"))])
        assert next_record.global_position > before[-1].global_position
    finally:
        again.close()


def test_query_runs_read_only_sql_with_question_marks(store, seven):
    rows = store.query(
        "SELECT event_id FROM events WHERE stream_id = ? AND stream_version > ? "
        "ORDER BY stream_version",
        ("run-a", 3),
    )
    assert rows == [("a4",), ("a5",)]


def test_read_streams_reads_several_streams_at_once(store, seven):
    streams = store.read_streams(["steps-a", "run-a", "run-missing", "run-b"])

    assert list(streams) == ["steps-a", "run-a", "run-missing", "run-b"]
    for stream_id, records in streams.items():
        assert records == store.read_stream(stream_id)
    assert [r.event_id for r in streams["run-a"]] == ["a1", "a2", "a3", "a4", "a5"]
    assert streams["run-missing"] == []
    assert store.read_streams([]) == {}


def test_read_streams_in_a_transaction_sees_its_own_writes(store, seven):
    with store.transaction() as tx:
        tx.append([stream("run-b", 1, event("b2"))])
        streams = tx.read_streams(["run-b", "run-a"])

    assert [r.event_id for r in streams["run-b"]] == ["b1", "b2"]
    assert len(streams["run-a"]) == 5


def test_a_session_reads_committed_state(store, seven):
    with store.session() as session:
        assert [r.event_id for r in session.read_stream("run-b")] == ["b1"]
        assert session.stream_versions(["run-a", "run-x"]) == {"run-a": 5, "run-x": 0}


def test_read_streams_after_reads_each_stream_past_its_version(store, seven):
    streams = store.read_streams_after({"run-a": 3, "steps-a": 0, "run-b": 1, "run-missing": 0})

    assert [r.event_id for r in streams["run-a"]] == ["a4", "a5"]
    assert [r.stream_version for r in streams["run-a"]] == [4, 5]
    assert streams["steps-a"] == store.read_stream("steps-a")
    assert streams["run-b"] == [] and streams["run-missing"] == []
    assert store.read_streams_after({}) == {}
    with store.transaction() as tx:
        tx.append([stream("run-b", 1, event("b2"))])
        assert [r.event_id for r in tx.read_streams_after({"run-b": 1})["run-b"]] == ["b2"]
