"""The caller-driven cycle through the public API, on both stores (SPEC §6–7, §10)."""

from __future__ import annotations

import threading

import pykka
import pytest

import qlflow
from actors.workflow import WorkflowActor
from qlflow.errors import FenceError, NotFound
from tests.cycle.helpers import (
    DIAMOND,
    T0,
    chain,
    drive,
    fan_out,
    manifest,
    record_intent_only,
    statuses,
    work,
)


@pytest.fixture
def rt(store_url):
    runtime = qlflow.open(store_url)
    yield runtime
    runtime.close()


def start(rt, steps, *, timeout_ms=None, now_ms=T0, key="k1"):
    rt.publish(manifest(steps, timeout_ms=timeout_ms), now_ms=now_ms)
    return rt.start("demo", "flow", admission_key=key, now_ms=now_ms).run_id


def test_chain_runs_in_order_and_succeeds(rt):
    run_id = start(rt, chain(5))
    now = T0
    order = []
    for _ in range(20):
        rt.cycle(now_ms=now)
        leases = rt.lease_attempts("w1", limit=10, now_ms=now)
        assert len(leases) <= 1, "a chain never has two steps ready at once"
        for lease in leases:
            order.append(lease.step_key)
            rt.mark_running(lease, now_ms=now)
            rt.complete(lease, "succeeded", now_ms=now)
        now += 10
    run = rt.get_run(run_id)
    assert order == [key for key, _ in chain(5)]
    assert run.status == "succeeded"
    assert set(statuses(rt, run_id).values()) == {"succeeded"}


def test_diamond_runs_both_branches_and_joins(rt):
    run_id = start(rt, DIAMOND)
    drive(rt, T0)
    run = rt.get_run(run_id)
    assert run.status == "succeeded"
    assert [a.status for a in run.steps["d"].attempts] == ["succeeded"]


def test_wide_fan_out_leases_every_leaf_at_once(rt):
    run_id = start(rt, fan_out(100))
    rt.cycle(now_ms=T0)
    assert work(rt, T0) == 1  # the root
    rt.cycle(now_ms=T0 + 1)
    assert work(rt, T0 + 1) == 100
    rt.cycle(now_ms=T0 + 2)
    assert rt.get_run(run_id).status == "succeeded"


def test_failure_skips_every_descendant_and_fails_the_run(rt):
    run_id = start(rt, [*DIAMOND, ("e", ["d"]), ("f", [])])
    drive(rt, T0, outcomes={"c": "failed"})
    run = rt.get_run(run_id)
    assert run.status == "failed"
    assert run.error_code == "workflow_step_failed"
    got = statuses(rt, run_id)
    assert got == {
        "a": "succeeded",
        "b": "succeeded",
        "c": "failed",
        "d": "skipped",
        "e": "skipped",
        "f": "succeeded",
    }
    assert run.steps["c"].result_code == "execution_failed"
    assert run.steps["e"].result_code == "dependency_not_succeeded"


def test_cancel_before_any_lease_ends_every_step_cancelled_in_its_own_commit(rt):
    run_id = start(rt, DIAMOND)
    # the start claimed the root; nobody leased it, so the cancel ends the Run at once
    assert [a.status for a in rt.get_run(run_id).steps["a"].attempts] == ["claimed"]
    assert rt.cancel(run_id, now_ms=T0) is True
    run = rt.get_run(run_id)
    assert run.status == "cancelled"
    assert run.cancel_reason == "user"
    assert set(statuses(rt, run_id).values()) == {"cancelled"}
    assert [a.status for a in run.steps["a"].attempts] == ["cancelled"]
    assert all(not run.steps[key].attempts for key in "bcd")
    assert not rt.cycle(now_ms=T0 + 1).changed  # nothing left for the cycle
    assert rt.cancel(run_id, now_ms=T0 + 2) is False
    assert rt.lease_attempts("w1", now_ms=T0 + 3) == []


def test_the_cycle_cancels_a_claim_left_by_a_recorded_intent(rt):
    run_id = start(rt, DIAMOND)
    # an intent recorded without its convergence (as a cancel finding the Attempt's
    # lock held records it): the cycle ends the unleased claim
    record_intent_only(rt, run_id, T0 + 1)
    result = rt.cycle(now_ms=T0 + 2)
    run = rt.get_run(run_id)
    assert run.status == "cancelled"
    assert [a.status for a in run.steps["a"].attempts] == ["cancelled"]
    assert result.cancellation.settled_attempts == 1
    assert rt.lease_attempts("w1", now_ms=T0 + 3) == []


def test_cancel_with_leased_unstarted_attempt_blocks_until_completion(rt):
    run_id = start(rt, DIAMOND)
    (lease,) = rt.lease_attempts("w1", now_ms=T0)
    rt.cancel(run_id, now_ms=T0 + 1)
    result = rt.cycle(now_ms=T0 + 2)
    run = rt.get_run(run_id)
    assert run.status == "running", "a leased Attempt holds authority: no fake terminal"
    assert run.steps["b"].status == "cancelled"  # ended by the cancel itself
    assert run.steps["a"].status == "ready"
    assert result.cancellation.scanned == 0  # blocked: no work until the worker reports
    # the worker still may start (it may already have spawned) and learns to stop
    rt.mark_running(lease, now_ms=T0 + 3)
    renewed = rt.renew(lease, now_ms=T0 + 4)
    assert renewed.stop_requested is True
    assert rt.complete(renewed, "succeeded", now_ms=T0 + 5) == "cancelled"
    rt.cycle(now_ms=T0 + 6)
    run = rt.get_run(run_id)
    assert run.status == "cancelled"
    assert run.steps["a"].status == "cancelled"
    assert run.steps["a"].result_code == "execution_cancelled"


def test_cancel_while_running_maps_any_exit_to_cancelled(rt):
    # SPEC §6: under cancel intent any outcome is recorded as cancelled
    run_id = start(rt, [("a", []), ("b", [])])
    rt.cycle(now_ms=T0)
    leases = {lease.step_key: lease for lease in rt.lease_attempts("w1", limit=2, now_ms=T0)}
    for lease in leases.values():
        rt.mark_running(lease, now_ms=T0)
    rt.cancel(run_id, now_ms=T0 + 1)
    # only running steps are left: the Run waits for its workers and costs no scan
    assert rt.cycle(now_ms=T0 + 2).cancellation.scanned == 0
    assert rt.get_run(run_id).status == "running"
    assert statuses(rt, run_id) == {"a": "running", "b": "running"}
    assert rt.complete(leases["a"], "succeeded", now_ms=T0 + 3) == "cancelled"
    assert rt.complete(leases["b"], "failed", now_ms=T0 + 3) == "cancelled"
    rt.cycle(now_ms=T0 + 4)
    run = rt.get_run(run_id)
    assert run.status == "cancelled"
    assert statuses(rt, run_id) == {"a": "cancelled", "b": "cancelled"}


def test_timeout_with_mixed_states(rt):
    run_id = start(rt, [*DIAMOND, ("x", [])], timeout_ms=1_000)
    rt.cycle(now_ms=T0)
    leases = {lease.step_key: lease for lease in rt.lease_attempts("w1", limit=5, now_ms=T0)}
    rt.mark_running(leases["a"], now_ms=T0)
    rt.complete(leases["a"], "succeeded", now_ms=T0 + 1)
    rt.mark_running(leases["x"], now_ms=T0)  # x still runs at the deadline
    rt.cycle(now_ms=T0 + 2)  # b and c claimed
    result = rt.cycle(now_ms=T0 + 1_000)
    run = rt.get_run(run_id)
    assert run.cancel_reason == "timeout"
    assert run.cancel_requested_at_ms == T0 + 1_000
    assert run.status == "running"
    assert result.cancellation.blocked == 1
    got = statuses(rt, run_id)
    assert got["b"] == got["c"] == "timed_out"
    assert got["d"] == "cancelled"  # pending: it never executed
    assert rt.complete(leases["x"], "succeeded", now_ms=T0 + 1_001) == "timed_out"
    rt.cycle(now_ms=T0 + 1_002)
    run = rt.get_run(run_id)
    assert run.status == "timed_out"
    assert run.error_code == "EXECUTION_TIMED_OUT"


def test_lease_expiry_before_start_requeues_with_a_new_attempt(rt):
    run_id = start(rt, [("a", [])])
    rt.cycle(now_ms=T0)
    (lease,) = rt.lease_attempts("w1", ttl_ms=5_000, now_ms=T0)
    rt.cycle(now_ms=T0 + 5_000)  # recovery: lost, requeued; admission: a new claim
    attempts = rt.get_run(run_id).steps["a"].attempts
    assert [a.status for a in attempts] == ["lost", "claimed"]
    with pytest.raises(FenceError):
        rt.mark_running(lease, now_ms=T0 + 5_001)
    drive(rt, T0 + 5_002)
    assert rt.get_run(run_id).status == "succeeded"


def test_lease_expiry_after_start_fails_the_step_and_never_retries(rt):
    run_id = start(rt, [("a", []), ("b", ["a"])])
    rt.cycle(now_ms=T0)
    (lease,) = rt.lease_attempts("w1", ttl_ms=5_000, now_ms=T0)
    rt.mark_running(lease, now_ms=T0)
    rt.cycle(now_ms=T0 + 5_000)
    run = rt.get_run(run_id)
    assert [a.status for a in run.steps["a"].attempts] == ["lost"]
    assert run.steps["a"].status == "failed"
    assert run.steps["a"].result_code == "lease_expired"
    assert run.steps["b"].status == "skipped"
    assert run.status == "failed"
    with pytest.raises(FenceError):
        rt.complete(lease, "succeeded", now_ms=T0 + 5_001)


def test_partial_convergence_over_several_cycles(rt):
    run_id = start(rt, fan_out(3))
    rt.cycle(now_ms=T0)
    work(rt, T0)
    rt.cycle(now_ms=T0 + 1)
    leases = rt.lease_attempts("w1", limit=3, now_ms=T0 + 1)
    for lease in leases:
        rt.mark_running(lease, now_ms=T0 + 1)
    rt.cancel(run_id, now_ms=T0 + 2)
    for i, lease in enumerate(leases):
        rt.cycle(now_ms=T0 + 3 + i)
        assert rt.get_run(run_id).status == "running"
        rt.complete(lease, "succeeded", now_ms=T0 + 3 + i)
    rt.cycle(now_ms=T0 + 10)
    assert rt.get_run(run_id).status == "cancelled"


def test_repeated_cycles_change_nothing(rt):
    run_id = start(rt, DIAMOND)
    drive(rt, T0)
    position = rt.store.head_position()
    for i in range(3):
        result = rt.cycle(now_ms=T0 + 100_000 + i)
        assert result.changed == 0
    assert rt.store.head_position() == position
    assert rt.get_run(run_id).status == "succeeded"


def test_cancel_twice_and_after_terminal_are_no_ops(rt):
    run_id = start(rt, DIAMOND)
    assert rt.cancel(run_id, now_ms=T0) is True
    assert rt.cancel(run_id, reason="policy", now_ms=T0 + 1) is False
    rt.cycle(now_ms=T0 + 2)
    assert rt.get_run(run_id).cancel_reason == "user"
    position = rt.store.head_position()
    assert rt.cancel(run_id, now_ms=T0 + 3) is False
    assert rt.store.head_position() == position


def test_late_completion_after_terminal_is_refused(rt):
    run_id = start(rt, [("a", [])], timeout_ms=10_000)
    rt.cycle(now_ms=T0)
    (lease,) = rt.lease_attempts("w1", ttl_ms=5_000, now_ms=T0)
    rt.mark_running(lease, now_ms=T0)
    rt.cycle(now_ms=T0 + 20_000)  # lease expired, deadline passed
    assert rt.get_run(run_id).status == "timed_out"
    position = rt.store.head_position()
    with pytest.raises(FenceError):
        rt.complete(lease, "succeeded", now_ms=T0 + 20_001)
    assert rt.store.head_position() == position


def test_unknown_run_is_not_found(rt):
    with pytest.raises(NotFound):
        rt.cancel("nope", now_ms=T0)
    with pytest.raises(NotFound):
        rt.get_run("nope")


def test_no_actor_or_thread_outlives_a_cycle(rt):
    start(rt, fan_out(40))
    baseline = threading.active_count()
    now = T0
    for _ in range(4):
        rt.cycle(now_ms=now)
        assert pykka.ActorRegistry.get_by_class(WorkflowActor) == []
        assert threading.active_count() <= baseline
        work(rt, now)
        now += 10
