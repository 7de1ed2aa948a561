"""Audit queries over the log: timeline, step history, the aggregate at a version,
`why`, and following new events (SPEC §9), on both stores."""

from __future__ import annotations

import threading
import time

import orjson
import pytest

import eventstore
import qlflow
from actors.loading import read_run_streams
from domain.errors import InvalidInput, NotFound
from domain.records import NewEvent, StreamAppend
from projections import audit
from tests.projections.workload import T0, all_shapes_manifest


@pytest.fixture
def api(store_url):
    runtime = qlflow.open(store_url)
    runtime.publish(all_shapes_manifest(), now_ms=T0)
    yield runtime
    runtime.close()


@pytest.fixture
def store(api):
    return api.store


def start(api, workflow: str, run_id: str = "run-1", now_ms: int = T0):
    return api.start("demo", workflow, admission_key=run_id, run_id=run_id, now_ms=now_ms).run_id


def aggregate(store, run_id: str):
    with store.session() as tx:
        return read_run_streams(tx, run_id).fold()


def lease_of(api, run_id: str, step_key: str, worker: str, now_ms: int, ttl_ms: int = 30_000):
    leases = api.lease_attempts(worker, limit=8, ttl_ms=ttl_ms, now_ms=now_ms, run_id=run_id)
    (lease,) = [lease for lease in leases if lease.step_key == step_key]
    return lease


# --- aggregate_at ---------------------------------------------------------------------


def test_aggregate_at_matches_the_state_at_each_version_of_a_scripted_run(api, store):
    run_id = start(api, "chain")
    states = {}

    def note():
        now_state = aggregate(store, run_id)
        states[now_state.version] = now_state  # the last state at each version

    note()
    now = T0
    script = [
        lambda: api.cycle(now_ms=now),  # nothing: the start claimed a
        lambda: lease_of(api, run_id, "a", "w1", now, ttl_ms=5_000),  # never started
    ]
    for step in script:
        step()
        note()
    now = T0 + 6_000  # the lease expired before start: lost, requeued, claimed again
    api.cycle(now_ms=now)
    note()
    lease = lease_of(api, run_id, "a", "w2", now)
    note()
    lease = api.mark_running(lease, now_ms=now + 1)
    note()
    lease = api.renew(lease, ttl_ms=30_000, now_ms=now + 2)
    note()
    api.complete(lease, "succeeded", now_ms=now + 3)
    note()
    api.cycle(now_ms=now + 4)  # nothing: the completion made b ready and claimed it
    note()
    lease = lease_of(api, run_id, "b", "w3", now + 5)
    note()
    lease = api.mark_running(lease, now_ms=now + 5)
    note()
    api.cancel(run_id, now_ms=now + 6)  # c cancelled with it; b blocked on its worker
    note()
    api.cycle(now_ms=now + 7)
    note()
    api.complete(lease, "succeeded", now_ms=now + 8)  # recorded cancelled, the Run ended
    note()
    api.cycle(now_ms=now + 9)  # nothing left
    note()

    final = aggregate(store, run_id)
    assert final.run.status == "cancelled"
    assert len(states) >= 7
    for version, expected in states.items():
        assert audit.aggregate_at(store, run_id, version) == expected, version
    for version in range(4, final.version + 1):  # 1..4: the admission of 3 steps
        assert audit.aggregate_at(store, run_id, version).version == version
    with pytest.raises(InvalidInput, match="first state is version 4"):
        audit.aggregate_at(store, run_id, 3)
    assert audit.aggregate_at(store, run_id) == final
    # at the version the first claim was written, its lease is not granted yet
    claimed_at = next(v for v, s in sorted(states.items()) if s.attempts)
    first = next(iter(audit.aggregate_at(store, run_id, claimed_at).attempts.values()))
    assert first.status == "claimed"


def test_aggregate_at_refuses_versions_the_run_does_not_have(api, store):
    run_id = start(api, "one")
    head = aggregate(store, run_id).version
    for bad in (0, head + 1, -1, True, "2"):
        with pytest.raises(InvalidInput, match=r"versions 1\.\."):
            audit.aggregate_at(store, run_id, bad)
    with pytest.raises(NotFound):
        audit.aggregate_at(store, "no-such-run", 1)


# --- why ------------------------------------------------------------------------------


def test_why_names_the_blocking_lease_and_worker_of_a_leased_then_cancelled_run(api, store):
    run_id = start(api, "chain")
    api.cycle(now_ms=T0 + 1)
    lease = api.mark_running(lease_of(api, run_id, "a", "worker-7", T0 + 2), now_ms=T0 + 3)
    api.cancel(run_id, now_ms=T0 + 10)
    api.cycle(now_ms=T0 + 20)

    report = audit.why(store, run_id, T0 + 30)
    assert not report.terminal and report.status == "running"
    assert report.intent == audit.Intent("user", T0 + 10, "user", recorded=True)
    (block,) = report.blocked
    assert (block.step_key, block.status, block.worker_id) == ("a", "running", "worker-7")
    assert (block.lease_id, block.lease_version) == (lease.lease_id, lease.version)
    assert block.expires_at_ms == lease.expires_at_ms == T0 + 2 + 30_000
    assert block.lease_live
    assert report.backlog == () and report.steps == ()  # b and c were cancelled already
    text = "\n".join(report.lines())
    assert f"worker worker-7 holds lease {lease.lease_id} v{lease.version} until" in text
    assert str(lease.expires_at_ms) in text
    assert "recovery marks the Attempt lost" in text
    assert "requested by user" in text
    assert "ends as cancelled once no Attempt holds authority" in text
    orjson.dumps(report.to_dict())

    expired = audit.why(store, run_id, lease.expires_at_ms)
    (block,) = expired.blocked
    assert not block.lease_live
    assert f"expired at {lease.expires_at_ms}" in block.next
    assert "next cycle's recovery" in block.next

    api.complete(lease, "succeeded", now_ms=T0 + 40)
    api.cycle(now_ms=T0 + 50)
    ended = audit.why(store, run_id, T0 + 60)
    assert ended.terminal and ended.status == "cancelled"
    cause = ended.root_cause
    assert (cause.kind, cause.reason, cause.by, cause.at_ms) == (
        "cancel_intent",
        "user",
        "user",
        T0 + 10,
    )
    assert sorted(cause.ended_by_cancel) == ["a", "b", "c"]
    assert "cancelled by user (reason user)" in "\n".join(ended.lines())


def test_why_explains_a_claimed_leased_attempt_under_cancel_intent(api, store):
    run_id = start(api, "one")
    api.cycle(now_ms=T0 + 1)
    lease = lease_of(api, run_id, "a", "worker-9", T0 + 2)
    api.cancel(run_id, now_ms=T0 + 3)
    api.cycle(now_ms=T0 + 4)
    (block,) = audit.why(store, run_id, T0 + 5).blocked
    assert (block.status, block.worker_id, block.lease_id) == (
        "claimed",
        "worker-9",
        lease.lease_id,
    )
    assert "if it expires before the worker starts" in block.next
    assert "cancellation then ends it as cancelled" in block.next


def test_why_names_the_first_failed_step_and_what_it_skipped(api, store):
    run_id = start(api, "skips")
    now = T0
    for _ in range(12):
        now += 10
        api.cycle(now_ms=now)
        for lease in api.lease_attempts("w1", limit=8, now_ms=now):
            api.mark_running(lease, now_ms=now)
            api.complete(lease, "failed" if lease.step_key == "c" else "succeeded", now_ms=now)
    report = audit.why(store, run_id, now)
    assert report.terminal and report.status == "failed"
    cause = report.root_cause
    assert (cause.kind, cause.step_key, cause.result_code) == (
        "step_failed",
        "c",
        "execution_failed",
    )
    assert cause.skipped == ("d", "e")
    assert cause.worker_id == "w1" and cause.attempt_id is not None
    failed_at = next(e for e in audit.timeline(store, run_id) if e.type == "step.failed")
    assert cause.position == failed_at.position
    text = "\n".join(report.lines())
    assert "first cause: step 'c' failed with execution_failed" in text
    assert "skipped because of it: d, e" in text


def test_why_lists_pending_needs_and_backlog_of_a_running_run(api, store):
    run_id = start(api, "chain")
    api.cycle(now_ms=T0 + 1)  # a claimed, nobody leased it
    report = audit.why(store, run_id, T0 + 2)
    assert report.intent is None and report.blocked == ()
    (backlog,) = report.backlog
    assert (backlog.step_key, backlog.lease_id) == ("a", None)
    assert "waits for a worker" in backlog.next
    assert [(w.step_key, w.waiting_on) for w in report.steps] == [("b", ("a",)), ("c", ("b",))]
    assert "it waits for a (ready) to succeed" in report.lines()[-2]


def test_why_says_a_passed_deadline_is_an_intent_before_it_is_recorded(api, store):
    run_id = start(api, "one-timed")  # timeout 3 s
    api.cycle(now_ms=T0 + 1)
    api.mark_running(lease_of(api, run_id, "a", "w1", T0 + 2), now_ms=T0 + 2)
    report = audit.why(store, run_id, T0 + 3_000)
    assert report.deadline_passed and report.deadline_ms == T0 + 3_000
    assert report.intent == audit.Intent("timeout", T0 + 3_000, None, recorded=False)
    assert "(as timed_out: the Run has cancel intent)" in report.blocked[0].next
    assert "ends as timed_out once no Attempt holds authority" in report.next_cycle
    assert "deadline" in report.lines()[1]
    before = audit.why(store, run_id, T0 + 2_000)
    assert before.intent is None and "1000 ms left" in before.lines()[1]


def test_why_names_the_deadline_as_the_root_cause_of_a_timed_out_run(api, store):
    run_id = start(api, "chain-timed")  # timeout 3 s; a is claimed, nobody leases it
    api.cycle(now_ms=T0 + 1)
    api.cycle(now_ms=T0 + 3_000)
    report = audit.why(store, run_id, T0 + 3_001)
    assert report.terminal and report.status == "timed_out"
    cause = report.root_cause
    assert (cause.kind, cause.reason, cause.by, cause.at_ms) == (
        "cancel_intent",
        "timeout",
        "cycle:cancellation",
        T0 + 3_000,
    )
    assert cause.ended_by_cancel == ("a", "b", "c")
    assert report.lines()[1].startswith(f"its deadline {T0 + 3_000} passed: timeout intent")


def test_why_of_an_unknown_run_is_not_found(api, store):
    with pytest.raises(NotFound, match="no-such-run"):
        audit.why(store, "no-such-run", T0)


# --- timeline and step history --------------------------------------------------------


def test_timeline_merges_the_runs_streams_by_position(api, store):
    run_id = start(api, "diamond")
    api.cycle(now_ms=T0 + 1)
    lease = api.mark_running(lease_of(api, run_id, "a", "w1", T0 + 2), now_ms=T0 + 3)
    api.complete(lease, "succeeded", now_ms=T0 + 4)
    api.cycle(now_ms=T0 + 5)

    entries = audit.timeline(store, run_id)
    streams = [f"run-{run_id}", f"steps-{run_id}", f"lease-{lease.attempt_id}"]
    expected = sorted(
        (r for s in streams for r in store.read_stream(s)), key=lambda r: r.global_position
    )
    assert [(e.position, e.stream_id, e.version, e.type) for e in entries] == [
        (r.global_position, r.stream_id, r.stream_version, r.type) for r in expected
    ]
    by_type = {e.type: e for e in entries}
    assert by_type["lease.granted"].summary.startswith(
        f"lease {lease.lease_id} granted to worker w1 until"
    )
    assert by_type["lease.granted"].step_key == "a"
    assert by_type["attempt.succeeded"].actor == "worker:w1"
    assert "a -> " not in by_type["step.created"].summary
    assert audit.timeline(store, run_id, mutations=False) == [
        e for e in entries if e.type != "step_run.mutated"
    ]

    history = audit.step_history(store, run_id, "a")
    assert history and all(e.step_key == "a" for e in history)
    assert {e.stream_id for e in history} == set(streams)
    assert [e.type for e in history if e.stream_id.startswith("run-")] == [
        "step.created",
        "attempt.claimed",
        "attempt.starting",
        "step.running",
        "attempt.running",
        "attempt.succeeded",
        "step.succeeded",
    ]
    assert [e.type for e in audit.step_history(store, run_id, "d")] == [
        "step.created",
        "step_run.mutated",
    ]
    with pytest.raises(NotFound, match="no step 'zz'"):
        audit.step_history(store, run_id, "zz")


# --- following the log ----------------------------------------------------------------

WRITERS = 4
EVENTS_PER_WRITER = 60


def test_follow_sees_every_event_exactly_once_under_concurrent_writers(store_url):
    stores = [eventstore.open_store(store_url) for _ in range(WRITERS + 1)]
    reader, writers = stores[0], stores[1:]
    deadline = time.monotonic() + 60

    def write(index: int, writer) -> None:
        for version in range(EVENTS_PER_WRITER):
            event = NewEvent(f"w{index}-e{version}", "test.event", {"n": version}, {"at_ms": T0})
            writer.append([StreamAppend(f"run-test{index}", version, (event,))])

    threads = [threading.Thread(target=write, args=(i, w)) for i, w in enumerate(writers)]
    try:
        for thread in threads:
            thread.start()
        seen = list(
            audit.follow(
                reader,
                poll_interval_s=0.005,
                stop=lambda: time.monotonic() > deadline or not any(t.is_alive() for t in threads),
            )
        )
        ids = [r.event_id for r in seen]
        assert len(ids) == len(set(ids)) == WRITERS * EVENTS_PER_WRITER
        positions = [r.global_position for r in seen]
        assert positions == sorted(positions)
    finally:
        for thread in threads:
            thread.join(timeout=30)
        for opened in stores:
            opened.close()
