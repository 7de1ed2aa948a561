"""Concurrent admissions, and revocation racing admission (threads; PostgreSQL is the
case that matters, SQLite must give the same answers through its write lock)."""

from __future__ import annotations

import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest

from actors import admission, publishing
from domain.errors import IdempotencyConflict, StartGuardError, VersionConflict
from domain.values import AdmissionReceipt
from eventstore.api import StoreUsageError
from tests.admission.support import T0, census, manifest, migrated_store, publish

THREADS = 8
WAIT_S = 60


@pytest.fixture
def store(store_url):
    with migrated_store(store_url) as opened:
        yield opened


def _admit_with_one_retry(store, key: str, now_ms: int) -> AdmissionReceipt:
    """Admit in a transaction; a conflict with a concurrent admission is retried once
    in a new transaction (the facade's rule)."""
    for attempt in (1, 2):
        try:
            with store.transaction() as tx:
                return admission.admit_in_tx(tx, "demo", "flow", key, None, None, now_ms)
        except (VersionConflict, IdempotencyConflict, StoreUsageError):
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


def test_concurrent_starts_with_one_key_admit_one_run(store) -> None:
    publish(store, manifest())
    barrier = threading.Barrier(THREADS, timeout=WAIT_S)

    def start(index: int) -> AdmissionReceipt:
        barrier.wait()
        return _admit_with_one_retry(store, "same-key", T0 + index)

    with ThreadPoolExecutor(THREADS) as pool:
        receipts = list(pool.map(start, range(THREADS)))
    assert Counter(receipt.status for receipt in receipts) == {"created": 1, "existing": 7}
    assert len({receipt.receipt_digest for receipt in receipts}) == 1
    assert len({receipt.run_id for receipt in receipts}) == 1
    counts = census(store)
    assert (counts["runs"], counts["step_runs"], counts["receipt_events"]) == (1, 2, 1)
    assert (counts["run_events"], counts["mutations"]) == (3 + 1, 2)  # and the root's claim


def test_concurrent_starts_with_distinct_keys_all_succeed(store) -> None:
    publish(store, manifest())
    barrier = threading.Barrier(THREADS, timeout=WAIT_S)

    def start(index: int) -> AdmissionReceipt:
        barrier.wait()
        return _admit_with_one_retry(store, f"key-{index}", T0)

    with ThreadPoolExecutor(THREADS) as pool:
        receipts = list(pool.map(start, range(THREADS)))
    assert {receipt.status for receipt in receipts} == {"created"}
    assert census(store)["runs"] == THREADS


def test_revocation_racing_admission(store) -> None:
    """Every admission either precedes the revocation in the log or is refused."""
    publish(store, manifest())
    admitters = 4
    some_admitted = threading.Event()
    lock = threading.Lock()
    created: list[AdmissionReceipt] = []
    refusals: list[str] = []

    def admit_until_refused(index: int) -> None:
        for n in range(500):
            try:
                receipt = _admit_with_one_retry(store, f"t{index}-{n}", T0 + n)
            except StartGuardError as error:
                with lock:
                    refusals.append(error.reason)
                return
            with lock:
                created.append(receipt)
            some_admitted.set()
        raise AssertionError("the revocation never took effect")

    def revoke() -> None:
        assert some_admitted.wait(WAIT_S)
        with store.transaction() as tx:
            assert publishing.revoke_publisher_in_tx(tx, "acme", T0)

    with ThreadPoolExecutor(admitters + 1) as pool:
        futures = [pool.submit(admit_until_refused, i) for i in range(admitters)]
        futures.append(pool.submit(revoke))
        for future in futures:
            future.result(timeout=WAIT_S)

    assert refusals == ["publisher_revoked"] * admitters
    revoked_at = store.read_stream("publisher-acme")[0].global_position
    admission_records = [
        record
        for record in store.read_all()
        if record.stream_id.startswith(("run-", "steps-", "admission-"))
    ]
    assert created and admission_records
    assert all(record.global_position < revoked_at for record in admission_records)
    receipts_in_log = {
        record.data["receipt_digest"]
        for record in admission_records
        if record.stream_id.startswith("admission-")
    }
    assert receipts_in_log == {receipt.receipt_digest for receipt in created}


def test_concurrent_publishes_take_distinct_generations(store) -> None:
    barrier = threading.Barrier(4, timeout=WAIT_S)

    def publish_variant(index: int):
        barrier.wait()
        return publish(store, manifest(command=("echo", str(index))), T0 + index)

    with ThreadPoolExecutor(4) as pool:
        published = list(pool.map(publish_variant, range(4)))
    assert sorted(p.generation for p in published) == [1, 2, 3, 4]
    heads = store.query("SELECT generation FROM publications WHERE head = 1")
    assert [tuple(row) for row in heads] == [(4,)]
