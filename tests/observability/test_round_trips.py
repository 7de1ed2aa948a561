"""A commit's round trips, as the store counts them, equal the client's turns on the
wire (bench.roundtrips' counting proxy) for PostgreSQL writes."""

from __future__ import annotations

import uuid
from urllib.parse import urlsplit

import pytest

import qlflow
from bench.roundtrips import CountingProxy, _event, _via
from domain.records import StreamAppend
from tests.cycle.helpers import DIAMOND, T0, manifest


@pytest.mark.pg
def test_commit_round_trips_equal_the_wire(pg_url):
    parts = urlsplit(pg_url)
    proxy = CountingProxy(parts.hostname or "127.0.0.1", parts.port or 5432)
    rt = qlflow.open(_via(pg_url, proxy.port), pool_max_size=1)
    commits = []
    remove = rt.store.observers.on_commit(commits.append)
    try:
        rt.publish(manifest(DIAMOND), now_ms=T0)
        for key in ("k", "k3"):  # warm: catalog lookups; two roots to lease
            rt.start("demo", "flow", admission_key=key, now_ms=T0)
        for number in range(8):  # past psycopg's prepare threshold: it prepares once
            rt.store.append([StreamAppend(f"run-w{number}", 0, (_event(1),))])
        leases = rt.lease_attempts("w1", limit=2, now_ms=T0, start=True)
        writes = {
            "append": lambda: rt.store.append(
                [StreamAppend(f"run-t{uuid.uuid4().hex[:12]}", 0, (_event(1), _event(2)))]
            ),
            "start": lambda: rt.start("demo", "flow", admission_key="k2", now_ms=T0),
            "complete": lambda: rt.complete(leases[0], "succeeded", now_ms=T0),
            "complete_many": lambda: rt.complete_many(
                [qlflow.Completion(leases[1], "failed")], now_ms=T0
            ),
        }
        for name, write in writes.items():
            commits.clear()
            wire, _ = proxy.count(write)
            assert len(commits) == 1, name
            assert commits[0].round_trips >= 2, name  # at least the statement and COMMIT
            # (not a lease: its candidate read runs before, outside the transaction)
            assert commits[0].round_trips == wire, (name, commits[0].round_trips, wire)
    finally:
        remove()
        rt.close()
        proxy.close()


@pytest.mark.pg
def test_a_grant_in_the_completions_own_run_reads_it_no_more(pg_url):
    """`complete_and_lease` of a step whose dependent it makes ready: one round trip
    more than `complete` (the offer's read, with the grant's read-model rows guessed
    from what the completion claimed; the grant's append goes with COMMIT); the Run
    the completion locked and wrote is neither locked nor read again for the grant."""
    parts = urlsplit(pg_url)
    proxy = CountingProxy(parts.hostname or "127.0.0.1", parts.port or 5432)
    rt = qlflow.open(_via(pg_url, proxy.port), pool_max_size=1)
    try:
        rt.publish(manifest([("a", []), ("b", ["a"])]), now_ms=T0)
        trips = {}
        for number in range(8):  # past psycopg's prepare threshold, as a host runs
            run_id = rt.start("demo", "flow", admission_key=f"k{number}", now_ms=T0).run_id
            (first,) = rt.lease_attempts("w1", limit=1, now_ms=T0, start=True)
            if number % 2:
                trips["complete"], _ = proxy.count(
                    lambda first=first: rt.complete(first, "succeeded", now_ms=T0)
                )
                (second,) = rt.lease_attempts("w1", limit=1, now_ms=T0, start=True)
            else:
                trips["complete_and_lease"], done = proxy.count(
                    lambda first=first: rt.complete_and_lease(first, "succeeded", now_ms=T0)
                )
                (second,) = done.next_leases
            assert second.run_id == run_id and second.step_key == "b"
            rt.complete(second, "succeeded", now_ms=T0)
            assert rt.get_run(run_id).status == "succeeded"
        assert trips["complete_and_lease"] == trips["complete"] + 1, trips
    finally:
        rt.close()
        proxy.close()


@pytest.mark.pg
def test_a_worker_write_is_two_round_trips(pg_url):
    """The locks, the Run's tail and the read models' rows in one round trip; the
    append, the read models' upkeep and COMMIT in the second (docs/DESIGN.md "Two
    round trips"): the start barrier, a renewal, a completion that makes its dependent
    ready (a claim, whose position only the server knows), a cancel of a pending Run."""
    parts = urlsplit(pg_url)
    proxy = CountingProxy(parts.hostname or "127.0.0.1", parts.port or 5432)
    rt = qlflow.open(_via(pg_url, proxy.port), pool_max_size=1)
    try:
        rt.publish(manifest([("a", []), ("b", ["a"])]), now_ms=T0)
        trips: dict[str, set[int]] = {}
        for number in range(8):  # past psycopg's prepare threshold, as a host runs
            run_id = rt.start("demo", "flow", admission_key=f"k{number}", now_ms=T0).run_id
            (lease,) = rt.lease_attempts("w1", limit=1, now_ms=T0)
            for name, write in (
                ("mark_running", lambda lease=lease: rt.mark_running(lease, now_ms=T0 + 1)),
                ("renew", lambda lease=lease: rt.renew(lease, now_ms=T0 + 2)),
            ):
                n, lease = proxy.count(write)
                trips.setdefault(name, set()).add(n)
            n, _ = proxy.count(lambda lease=lease: rt.complete(lease, "succeeded", now_ms=T0 + 3))
            trips.setdefault("complete", set()).add(n)
            pending = rt.start("demo", "flow", admission_key=f"p{number}", now_ms=T0).run_id
            n, _ = proxy.count(lambda pending=pending: rt.cancel(pending, now_ms=T0 + 4))
            trips.setdefault("cancel", set()).add(n)
            (second,) = rt.lease_attempts("w1", limit=1, now_ms=T0 + 5, start=True)
            assert second.run_id == run_id and second.step_key == "b"
            rt.complete(second, "succeeded", now_ms=T0 + 6)
            assert rt.get_run(run_id).status == "succeeded"
            assert rt.get_run(pending).status == "cancelled"
        assert trips == {name: {2} for name in trips}, trips
        # the claims' positions, set on the server, are the records' own
        report = rt.verify_projections()
        assert report.ok, report.lines()
    finally:
        rt.close()
        proxy.close()
