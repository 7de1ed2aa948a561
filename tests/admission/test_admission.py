"""Durable admission (SPEC §4) on both stores: the worked example, exact replay,
collisions, lost COMMIT responses and inspect_admission."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from actors import admission
from actors.authority import OperationAuthority
from domain.canonical import domain_digest
from domain.errors import AdmissionCollision, InvalidInput, NotFound
from domain.ids import RUN_ID, derive_id
from domain.plan import normalize
from domain.values import RECEIPT_SCHEMA
from eventstore import faults
from tests.admission.support import (
    T0,
    admit,
    census,
    copy_example,
    manifest,
    migrated_store,
    publish,
)


@pytest.fixture
def store(store_url):
    with migrated_store(store_url) as opened:
        yield opened


@pytest.fixture
def example(store, tmp_path: Path):
    """The SPEC §11 package (fetch -> archive), published."""
    return publish(store, copy_example(tmp_path))


def test_worked_example_counts_exactly(store, example) -> None:
    before = census(store)
    receipt = admit(store, "backup", "nightly", "nightly-1")
    after = census(store)
    delta = {name: after[name] - before[name] for name in after}
    assert delta == {
        "events": 3 + 1 + 2 + 1,
        "run_events": 3 + 1,  # admission, then the root's claim
        "mutations": 2,
        "receipt_events": 1,
        "publication_events": 0,
        "publisher_events": 0,
        "runs": 1,
        "step_runs": 2,
        "receipts": 1,
        "publications": 0,
    }
    run_events = store.read_stream(f"run-{receipt.run_id}")
    assert [(r.stream_version, r.type) for r in run_events] == [
        (1, "workflow.admitted"),
        (2, "step.created"),
        (3, "step.created"),
        (4, "attempt.claimed"),
    ]
    created = {r.data["step_key"]: r.data["status"] for r in run_events[1:3]}
    assert created == {"fetch": "ready", "archive": "pending"}
    assert run_events[3].data["step_key"] == "fetch"  # the ready root, as attempt admission
    assert run_events[3].metadata["actor"] == "admission"
    version, status = store.query(
        "SELECT version, status FROM runs WHERE run_id = ?", (receipt.run_id,)
    )[0]
    assert (version, status) == (4, "running")
    assert receipt.status == "created"
    assert receipt.final_run_version == 3 and receipt.final_steps_version == 2


def test_receipt_binds_the_written_records(store, example) -> None:
    receipt = admit(store, "backup", "nightly", "k", now_ms=T0 + 7)
    run_events = store.read_stream(f"run-{receipt.run_id}")
    mutations = store.read_stream(f"steps-{receipt.run_id}")
    admitted = run_events[0]
    plan = normalize(admitted.data["plan"])
    assert plan.plan_digest == receipt.plan_digest
    assert plan.publication_id == example.publication_id == receipt.publication_id
    assert admitted.event_id == receipt.admitted_event_id
    assert admitted.data["admission_key"] == "k" and admitted.data["admitted_at_ms"] == T0 + 7
    assert receipt.run_id == derive_id(RUN_ID, "k")
    by_key = {step.step_key: step for step in receipt.steps}
    assert sorted(by_key) == ["archive", "fetch"]
    for event in run_events[1 : receipt.final_run_version]:
        step = by_key[event.data["step_key"]]
        assert (step.event_id, step.step_run_id) == (event.event_id, event.data["step_run_id"])
        assert step.step_run_id == plan.step(step.step_key).step_run_id
    for mutation in mutations:
        step = by_key[mutation.data["step_key"]]
        assert (mutation.event_id, mutation.data["event_id"]) == (step.mutation_id, step.event_id)
    document = store.read_stream(f"admission-{_key_hash('k')}")[0].data
    assert document == receipt.document()
    without_digest = {k: v for k, v in document.items() if k != "receipt_digest"}
    assert receipt.receipt_digest == domain_digest(RECEIPT_SCHEMA, without_digest)


def _key_hash(key: str) -> str:
    from domain.values import receipt_stream_id

    return receipt_stream_id(key).split("-", 1)[1]


def test_exact_replay_returns_the_receipt_and_writes_nothing(store, example) -> None:
    first = admit(store, "backup", "nightly", "k", now_ms=T0)
    before = census(store), store.head_position()
    again = admit(store, "backup", "nightly", "k", now_ms=T0 + 999)
    assert (census(store), store.head_position()) == before
    assert again.status == "existing"
    assert again.receipt_digest == first.receipt_digest
    assert again.admitted_at_ms == T0
    assert {**again.document()} == first.document()


def test_replay_is_answered_after_a_new_generation_and_after_withdrawal(
    store, tmp_path: Path
) -> None:
    folder = copy_example(tmp_path)
    first_publication = publish(store, folder)
    first = admit(store, "backup", "nightly", "k")
    (folder / "fetch.py").write_text("print('v2')\n", encoding="utf-8")
    second_publication = publish(store, folder, T0 + 1)
    again = admit(store, "backup", "nightly", "k", now_ms=T0 + 2)
    assert again.status == "existing" and again.receipt_digest == first.receipt_digest
    assert again.publication_id == first_publication.publication_id
    from actors import publishing

    with store.transaction() as tx:
        publishing.withdraw_in_tx(tx, second_publication.publication_id, T0 + 3)
    assert admit(store, "backup", "nightly", "k").receipt_digest == first.receipt_digest


def test_same_key_with_another_plan_collides(store) -> None:
    publish(store, manifest(name="demo", workflow="flow"))
    publish(store, manifest(name="other", workflow="flow"))
    admit(store, "demo", "flow", "k")
    before = census(store)
    for package, timeout in (("demo", 5_000), ("other", None)):
        with pytest.raises(AdmissionCollision) as caught:
            admit(store, package, "flow", "k", timeout_ms=timeout)
        assert "admission key 'k' already admitted run" in str(caught.value)
    with pytest.raises(AdmissionCollision, match="admission key 'k'"):
        admit(store, "demo", "flow", "k", run_id="explicit-run")
    assert census(store) == before


def test_same_run_id_under_another_key_collides(store) -> None:
    publish(store, manifest())
    admit(store, "demo", "flow", "k1", run_id="r-1")
    before = census(store)
    with pytest.raises(AdmissionCollision) as caught:
        admit(store, "demo", "flow", "k2", run_id="r-1")
    assert "run id 'r-1' was already admitted under admission key 'k1'" in str(caught.value)
    assert census(store) == before


def test_default_identities(store) -> None:
    publish(store, manifest())
    one, two = admit(store, "demo", "flow"), admit(store, "demo", "flow")
    assert one.admission_key != two.admission_key and one.run_id != two.run_id
    assert one.run_id == derive_id(RUN_ID, one.admission_key)
    by_run = admit(store, "demo", "flow", run_id="nightly-2024")
    assert by_run.admission_key == "nightly-2024" and by_run.run_id == "nightly-2024"
    again = admit(store, "demo", "flow", run_id="nightly-2024")
    assert again.status == "existing" and again.receipt_digest == by_run.receipt_digest
    assert census(store)["runs"] == 3


def test_bad_identity_is_refused(store) -> None:
    publish(store, manifest())
    with pytest.raises(InvalidInput, match="run_id must be"):
        admit(store, "demo", "flow", run_id="has space")
    for key in ("", "lone \ud800 surrogate", "nul\x00", "k" * 1025):
        with pytest.raises(InvalidInput, match="admission_key must be"):
            admit(store, "demo", "flow", key)
    assert census(store)["runs"] == 0


def test_any_admission_key_fits(store) -> None:
    publish(store, manifest())
    key = "tenant/åäö 🚀 " + "x" * 900
    receipt = admit(store, "demo", "flow", key)
    assert receipt.run_id == derive_id(RUN_ID, key)
    found = admission.inspect_admission(store, admission_key=key)
    assert found is not None and found.status == "existing"
    assert found.receipt_digest == receipt.receipt_digest


def test_lost_commit_response_then_retry_returns_the_same_receipt(store, example) -> None:
    class LostResponse(Exception):
        pass

    def admit_and_lose_the_answer() -> None:
        with store.transaction() as tx:
            admission.admit_in_tx(tx, "backup", "nightly", "lost", None, None, T0)
        raise LostResponse  # the COMMIT succeeded; the caller never hears of it

    with pytest.raises(LostResponse):
        admit_and_lose_the_answer()
    after_commit = census(store)
    assert after_commit["runs"] == 1
    durable = admission.inspect_admission(store, admission_key="lost")
    retry = admit(store, "backup", "nightly", "lost", now_ms=T0 + 50)
    assert retry.status == "existing"
    assert durable is not None and retry == durable
    assert census(store) == after_commit


@pytest.mark.parametrize("point", ["admission.after_commit", "admission.before_commit"])
def test_start_recovers_from_an_unknown_outcome(store, example, point: str) -> None:
    authority = OperationAuthority(store)
    faults.arm(point, "raise")
    try:
        receipt = admission.start(authority, "backup", "nightly", admission_key="k", now_ms=T0)
    finally:
        faults.disarm()
        authority.stop()
    # committed before the fault: the retry finds it; rolled back: the retry creates it
    assert receipt.status == ("existing" if point.endswith("after_commit") else "created")
    assert census(store)["runs"] == 1 and census(store)["receipt_events"] == 1
    durable = admission.inspect_admission(store, admission_key="k")
    assert durable == dataclasses.replace(receipt, status="existing")


def test_start_generates_the_key_once_across_its_retry(store, example) -> None:
    authority = OperationAuthority(store)
    faults.arm("admission.after_commit", "raise")
    try:
        receipt = admission.start(authority, "backup", "nightly", now_ms=T0)
    finally:
        faults.disarm()
        authority.stop()
    assert receipt.status == "existing"
    assert census(store)["runs"] == 1


def test_inspect_admission(store, example) -> None:
    receipt = admit(store, "backup", "nightly", "k")
    by_run = admission.inspect_admission(store, run_id=receipt.run_id)
    by_key = admission.inspect_admission(store, admission_key="k")
    both = admission.inspect_admission(store, run_id=receipt.run_id, admission_key="k")
    assert by_run == by_key == both
    assert by_run is not None and by_run.status == "existing"
    assert by_run.receipt_digest == receipt.receipt_digest
    assert admission.inspect_admission(store, run_id="nope") is None
    assert admission.inspect_admission(store, admission_key="nope") is None
    assert admission.inspect_admission(store, run_id="other", admission_key="k") is None
    with pytest.raises(InvalidInput, match="needs a run_id or an admission_key"):
        admission.inspect_admission(store)
    with store.transaction() as tx:
        assert admission.inspect_admission(tx, run_id=receipt.run_id) == by_run


def test_package_resolution(store) -> None:
    publish(store, manifest(name="demo"))
    publish(store, manifest(name="demo", extra_package={"project": "p2"}))
    eu = publish(store, manifest(name="demo", extra_package={"installation": "demo-eu"}))
    with pytest.raises(InvalidInput, match="'demo' names several installations"):
        admit(store, "demo", "flow")
    by_installation = admit(store, "demo-eu", "flow")
    assert by_installation.installation == "demo-eu"
    assert by_installation.publication_id == eu.publication_id
    by_id = admit(store, eu.publication_id, "flow")
    assert by_id.publication_id == eu.publication_id
    with pytest.raises(NotFound, match="no published package or installation 'nope'"):
        admit(store, "nope", "flow")


def test_largest_plan_admits_in_one_transaction(store) -> None:
    steps = tuple((f"s{i:03d}", (f"s{i - 1:03d}",) if i else ()) for i in range(128))
    publish(store, manifest(steps=steps))
    receipt = admit(store, "demo", "flow", "big", timeout_ms=60_000)
    assert len(receipt.steps) == 128
    assert (receipt.final_run_version, receipt.final_steps_version) == (129, 128)
    counts = census(store)
    # the admission's 129 RunEvents and the claim of the one root
    assert (counts["run_events"], counts["mutations"], counts["step_runs"]) == (130, 128, 128)
    plan = normalize(store.read_stream(f"run-{receipt.run_id}")[0].data["plan"])
    assert plan.timeout_ms == 60_000
    ready = store.query("SELECT step_key FROM step_runs WHERE status = 'ready'")
    assert [tuple(row) for row in ready] == [("s000",)]
