"""IN lists in chunks: every value once in order, padded ones to a power of two."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from eventstore.in_lists import IN_CHUNK, chunks, marks
from tests.hypothesis_budget import examples


@settings(max_examples=examples(200), deadline=None)
@given(st.lists(st.integers(), max_size=3 * IN_CHUNK + 5), st.booleans())
def test_chunks_hold_every_value_in_order_and_padding_repeats_the_last(values, padded):
    found = chunks(values, padded=padded)
    assert all(0 < len(chunk) <= IN_CHUNK for chunk in found)
    unpadded = [chunk[: min(IN_CHUNK, len(values) - n * IN_CHUNK)] for n, chunk in enumerate(found)]
    assert [v for chunk in unpadded for v in chunk] == values
    for chunk, own in zip(found, unpadded, strict=True):
        if padded:
            assert len(chunk) & (len(chunk) - 1) == 0  # a power of two
            assert chunk[len(own) :] == own[-1:] * (len(chunk) - len(own))
        else:
            assert chunk == own


def test_marks_are_one_per_value():
    assert marks(["a", "b", "c"]) == "?, ?, ?"
