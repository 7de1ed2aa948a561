"""What a removed Run's tombstone keeps of its admission receipt (domain.retention):
every field but the steps, carried by the retention record as a list and read back by
name; a receipt missing a field is not kept (its stream then stays)."""

from __future__ import annotations

from domain.retention import (
    RECEIPT_FIELDS,
    RemovedRun,
    kept_receipt,
    receipt_of,
    record,
    removed_runs,
)

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


def _receipt(run_id: str, workflow: str) -> dict[str, object]:
    kept = kept_receipt({**DOCUMENT, "run_id": run_id, "workflow_key": workflow})
    assert kept is not None
    return {**kept, "plan_digest": f"plan-of-{run_id}"}


def test_a_record_names_its_runs_as_a_table_and_reads_them_back_as_documents():
    runs = [
        RemovedRun("run:1", "succeeded", "k1", 5, 17, 7, _receipt("run:1", "tick")),
        RemovedRun("run:2", "failed", None, 6, 9, 3),  # its receipt stream stayed
        RemovedRun("run:3", "cancelled", "k3", 8, 12, 5, _receipt("run:3", "tick")),
        RemovedRun("run:4", "succeeded", "k4", 9, 17, 7, _receipt("run:4", "tock")),
    ]
    data = record(0, runs, [(1, "e", "run-run:1", 1, "t", "{}", "{}")], 100).events[0].data
    # the publication fields once per distinct value, each Run a row
    assert len(data["sources"]) == 2 and all(isinstance(row, list) for row in data["runs"])
    assert removed_runs(data) == [run.document() for run in runs]
    assert [receipt_of(run) for run in removed_runs(data)] == [run.receipt for run in runs]


def test_a_record_before_the_table_still_reads_and_malformed_rows_are_left_out():
    documents = [RemovedRun("run:1", "succeeded", "k", 5, 17, 7).document(), "junk", {}]
    assert removed_runs({"runs": documents}) == documents[:1]
    table = record(0, [RemovedRun("run:1", "succeeded", "k", 5, 17, 7)], [], 1).events[0].data
    assert removed_runs({**table, "runs": [*table["runs"], ["short"], [None] * 13]}) == [
        RemovedRun("run:1", "succeeded", "k", 5, 17, 7).document()
    ]
    bad_source = {**table, "runs": [[*table["runs"][0][:6], 7, *table["runs"][0][7:]]]}
    assert receipt_of(removed_runs(bad_source)[0]) is None
