"""Byte-stable payload encoding: what exact replay compares."""

from __future__ import annotations

from enum import StrEnum

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from domain.records import NewEvent, StreamAppend
from eventstore import open_store
from eventstore.validation import encode_appends
from tests.hypothesis_budget import examples

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
json_objects = st.dictionaries(st.text(max_size=8), json_values, max_size=6)


def encoded_data(data) -> str:
    batch = encode_appends([StreamAppend("run-a", 0, (NewEvent("e1", "t", data),))])
    return batch.events[0].data


def reversed_keys(value):
    if isinstance(value, dict):
        return {key: reversed_keys(value[key]) for key in reversed(list(value))}
    if isinstance(value, list):
        return [reversed_keys(item) for item in value]
    return value


@settings(max_examples=examples(100), deadline=None)
@given(json_objects)
def test_encoding_round_trips_and_ignores_key_order(data):
    text = encoded_data(data)

    assert orjson.loads(text) == data
    assert encoded_data(reversed_keys(data)) == text


def test_encoding_is_sorted_compact_orjson():
    assert encoded_data({"b": [1.5, None], "a": {"z": True, "y": "é"}}) == (
        '{"a":{"y":"é","z":true},"b":[1.5,null]}'
    )


class _Kind(StrEnum):
    DONE = "job.done"


def test_a_type_named_by_a_str_enum_is_stored_as_its_plain_text(tmp_path):
    # the domain names types with StrEnum members; the appended record carries the
    # plain str a replay of the log reads back, not the member
    event = NewEvent("e1", _Kind.DONE, {"n": 1})
    [encoded] = encode_appends([StreamAppend("run-a", 0, (event,))]).events
    assert type(encoded.type) is str and encoded.type == "job.done"

    store = open_store(f"sqlite:///{tmp_path / 'kinds.db'}")
    try:
        [appended] = store.append([StreamAppend("run-a", 0, (event,))])
        [read] = store.read_stream("run-a")
    finally:
        store.close()
    assert type(appended.type) is str
    assert appended == read
