"""One clock per store: hosts whose clocks are 10 s behind and 5 minutes ahead of the
PostgreSQL server agree on every lease, because a call without `now_ms` decides at the
server's `clock_timestamp()` (read with the write's first statement) — never at the
host's own time. A caller-given `now_ms` keeps its meaning."""

from __future__ import annotations

import psycopg
import pytest

import qlflow
from eventstore.clock import host_ms
from tests.cycle.helpers import manifest

pytestmark = pytest.mark.pg

BEHIND_MS, AHEAD_MS = -10_000, 300_000
TTL_MS = 5_000  # far shorter than the skew of either host


def _server_ms(server_url: str) -> int:
    with psycopg.connect(server_url) as conn:
        row = conn.execute(
            "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint"
        ).fetchone()
    assert row is not None
    return int(row[0])


def test_hosts_behind_and_ahead_agree_on_a_lease(pg_url: str, pg_server_url: str):
    worker = qlflow.open(pg_url, host_clock=lambda: host_ms() + BEHIND_MS)
    cycler = qlflow.open(pg_url, host_clock=lambda: host_ms() + AHEAD_MS)
    try:
        cycler.publish(manifest([("a", []), ("b", ["a"])]))
        run_id = cycler.start("demo", "flow").run_id
        before = _server_ms(pg_server_url)
        [lease] = worker.lease_attempts("w-behind", ttl_ms=TTL_MS, start=True)
        after = _server_ms(pg_server_url)
        # granted on the server's clock, not the worker's (10 s behind)
        assert before + TTL_MS <= lease.expires_at_ms <= after + TTL_MS
        # the host 5 minutes ahead runs a cycle: by the store's clock the lease is live
        for _ in range(3):
            cycler.cycle()
        attempt = cycler.get_run(run_id).steps["a"].attempts[0]
        assert (attempt.status, attempt.lease_status) == ("starting", "leased")
        # the host 10 s behind renews and completes: accepted, nothing refused as "before"
        lease = worker.renew(lease, ttl_ms=TTL_MS)
        lease = worker.mark_running(lease)
        assert worker.complete(lease, "succeeded") == "succeeded"
        [second] = worker.lease_attempts("w-behind", ttl_ms=TTL_MS, start=True)
        assert worker.complete(second, "succeeded") == "succeeded"
        run = cycler.get_run(run_id)
        assert run.status == "succeeded"
        assert [len(s.attempts) for s in run.steps.values()] == [1, 1]
        # each host's idea of the store's time is the server's, whatever its own clock
        for runtime in (worker, cycler):
            assert abs(runtime.clock_ms() - _server_ms(pg_server_url)) < 2_000
    finally:
        worker.close()
        cycler.close()


def test_a_lease_expires_by_the_store_clock_only(pg_url: str, pg_server_url: str):
    """The host ahead does expire a lease that really ran out by the server's clock,
    and a caller-given now_ms still decides as given."""
    worker = qlflow.open(pg_url, host_clock=lambda: host_ms() + BEHIND_MS)
    cycler = qlflow.open(pg_url, host_clock=lambda: host_ms() + AHEAD_MS)
    try:
        cycler.publish(manifest([("a", [])]))
        run_id = cycler.start("demo", "flow").run_id
        [lease] = worker.lease_attempts("w-behind", ttl_ms=TTL_MS, start=True)
        cycler.cycle(now_ms=lease.expires_at_ms)  # given: the lease has ended at that instant
        run = cycler.get_run(run_id)
        assert run.steps["a"].attempts[0].status == "lost"
        assert run.steps["a"].result_code == "lease_expired"
    finally:
        worker.close()
        cycler.close()
