"""Step logs in the store, on both stores: chunks in order, the cap keeps the head and
the tail exactly (the marker says how much was dropped), bad input writes nothing,
prune deletes whole old logs and never an event."""

from __future__ import annotations

import itertools
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from domain.errors import InvalidInput
from eventstore import logs, open_store
from tests.eventstore.builders import event, stream
from tests.hypothesis_budget import examples

CAP = 64


def append(store, attempt_id, pieces, cap=CAP):
    with store.transaction() as tx:
        return logs.append(tx, attempt_id, pieces, cap)


def output_of(store, attempt_id) -> bytes:
    return b"".join(c.data for c in logs.chunks(store, attempt_id) if c.stream != logs.DROPPED)


def test_the_log_component_is_migrated_with_the_store(store):
    assert store.query(
        "SELECT version FROM schema_versions WHERE component = ?", (logs.COMPONENT,)
    ) == [(len(logs.MIGRATIONS),)]


def test_chunks_come_back_in_order_with_their_streams_and_times(store):
    append(store, "wta:1", [("stdout", 10, b"hello\n"), ("stderr", 11, b"oops\n")], cap=1024)
    state = append(store, "wta:1", [("stdout", 12, b"bye\n")], cap=1024)

    found = logs.chunks(store, "wta:1")
    assert [(c.seq, c.at_ms, c.stream, c.data) for c in found] == [
        (1, 10, "stdout", b"hello\n"),
        (2, 11, "stderr", b"oops\n"),
        (3, 12, "stdout", b"bye\n"),
    ]
    assert (state.next_seq, state.stored_bytes, state.dropped_bytes) == (4, 15, 0)
    assert (state.first_at_ms, state.last_at_ms) == (10, 12)
    assert [c.seq for c in logs.chunks(store, "wta:1", after_seq=2)] == [3]
    assert logs.chunks(store, "wta:other") == []
    assert logs.state(store, "wta:other") is None


def test_the_cap_keeps_head_and_tail_and_marks_the_drop(store):
    data = bytes(range(48, 48 + 70)) * 3  # 210 bytes, cap 64: head 32, tail 32
    for start in range(0, len(data), 7):
        append(store, "wta:big", [("stdout", start, data[start : start + 7])])

    state = logs.state(store, "wta:big")
    assert output_of(store, "wta:big") == data[:32] + data[-32:]
    assert (state.head_bytes, state.tail_bytes, state.dropped_bytes) == (32, 32, 210 - 64)
    marker = [c for c in logs.chunks(store, "wta:big") if c.stream == logs.DROPPED]
    assert len(marker) == 1
    assert b"146 bytes of output dropped" in marker[0].data
    order = [c.stream == logs.DROPPED for c in logs.chunks(store, "wta:big")]
    assert order.index(True) > 0 and order.index(True) < len(order) - 1  # between head, tail


def test_one_append_larger_than_the_cap(store):
    data = b"".join(b"%04d\n" % i for i in range(1000))
    append(store, "wta:huge", [("stderr", 5, data)])
    assert output_of(store, "wta:huge") == data[:32] + data[-32:]


@pytest.mark.parametrize(
    "pieces",
    [
        [("stdin", 1, b"x")],
        [("stdout", 1, "text, not bytes")],
        [("stdout", -1, b"x")],
        [("stdout", 1)],
        "stdout",
    ],
)
def test_bad_input_writes_nothing(store, pieces):
    append(store, "wta:ok", [("stdout", 1, b"kept")])
    with pytest.raises(InvalidInput):
        append(
            store,
            "wta:ok",
            [("stdout", 2, b"more"), *pieces] if isinstance(pieces, list) else pieces,
        )
    with pytest.raises(InvalidInput):
        append(store, "", [("stdout", 1, b"x")])
    assert output_of(store, "wta:ok") == b"kept"


def test_prune_deletes_whole_old_logs_and_no_event(store):
    store.append([stream("run-r1", 0, event("e-1"))])
    append(store, "wta:old", [("stdout", 100, b"a" * 50), ("stdout", 200, b"b" * 50)], cap=1024)
    append(store, "wta:new", [("stdout", 100, b"c"), ("stdout", 900, b"d")], cap=1024)

    with store.transaction() as tx:
        pruned = logs.prune(tx, 500)

    assert (pruned.attempts, pruned.chunks, pruned.bytes) == (1, 2, 100)
    assert logs.chunks(store, "wta:old") == [] and logs.state(store, "wta:old") is None
    assert output_of(store, "wta:new") == b"cd"
    assert len(store.read_stream("run-r1")) == 1


def test_last_chunks_and_iteration(store):
    for i in range(10):
        append(store, "wta:a", [("stdout", i, b"line %d\n" % i)], cap=4096)
    append(store, "wta:b", [("stdout", 1, b"b\n")], cap=4096)

    last = logs.last_chunks(store, "wta:a", 14)
    assert b"".join(c.data for c in last) == b"line 8\nline 9\n"
    every = list(logs.iter_chunks(store, batch=3))
    assert [(c.attempt_id, c.seq) for c in every] == [("wta:a", i) for i in range(1, 11)] + [
        ("wta:b", 1)
    ]


# --- the cap as a property (SQLite: one store, a fresh Attempt per example) ----------

_counter = itertools.count()


@pytest.fixture(scope="module")
def sqlite_store(tmp_path_factory):
    store = open_store(f"sqlite:///{tmp_path_factory.mktemp('logs') / 'logs.db'}")
    yield store
    store.close()


@settings(
    max_examples=examples(60),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    cap=st.integers(2, 200),
    appends=st.lists(
        st.lists(
            st.tuples(st.sampled_from(logs.WRITTEN_STREAMS), st.binary(max_size=90)),
            max_size=4,
        ),
        max_size=12,
    ),
)
def test_a_capped_log_is_its_first_and_last_bytes(sqlite_store, cap, appends):
    attempt_id = f"wta:{next(_counter)}-{uuid.uuid4().hex[:6]}"
    written = b""
    for number, pieces in enumerate(appends):
        append(sqlite_store, attempt_id, [(s, number, d) for s, d in pieces], cap=cap)
        written += b"".join(d for _s, d in pieces)

    head, tail = cap // 2, cap - cap // 2
    kept = written if len(written) <= cap else written[:head] + written[len(written) - tail :]
    assert output_of(sqlite_store, attempt_id) == kept
    state = logs.state(sqlite_store, attempt_id)
    if written:
        assert state.written_bytes == len(written)
        assert state.dropped_bytes == max(0, len(written) - cap)
        stored = sum(len(c.data) for c in logs.chunks(sqlite_store, attempt_id))
        assert stored - len(logs.marker_text(state.dropped_bytes, head, tail)) <= cap


def test_bytes_the_writer_left_out_are_counted_in_the_marker(store):
    append(store, "wta:lo", [("stdout", 1, b"a" * 40)])
    with store.transaction() as tx:
        state = logs.append(tx, "wta:lo", [("stdout", 2, b"b" * 40)], CAP, left_out=1000)

    # 80 written and 1,000 never sent: all but the 64 kept are missing, and the marker says so
    assert state.stored_bytes + state.dropped_bytes == 80 + 1000
    [marker] = [c for c in logs.chunks(store, "wta:lo") if c.stream == logs.DROPPED]
    assert b"1016 bytes of output dropped" in marker.data


def test_left_out_bytes_alone_still_get_a_marker(store):
    append(store, "wta:lo2", [("stdout", 1, b"x" * 10)])
    with store.transaction() as tx:
        state = logs.append(tx, "wta:lo2", [], CAP, left_out=7)
    assert state.dropped_bytes == 7
    [marker] = [c for c in logs.chunks(store, "wta:lo2") if c.stream == logs.DROPPED]
    assert b"7 bytes of output dropped" in marker.data
