"""Workers side by side on PostgreSQL: a worker whose page of candidates other
transactions are leasing right now leases from the page after them."""

from __future__ import annotations

import pytest

import qlflow
from actors.loading import attempt_lock
from projections.candidates import claimable_attempts
from tests.cycle.helpers import T0, manifest
from tests.lock_holder import hold_locks

pytestmark = pytest.mark.pg

ROOTS = [(f"r{i}", []) for i in range(8)]


def test_a_page_another_worker_is_leasing_is_passed_over_for_the_next(pg_url):
    with qlflow.open(pg_url, profile="cluster", lock_timeout_ms=300) as rt:
        rt.publish(manifest(ROOTS), now_ms=T0)
        run_id = rt.start("demo", "flow", now_ms=T0).run_id
        order = [a for a, _run, _slot in claimable_attempts(rt.store, T0, 100)]
        assert len(order) == len(ROOTS)
        # another worker's grant holds the first page a lease of 2 reads (twice its limit)
        holder = hold_locks(pg_url, [attempt_lock(a) for a in order[:4]])
        try:
            leases = rt.lease_attempts("w2", limit=2, now_ms=T0 + 1)
        finally:
            holder.close()
        assert [lease.attempt_id for lease in leases] == order[4:6]  # the next, in order
        assert {lease.run_id for lease in leases} == {run_id}
        # released: the first page is leased again, in lease order
        again = rt.lease_attempts("w3", limit=8, now_ms=T0 + 2)
        assert [lease.attempt_id for lease in again] == order[:4] + order[6:]
