"""Workers side by side on PostgreSQL: leases that read together are offered
different Attempts, and a worker whose page of candidates other transactions are
leasing right now leases from the page after them."""

from __future__ import annotations

import threading

import pytest

import qlflow
from actors.loading import ATTEMPT_LOCK, attempt_lock
from projections.candidates import claimable_attempts, offered_attempts
from tests.cycle.helpers import T0, manifest
from tests.lock_holder import hold_locks, lock_buckets

pytestmark = pytest.mark.pg

ROOTS = [(f"r{i}", []) for i in range(8)]
# A fixed Run id, so the Attempts' ids and their lock buckets are the same every run: a
# lock covers a bucket of names (eventstore.locks), and with a random Run id one free
# Attempt in about a thousand runs shared a held one's bucket and was passed over with it.
RUN_ID = "contention-1"


def _claimable_with_own_locks(rt, pg_url: str) -> list[str]:
    """The Run's claimable Attempts in lease order, each checked to have a lock bucket of
    its own (what these tests hold and skip is one Attempt per lock)."""
    order = [a for a, _run, _slot in claimable_attempts(rt.store, T0, 100)]
    assert len(order) == len(ROOTS)
    assert len(set(lock_buckets(pg_url, [attempt_lock(a) for a in order]))) == len(order)
    return order


def test_a_page_another_worker_is_leasing_is_passed_over_for_the_next(pg_url):
    with qlflow.open(pg_url, profile="cluster", lock_timeout_ms=300) as rt:
        rt.publish(manifest(ROOTS), now_ms=T0)
        run_id = rt.start("demo", "flow", run_id=RUN_ID, now_ms=T0).run_id
        order = _claimable_with_own_locks(rt, pg_url)
        # another worker's grant holds the first page a lease of 2 reads (twice its limit)
        holder = hold_locks(pg_url, [attempt_lock(a) for a in order[:4]])
        try:
            leases = rt.lease_attempts("w2", limit=2, now_ms=T0 + 1)
        finally:
            holder.rollback()  # answered: the locks are released when it returns
            holder.close()
        assert [lease.attempt_id for lease in leases] == order[4:6]  # the next, in order
        assert {lease.run_id for lease in leases} == {run_id}
        # released: the first page is leased again, in lease order
        again = rt.lease_attempts("w3", limit=8, now_ms=T0 + 2)
        assert [lease.attempt_id for lease in again] == order[:4] + order[6:]


def test_leases_side_by_side_are_offered_different_attempts_in_lease_order(pg_url):
    with qlflow.open(pg_url, profile="cluster", lock_timeout_ms=300) as rt:
        rt.publish(manifest(ROOTS), now_ms=T0)
        rt.start("demo", "flow", run_id=RUN_ID, now_ms=T0)
        order = _claimable_with_own_locks(rt, pg_url)
        first = rt.store.transaction()
        tx = first.__enter__()
        try:
            # one lease's transaction has read (and so holds) the first three
            taken = offered_attempts(tx, T0, 3, lock_prefix=ATTEMPT_LOCK)
            assert [a for a, _run, _slot in taken] == order[:3]
            # a second lease meanwhile, on another connection: the next ones, in order
            seen: list[list[str]] = []
            other = threading.Thread(
                target=lambda: seen.append(
                    [lease.attempt_id for lease in rt.lease_attempts("w2", limit=3, now_ms=T0)]
                )
            )
            other.start()
            other.join(30)
            assert seen == [order[3:6]]
        finally:
            first.__exit__(None, None, None)
        # the first transaction granted nothing: its Attempts are offered again
        again = rt.lease_attempts("w3", limit=8, now_ms=T0 + 1)
        assert [lease.attempt_id for lease in again] == order[:3] + order[6:]
