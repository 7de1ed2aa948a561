"""Bad input raises InvalidInput naming the field and the rule, and writes nothing."""

from __future__ import annotations

import pytest

from domain.errors import InvalidInput
from domain.records import NewEvent, StreamAppend
from eventstore import open_store
from tests.eventstore.builders import event, snapshot, stream

OK = event("ok-1")

CASES = {
    "event id with a space": ([stream("run-a", 0, event("bad id"))], "event_id", "format"),
    "event id of 37 characters": ([stream("run-a", 0, event("e" * 37))], "event_id", "format"),
    "empty event id": ([stream("run-a", 0, event(""))], "event_id", "format"),
    "event id not a string": (
        [stream("run-a", 0, NewEvent(17, "t", {}))],  # type: ignore[arg-type]
        "event_id",
        "format",
    ),
    "data is a list": ([stream("run-a", 0, NewEvent("e1", "t", [1, 2]))], "data", "object"),
    "data is a string": ([stream("run-a", 0, NewEvent("e1", "t", "{}"))], "data", "object"),
    "data is None": ([stream("run-a", 0, NewEvent("e1", "t", None))], "data", "object"),
    "data holds a set": ([stream("run-a", 0, NewEvent("e1", "t", {"s": {1}}))], "data", "json"),
    "data has a non-string key": (
        [stream("run-a", 0, NewEvent("e1", "t", {1: "x"}))],
        "data",
        "json",
    ),
    "metadata is a list": (
        [stream("run-a", 0, NewEvent("e1", "t", {}, []))],  # type: ignore[arg-type]
        "metadata",
        "object",
    ),
    "record over 256 KiB": (
        [stream("run-a", 0, OK, NewEvent("e1", "t", {"blob": "x" * (256 * 1024)}))],
        "record",
        "max_size",
    ),
    "negative expected version": ([stream("run-a", -1, OK)], "expected_version", "non_negative"),
    "bool expected version": ([stream("run-a", True, OK)], "expected_version", "non_negative"),
    "duplicate event id in one stream": (
        [stream("run-a", 0, event("e1"), event("e1"))],
        "event_id",
        "unique_in_call",
    ),
    "duplicate event id across streams": (
        [stream("run-a", 0, event("e1")), stream("run-b", 0, event("e1"))],
        "event_id",
        "unique_in_call",
    ),
    "same stream twice": (
        [stream("run-a", 0, event("e1")), stream("run-a", 1, event("e2"))],
        "stream_id",
        "unique_in_call",
    ),
    "empty call": ([], "appends", "non_empty"),
    "not a sequence of appends": (stream("run-a", 0, OK), "appends", "sequence"),
    "not a StreamAppend": ([("run-a", 0, (OK,))], "appends", "type"),
    "stream without events": ([stream("run-a", 0)], "events", "non_empty"),
    "event not a NewEvent": ([StreamAppend("run-a", 0, ({"event_id": "x"},))], "events", "type"),
    "empty stream id": ([stream("", 0, OK)], "stream_id", "format"),
    "stream id of 201 characters": ([stream("s" * 201, 0, OK)], "stream_id", "format"),
    "stream id with a space": ([stream("run a", 0, OK)], "stream_id", "format"),
    "empty type": ([stream("run-a", 0, NewEvent("e1", "", {}))], "type", "format"),
    "a bare run- stream": ([stream("run-", 0, OK)], "stream_id", "category"),
    "a stream of no known category": ([stream("thing-a", 0, OK)], "stream_id", "category"),
    "a stream without a category": ([stream("runa", 0, OK)], "stream_id", "category"),
    "step.created missing what its fold needs": (
        [stream("run-a", 0, NewEvent("e1", "step.created", {}))],
        "data",
        "shape",
    ),
    "a known type on another category's stream": (
        [
            stream(
                "steps-a",
                0,
                NewEvent(
                    "e1", "workflow.cancel_requested", {"reason": "user", "requested_at_ms": 1}
                ),
            )
        ],
        "data",
        "shape",
    ),
    "a lease granted for another Attempt": (
        [
            stream(
                "lease-a",
                0,
                NewEvent(
                    "e1",
                    "lease.granted",
                    {
                        "lease_id": "l",
                        "attempt_id": "b",
                        "worker_id": "w",
                        "granted_at_ms": 1,
                        "ttl_ms": 1,
                        "expires_at_ms": 2,
                    },
                ),
            )
        ],
        "data",
        "shape",
    ),
    "a plan for another Run": (
        [
            stream(
                "run-a",
                0,
                NewEvent(
                    "e1",
                    "workflow.admitted",
                    {"plan": {"run_id": "b"}, "admission_key": "k", "admitted_at_ms": 1},
                ),
            )
        ],
        "data",
        "shape",
    ),
    "type of 101 characters": (
        [stream("run-a", 0, NewEvent("e1", "t" * 101, {}))],
        "type",
        "format",
    ),
}


@pytest.mark.parametrize(("appends", "field", "rule"), CASES.values(), ids=CASES.keys())
def test_bad_append_names_field_and_rule_and_writes_nothing(store, appends, field, rule):
    store.append([stream("run-seed", 0, event("seed-1"))])
    before = snapshot(store)

    with pytest.raises(InvalidInput) as caught:
        store.append(appends)

    assert (caught.value.field, caught.value.rule) == (field, rule)
    assert str(caught.value)  # says what was wrong
    assert snapshot(store) == before


def test_bad_input_inside_a_transaction_leaves_it_usable(store):
    with store.transaction() as tx:
        with pytest.raises(InvalidInput):
            tx.append([stream("run-a", 0, event("bad id"))])
        tx.append([stream("run-a", 0, event("good"))])

    assert [r.event_id for r in store.read_all()] == ["good"]


def test_largest_record_under_the_limit_is_accepted(store):
    overhead = len('{"blob":""}') + len("{}")
    data = {"blob": "x" * (256 * 1024 - overhead)}

    [record] = store.append([stream("run-a", 0, NewEvent("e1", "t", data))])

    assert record.data == data


def test_mappings_other_than_dict_are_accepted(store):
    from types import MappingProxyType

    [record] = store.append([stream("run-a", 0, NewEvent("e1", "t", MappingProxyType({"a": 1})))])

    assert record.data == {"a": 1}


@pytest.mark.parametrize(
    ("url", "rule"),
    [
        ("mysql://root@localhost/db", "scheme"),
        ("qlflow.db", "format"),
        ("sqlite://host/qlflow.db", "format"),
        ("sqlite:///", "path"),
        ("sqlite:///:memory:", "path"),
        ("sqlite:////no/such/directory/qlflow.db", "path"),
        ("sqlite:///qlflow.db?journal=off", "option"),
    ],
)
def test_bad_url_is_refused(url, rule):
    with pytest.raises(InvalidInput) as caught:
        open_store(url)

    assert (caught.value.field, caught.value.rule) == ("url", rule)


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"synchronous": "SOMETIMES"}, "synchronous"),
        ({"busy_timeout_ms": 0}, "busy_timeout_ms"),
        ({"pool_max_size": 3}, "options"),
    ],
)
def test_bad_sqlite_option_is_refused(tmp_path, options, field):
    with pytest.raises(InvalidInput) as caught:
        open_store(f"sqlite:///{tmp_path}/q.db", **options)

    assert caught.value.field == field
    assert not (tmp_path / "q.db").exists()
