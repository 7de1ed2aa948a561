"""The append contract (SPEC §2) on both dialects: CAS, exact replay, idempotency."""

from __future__ import annotations

import pytest

from domain.errors import IdempotencyConflict, VersionConflict
from domain.records import NewEvent, Record
from tests.eventstore.builders import event, snapshot, stream


def test_append_assigns_versions_and_positions_and_reads_back(store):
    records = store.append(
        [stream("run-a", 0, event("e1", n=1, ratio=0.25), event("e2", n=2), event("e3", n=3))]
    )

    assert [(r.event_id, r.stream_version) for r in records] == [("e1", 1), ("e2", 2), ("e3", 3)]
    positions = [r.global_position for r in records]
    assert positions == sorted(positions) and len(set(positions)) == 3
    assert records[0].data == {"n": 1, "ratio": 0.25}
    assert records[0].metadata == {"actor": "test", "at_ms": 1}
    assert store.read_stream("run-a") == records
    assert store.read_stream("run-a", after_version=2) == records[2:]
    assert store.stream_versions(["run-a", "run-missing"]) == {"run-a": 3, "run-missing": 0}
    assert store.head_position() == positions[-1]


def test_append_continues_a_stream_at_its_head(store):
    first = store.append([stream("run-a", 0, event("e1"))])
    second = store.append([stream("run-a", 1, event("e2"), event("e3"))])

    assert [r.stream_version for r in second] == [2, 3]
    assert second[0].global_position > first[0].global_position
    assert store.read_stream("run-a") == first + second


def test_multi_stream_append_is_one_call_in_call_order(store):
    records = store.append(
        [stream("steps-r", 0, event("m1")), stream("run-r", 0, event("e1"), event("e2"))]
    )

    assert [(r.stream_id, r.stream_version) for r in records] == [
        ("steps-r", 1),
        ("run-r", 1),
        ("run-r", 2),
    ]
    assert [r.global_position for r in records] == sorted(r.global_position for r in records)
    assert store.read_all() == records


@pytest.mark.parametrize(("expected", "actual_events"), [(0, 2), (1, 2), (3, 2), (5, 0)], ids=str)
def test_version_mismatch_raises_and_writes_nothing(store, expected, actual_events):
    if actual_events:
        store.append([stream("run-a", 0, *(event(f"e{i}") for i in range(actual_events)))])
    before = snapshot(store)

    with pytest.raises(VersionConflict) as caught:
        store.append([stream("run-a", expected, event("new-1"), event("new-2"))])

    assert (caught.value.stream_id, caught.value.expected, caught.value.actual) == (
        "run-a",
        expected,
        actual_events,
    )
    assert snapshot(store) == before


@pytest.mark.parametrize("conflicting_first", [True, False], ids=["conflict-first", "ok-first"])
def test_one_conflicting_stream_leaves_every_stream_of_the_call_untouched(store, conflicting_first):
    store.append([stream("run-b", 0, event("b1"))])
    before = snapshot(store)
    ok = stream("run-a", 0, event("a1"))  # would succeed alone
    bad = stream("run-b", 0, event("b2"))  # run-b is at 1
    appends = [bad, ok] if conflicting_first else [ok, bad]

    with pytest.raises(VersionConflict) as caught:
        store.append(appends)

    assert caught.value.stream_id == "run-b"
    assert snapshot(store) == before
    assert store.stream_versions(["run-a"]) == {"run-a": 0}
    assert store.read_stream("run-a") == []


def test_exact_replay_returns_the_original_records_and_writes_nothing(store):
    appends = [
        stream("run-a", 0, event("e1", x=1), event("e2", x=2)),
        stream("steps-a", 0, event("m1", y=[1, 2])),
    ]
    original = store.append(appends)
    store.append([stream("run-a", 2, event("e3"))])  # the stream moved on since
    before = snapshot(store)

    replayed = store.append(appends)

    assert replayed == original
    assert snapshot(store) == before


def test_replaying_a_leading_part_of_a_call_is_an_exact_replay_too(store):
    original = store.append([stream("run-a", 0, event("e1", x=1), event("e2", x=2))])
    before = snapshot(store)

    # every id of this call is stored, identical, at the same place
    assert store.append([stream("run-a", 0, event("e1", x=1))]) == original[:1]
    assert snapshot(store) == before


def test_replay_compares_content_not_key_order(store):
    data = {"b": 1, "a": {"d": 2, "c": 3}}
    reordered = {"a": {"c": 3, "d": 2}, "b": 1}
    original = store.append([stream("run-a", 0, NewEvent("e1", "t", data, {"z": 1, "y": 2}))])

    replayed = store.append([stream("run-a", 0, NewEvent("e1", "t", reordered, {"y": 2, "z": 1}))])

    assert replayed == original


@pytest.mark.parametrize(
    ("retry", "reason"),
    [
        ([stream("run-a", 0, event("e1", x=999), event("e2", x=2))], "different content"),
        ([stream("run-a", 0, event("e1", "other.type", x=1), event("e2", x=2))], "type"),
        (
            [
                stream(
                    "run-a",
                    0,
                    NewEvent("e1", "thing.happened", {"x": 1}, {"actor": "b"}),
                    event("e2", x=2),
                )
            ],
            "metadata",
        ),
        ([stream("run-other", 0, event("e1", x=1), event("e2", x=2))], "same id, other stream"),
        ([stream("run-a", 0, event("e2", x=2), event("e1", x=1))], "same ids, swapped versions"),
        ([stream("run-a", 0, event("e1", x=1), event("e2", x=2), event("e9"))], "partial"),
        ([stream("run-new", 0, event("fresh"), event("e2", x=2))], "partial, CAS would pass"),
        ([stream("run-a", 2, event("e1", x=1))], "CAS would pass at the head"),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_ids_stored_with_other_content_or_place_conflict_and_write_nothing(store, retry, reason):
    store.append([stream("run-a", 0, event("e1", x=1), event("e2", x=2))])
    before = snapshot(store)

    with pytest.raises(IdempotencyConflict) as caught:
        store.append(retry)

    assert caught.value.event_id in {e.event_id for a in retry for e in a.events}
    assert snapshot(store) == before


def test_idempotency_is_judged_before_versions(store):
    store.append([stream("run-a", 0, event("e1", x=1))])

    # e1 differs and run-a is not at 0 either: the id rule wins
    with pytest.raises(IdempotencyConflict):
        store.append([stream("run-a", 0, event("e1", x=2))])


def test_a_replay_inside_a_transaction_keeps_it_usable(store):
    original = store.append([stream("run-a", 0, event("e1"))])

    with store.transaction() as tx:
        assert tx.append([stream("run-a", 0, event("e1"))]) == original
        tx.append([stream("run-a", 1, event("e2"))])

    assert [r.event_id for r in store.read_stream("run-a")] == ["e1", "e2"]


def test_records_are_plain_json_values(store):
    data = {"floats": [0.1, -2.5e-8], "nested": {"list": [1, "two", None, True]}, "big": 2**62}
    [record] = store.append([stream("run-a", 0, NewEvent("e1", "t", data))])

    assert isinstance(record, Record)
    assert record.data == data
    assert record.metadata == {}
    assert store.read_stream("run-a")[0].data == data
