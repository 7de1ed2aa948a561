"""What a removed Run's tombstone keeps of its admission receipt (domain.retention):
every field but the steps, carried by the retention record as a list and read back by
name; a receipt missing a field is not kept (its stream then stays)."""

from __future__ import annotations

from domain.retention import RECEIPT_FIELDS, RemovedRun, kept_receipt, receipt_of

DOCUMENT = {
    "schema": "qlflow/admission-receipt@v1",
    "run_id": "run:1",
    "admission_key": "k",
    "steps": [{"step_key": "a"}],
    **{name: f"value-{name}" for name in RECEIPT_FIELDS},
}


def test_the_record_carries_the_kept_fields_and_they_read_back_by_name():
    kept = kept_receipt(DOCUMENT)
    assert kept is not None and set(kept) == set(RECEIPT_FIELDS)
    run = RemovedRun("run:1", "succeeded", "k", 5, 17, 7, kept)
    document = run.document()
    assert document["receipt"] == [kept[name] for name in RECEIPT_FIELDS]
    assert receipt_of(document) == kept


def test_a_receipt_missing_a_field_is_not_kept_and_a_record_without_one_reads_none():
    partial = {k: v for k, v in DOCUMENT.items() if k != "plan_digest"}
    assert kept_receipt(partial) is None
    document = RemovedRun("run:1", "succeeded", "k", 5, 17, 7).document()
    assert "receipt" not in document and receipt_of(document) is None
    assert receipt_of({"receipt": ["too", "short"]}) is None
