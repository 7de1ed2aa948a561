"""The receipt value object: its digest covers every field, and a stored document
that does not match its digest is refused."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from domain.errors import CorruptionError
from domain.values import (
    ReceiptStep,
    receipt_document,
    receipt_from_document,
    receipt_stream_id,
)
from tests.hypothesis_budget import examples

ids = st.text("abcdefghijklmnopqrstuvwxyz0123456789:", min_size=1, max_size=36)
digests = st.binary(min_size=32, max_size=32).map(lambda raw: "sha256:" + raw.hex())
steps = st.lists(
    st.builds(ReceiptStep, ids, ids, ids, ids), max_size=5, unique_by=lambda s: s.step_key
)
documents = st.fixed_dictionaries(
    {
        "run_id": ids,
        "plan_digest": digests,
        "admission_key": st.text(min_size=1, max_size=40),
        "package": ids,
        "installation": ids,
        "workflow_key": ids,
        "publication_id": ids,
        "publication_digest": digests,
        "admitted_event_id": ids,
        "steps": steps.map(tuple),
        "final_run_version": st.integers(1, 129),
        "final_steps_version": st.integers(0, 128),
        "admitted_at_ms": st.integers(0, 2**53 - 1),
    }
)


@settings(max_examples=examples(100), deadline=None)
@given(documents)
def test_document_round_trips_through_the_receipt(fields) -> None:
    document = receipt_document(**fields)
    receipt = receipt_from_document(document, "existing")
    assert receipt.document() == document
    assert receipt.receipt_digest == document["receipt_digest"]
    assert receipt_document(**fields) == document  # deterministic


@settings(max_examples=examples(100), deadline=None)
@given(documents, st.data())
def test_any_changed_field_breaks_the_digest(fields, data) -> None:
    document = receipt_document(**fields)
    name = data.draw(
        st.sampled_from(
            ["run_id", "plan_digest", "admission_key", "final_run_version", "admitted_at_ms"]
        )
    )
    value = document[name]
    # flip the lowest bit: a different value that stays a valid (safe) integer
    forged = {**document, name: value ^ 1 if isinstance(value, int) else value + "x"}
    with pytest.raises(CorruptionError, match="does not match its digest"):
        receipt_from_document(forged, "existing")


def test_malformed_document_is_corruption() -> None:
    with pytest.raises(CorruptionError, match="malformed"):
        receipt_from_document({"run_id": "r"}, "existing")


@settings(max_examples=examples(100), deadline=None)
@given(st.text(min_size=1), st.text(min_size=1))
def test_receipt_streams_separate_keys(one, two) -> None:
    stream = receipt_stream_id(one)
    assert stream.startswith("admission-") and len(stream) == len("admission-") + 64
    assert (stream == receipt_stream_id(two)) == (one == two)
