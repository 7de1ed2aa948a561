"""Canonical JSON (RFC 8785 style) and domain-separated digests."""

from __future__ import annotations

import hashlib
import json
import math
import random
from types import MappingProxyType

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from domain.canonical import canonical_bytes, domain_digest, is_digest
from domain.errors import PlanError
from tests.hypothesis_budget import examples

QUICK = settings(max_examples=examples(100), deadline=None)

# JSON values canonical JSON accepts: no floats, integers in the I-JSON range.
safe_ints = st.integers(min_value=-(2**53 - 1), max_value=2**53 - 1)


def json_values_with_keys(keys: st.SearchStrategy[str]) -> st.SearchStrategy[object]:
    return st.recursive(
        st.none() | st.booleans() | safe_ints | st.text(max_size=10),
        lambda children: (
            st.lists(children, max_size=4) | st.dictionaries(keys, children, max_size=4)
        ),
        max_leaves=20,
    )


json_values = json_values_with_keys(st.text(max_size=6))
bmp_keys = st.text(st.characters(max_codepoint=0xFFFF, blacklist_categories=["Cs"]), max_size=6)


def refused(rule: str, value: object) -> None:
    with pytest.raises(PlanError) as caught:
        canonical_bytes(value)
    assert caught.value.rule == rule, caught.value


def test_sorted_keys_no_whitespace():
    value = {"b": 1, "a": [True, None, "x", -7], "c": {"z": {}, "y": []}}
    assert canonical_bytes(value) == b'{"a":[true,null,"x",-7],"b":1,"c":{"y":[],"z":{}}}'


def test_tuples_and_read_only_mappings_encode_like_lists_and_dicts():
    assert canonical_bytes(MappingProxyType({"k": (1, 2)})) == canonical_bytes({"k": [1, 2]})


def test_bool_is_not_an_integer():
    assert canonical_bytes([True, 1, False, 0]) == b"[true,1,false,0]"


@QUICK
@given(value=st.dictionaries(st.text(max_size=6), json_values, max_size=8), seed=st.integers())
def test_key_order_of_the_input_does_not_matter(value, seed):
    items = list(value.items())
    random.Random(seed).shuffle(items)
    assert canonical_bytes(dict(items)) == canonical_bytes(value)


@QUICK
@given(value=json_values)
def test_encoding_parses_back_to_the_value_and_is_stable(value):
    encoded = canonical_bytes(value)
    assert json.loads(encoded) == value
    assert canonical_bytes(orjson.loads(encoded)) == encoded
    assert b"\n" not in encoded and b": " not in encoded


@QUICK
@given(value=json_values_with_keys(bmp_keys))
def test_matches_the_stdlib_sorted_compact_encoding_for_bmp_keys(value):
    # For keys inside the Basic Multilingual Plane, UTF-16 order equals code point
    # order, so an independent encoder with explicit settings must agree byte for byte.
    expected = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode(
        "utf-8"
    )
    assert canonical_bytes(value) == expected


def test_keys_sort_by_utf16_code_units_not_code_points():
    # U+1F600 is D83D DE00 in UTF-16, which sorts before U+FFFD; by code point it is after.
    value = {"\ufffd": 1, "\U0001f600": 2}
    assert canonical_bytes(value) == '{"\U0001f600":2,"\ufffd":1}'.encode()


@pytest.mark.parametrize("value", [1.0, 0.5, -0.0, math.nan, math.inf, -math.inf])
def test_floats_are_refused(value):
    refused("float", value)


def test_nested_float_is_refused_and_its_path_named():
    with pytest.raises(PlanError) as caught:
        canonical_bytes({"steps": [{"timeout": 1.5}]})
    assert caught.value.rule == "float"
    assert "$.steps[0].timeout" in str(caught.value)


@pytest.mark.parametrize("value", [{1: "a"}, {None: 1}, {(1,): 2}, {b"k": 1}])
def test_non_string_keys_are_refused(value):
    refused("type", value)


@pytest.mark.parametrize("value", [b"bytes", {1, 2}, object(), 1j, bytearray(b"x")])
def test_non_json_types_are_refused(value):
    refused("type", value)


def test_integers_outside_the_safe_range_are_refused():
    assert canonical_bytes([2**53 - 1, -(2**53 - 1)]) == b"[9007199254740991,-9007199254740991]"
    refused("integer_range", 2**53)
    refused("integer_range", -(2**53))


def test_unicode_is_written_as_utf8_not_escaped():
    assert canonical_bytes("héllo 世界 \U0001f600") == '"héllo 世界 \U0001f600"'.encode()


def test_control_characters_are_escaped_like_json_stringify():
    text = '\b\f\n\r\t"\\\x00\x1f\x7f\u2028'
    assert canonical_bytes(text) == b'"\\b\\f\\n\\r\\t\\"\\\\\\u0000\\u001f\x7f\xe2\x80\xa8"'


def test_lone_surrogate_is_refused():
    refused("unicode", "\ud800")
    refused("unicode", {"\udfff": 1})


def test_excessive_nesting_is_refused():
    value: list = []
    for _ in range(100):
        value = [value]
    refused("depth", value)


def test_digest_is_sha256_of_domain_nul_and_canonical_bytes():
    value = {"b": [1, "x"], "a": None}
    expected = hashlib.sha256(b"my-domain@v1\x00" + b'{"a":null,"b":[1,"x"]}').hexdigest()
    digest = domain_digest("my-domain@v1", value)
    assert digest == "sha256:" + expected
    assert is_digest(digest)


def test_domains_separate_digests_of_equal_values():
    assert domain_digest("one@v1", {"a": 1}) != domain_digest("two@v1", {"a": 1})


@pytest.mark.parametrize("domain", ["", "with\x00nul", 3])
def test_malformed_domain_is_refused(domain):
    with pytest.raises(PlanError):
        domain_digest(domain, {})


@pytest.mark.parametrize(
    "value",
    ["sha256:" + "A" * 64, "sha256:" + "a" * 63, "a" * 64, "sha512:" + "a" * 64, None, 7],
)
def test_is_digest_accepts_only_sha256_lowercase_hex(value):
    assert not is_digest(value)
