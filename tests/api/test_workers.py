"""`rt.workers()` on both stores (docs/DESIGN.md, "Workers"): who holds or recently
held leases, their host and slots as they said, what they run now, their last
renewal; read from the Attempts read model, equal to a replay of the log (also after
retention and on a store upgraded to it)."""

from __future__ import annotations

import pytest

import qlflow
from projections import runs

T0 = 1_800_000_000_000
TTL = 30_000
HOUR = 3_600_000


def manifest():
    return {
        "package": {"name": "fleet", "publisher": "acme"},
        "tasks": {"t": {"command": ["true"]}},
        "workflows": {"flow": {"steps": [{"key": "a", "task": "t"}, {"key": "b", "task": "t"}]}},
    }


@pytest.fixture
def rt(store_url):
    with qlflow.open(store_url) as runtime:
        yield runtime


def _by_id(rt, **kwargs) -> dict[str, qlflow.WorkerView]:
    return {view.worker_id: view for view in rt.workers(**kwargs)}


def test_a_worker_is_listed_with_what_it_runs_and_its_last_renewal(rt):
    rt.publish(manifest(), now_ms=T0)
    rt.start("fleet", "flow", admission_key="k1", now_ms=T0)
    a, b = rt.lease_attempts(
        "w1", limit=2, ttl_ms=TTL, now_ms=T0 + 1, start=True, slots=4, host="box-1"
    )
    a = rt.renew(a, ttl_ms=TTL, now_ms=T0 + 10_000)
    view = _by_id(rt, now_ms=T0 + 10_000)["w1"]
    assert (view.host, view.slots, view.running, view.expired) == ("box-1", 4, 2, 0)
    assert view.holding and view.attempts == tuple(sorted([a.attempt_id, b.attempt_id]))
    assert (view.last_renewal_ms, view.last_seen_ms, view.ended) == (T0 + 10_000, T0 + 10_000, 0)
    rt.complete(b, "succeeded", now_ms=T0 + 12_000)
    view = _by_id(rt, now_ms=T0 + 12_000)["w1"]
    assert (view.running, view.ended, view.last_ended_ms) == (1, 1, T0 + 12_000)
    assert view.last_seen_ms == T0 + 12_000
    rt.complete(a, "succeeded", now_ms=T0 + 13_000)
    view = _by_id(rt, now_ms=T0 + 13_000)["w1"]  # idle: what its grants said still shows
    assert (view.host, view.slots, view.running, view.ended) == ("box-1", 4, 0, 2)
    assert view.last_renewal_ms is None and not view.holding
    assert rt.verify_projections().ok


def test_a_lease_that_ran_out_counts_as_expired_until_recovery_ends_it(rt):
    rt.publish(manifest(), now_ms=T0)
    rt.start("fleet", "flow", admission_key="k1", now_ms=T0)
    rt.lease_attempts("gone", limit=1, ttl_ms=TTL, now_ms=T0, start=True, slots=1)
    view = _by_id(rt, now_ms=T0 + TTL)["gone"]
    assert (view.running, view.expired, view.holding) == (1, 1, False)
    rt.cycle(now_ms=T0 + TTL)  # recovery: the Attempt is lost
    view = _by_id(rt, now_ms=T0 + TTL)["gone"]
    assert (view.running, view.expired, view.ended) == (0, 0, 1)
    assert rt.verify_projections().ok


def test_only_recent_or_busy_workers_are_listed(rt):
    rt.publish(manifest(), now_ms=T0)
    rt.start("fleet", "flow", admission_key="k1", now_ms=T0)
    (old,) = rt.lease_attempts("old", ttl_ms=TTL, now_ms=T0, start=True)
    rt.complete(old, "succeeded", now_ms=T0 + 1_000)
    rt.cycle(now_ms=T0 + 1_000)
    rt.lease_attempts("busy", ttl_ms=600_000, now_ms=T0 + 2_000, start=True)
    later = T0 + 2 * HOUR
    assert list(_by_id(rt, now_ms=later)) == ["busy"]  # started long ago, but running now
    assert sorted(_by_id(rt, since_ms=T0, now_ms=later)) == ["busy", "old"]
    assert [v.worker_id for v in rt.workers(since_ms=T0, now_ms=later, limit=1)] == ["busy"]


def test_a_worker_that_says_nothing_of_itself_is_listed_without_host_or_slots(rt):
    rt.publish(manifest(), now_ms=T0)
    rt.start("fleet", "flow", admission_key="k1", now_ms=T0)
    rt.lease_attempts("plain", ttl_ms=TTL, now_ms=T0, start=True)
    view = _by_id(rt, now_ms=T0)["plain"]
    assert (view.host, view.slots, view.running) == (None, None, 1)
    (grant,) = rt.events(types=["lease.granted"])
    assert "worker_slots" not in grant.data and "worker_host" not in grant.data


def test_bad_slots_or_host_are_refused_with_nothing_written(rt):
    rt.publish(manifest(), now_ms=T0)
    rt.start("fleet", "flow", admission_key="k1", now_ms=T0)
    before = len(rt.events())
    for bad in ({"slots": 0}, {"slots": True}, {"host": ""}, {"slots": 10_001}):
        with pytest.raises(qlflow.errors.InvalidInput):
            rt.lease_attempts("w", ttl_ms=TTL, now_ms=T0, start=True, **bad)
    assert len(rt.events()) == before


def test_retention_rebuild_and_an_upgrade_keep_the_rows_a_replay_gives(store_url):
    with qlflow.open(store_url) as rt:
        rt.publish(manifest(), now_ms=T0)
        done = rt.start("fleet", "flow", admission_key="k0", now_ms=T0).run_id
        for lease in rt.lease_attempts("w0", limit=2, ttl_ms=TTL, now_ms=T0, start=True):
            rt.complete(lease, "succeeded", now_ms=T0 + 1)
        rt.cycle(now_ms=T0 + 1)
        assert rt.get_run(done).status == "succeeded"
        rt.start("fleet", "flow", admission_key="k1", now_ms=T0 + 2)
        # b's grant says nothing of its worker, as every grant before step 12; a's
        # lease is still held at the upgrade
        (a,) = rt.lease_attempts("w1", ttl_ms=TTL, now_ms=T0 + 2, start=True, slots=2, host="h")
        (b,) = rt.lease_attempts("w1", ttl_ms=TTL, now_ms=T0 + 3, start=True)
        rt.renew(a, ttl_ms=TTL, now_ms=T0 + 5_000)
        rt.complete(b, "failed", now_ms=T0 + 6_000)
        rt.retain(T0 + 10, now_ms=T0 + 7_000)  # the first Run and its Attempts go
        assert rt.verify_projections().ok
        assert sorted(_by_id(rt, since_ms=0, now_ms=T0 + 6_000)) == ["w1"]
        columns = "attempt_id, worker_host, worker_slots, renewed_at_ms"
        rows = rt.store.query(f"SELECT {columns} FROM attempts ORDER BY attempt_id")
        assert (a.attempt_id, "h", 2, T0 + 5_000) in rows
        with rt.store.transaction() as tx:  # the Attempts as before runs schema step 12
            tx.execute("DROP INDEX attempts_ended")
            for column in ("worker_host", "worker_slots", "renewed_at_ms"):
                tx.execute(f"ALTER TABLE attempts DROP COLUMN {column}")
            tx.execute(
                "UPDATE schema_versions SET version = ? WHERE component = ?",
                (runs.WORKERS_STEP - 1, runs.COMPONENT),
            )
    with qlflow.open(store_url) as rt:  # migrates; the held lease's grant and renewal read
        assert rt.store.query(f"SELECT {columns} FROM attempts ORDER BY attempt_id") == rows
        assert rt.verify_projections().ok
