"""Values the domain refuses through the public API, on both stores: a non-finite
number in an output, a worker write from before its lease's last grant or renewal,
and a lease that would expire past the latest instant. Each is an InvalidInput
naming the field and the rule, and writes nothing."""

from __future__ import annotations

import math

import pytest

import qlflow
from qlflow.arguments import MAX_MS
from qlflow.errors import InvalidInput
from tests.cycle.helpers import T0, manifest


@pytest.fixture
def rt(store_url):
    with qlflow.open(store_url) as runtime:
        runtime.publish(manifest([("a", [])]), now_ms=T0)
        yield runtime


def _running_lease(rt, at_ms: int = T0):
    run_id = rt.start("demo", "flow", now_ms=at_ms).run_id
    rt.cycle(now_ms=at_ms + 1)
    [lease] = rt.lease_attempts("w1", now_ms=at_ms + 2)
    return run_id, rt.mark_running(lease, now_ms=at_ms + 3)


@pytest.mark.parametrize(
    "output",
    [
        {"score": math.nan},
        {"score": math.inf},
        {"nested": [1, {"deep": -math.inf}]},
        {"list": [0.5, float("nan")]},
    ],
)
def test_a_non_finite_number_anywhere_in_an_output_is_refused_and_writes_nothing(rt, output):
    run_id, lease = _running_lease(rt)
    before = rt.store.head_position()
    with pytest.raises(InvalidInput) as refused:
        rt.complete(lease, "succeeded", output=output, now_ms=T0 + 4)
    assert (refused.value.field, refused.value.rule) == ("output", "finite_number")
    assert rt.store.head_position() == before
    assert rt.get_run(run_id).steps["a"].attempts[0].status == "running"


def test_a_finite_output_completes_and_its_identical_retry_is_a_replay(rt):
    run_id, lease = _running_lease(rt)
    output = {"score": 0.25, "values": [1.5, -2.0], "none": None}
    assert rt.complete(lease, "succeeded", output=output, now_ms=T0 + 4) == "succeeded"
    after = rt.store.head_position()
    # the response was lost, say: the same call again is answered, not refused
    assert rt.complete(lease, "succeeded", output=dict(output), now_ms=T0 + 5) == "succeeded"
    assert rt.store.head_position() == after
    assert rt.get_run(run_id).steps["a"].attempts[0].output == output


def test_a_worker_write_from_before_the_lease_was_granted_is_refused(rt):
    run_id = rt.start("demo", "flow", now_ms=T0).run_id
    rt.cycle(now_ms=T0 + 1)
    [lease] = rt.lease_attempts("w1", ttl_ms=30_000, now_ms=T0 + 1_000)
    before = rt.store.head_position()
    for write in (
        lambda: rt.renew(lease, ttl_ms=5_000, now_ms=T0 + 10),
        lambda: rt.mark_starting(lease, now_ms=T0 + 999),
        lambda: rt.mark_running(lease, now_ms=T0 + 500),
    ):
        with pytest.raises(InvalidInput) as refused:
            write()
        assert (refused.value.field, refused.value.rule) == ("now_ms", "before_lease")
    assert rt.store.head_position() == before
    view = rt.get_run(run_id).steps["a"].attempts[0]
    assert (view.status, view.expires_at_ms) == ("claimed", lease.expires_at_ms)


def test_a_renewal_cannot_move_the_expiry_back_and_a_right_clock_cycle_keeps_the_step(rt):
    run_id, lease = _running_lease(rt)
    renewed = rt.renew(lease, ttl_ms=30_000, now_ms=T0 + 20_000)
    before = rt.store.head_position()
    with pytest.raises(InvalidInput) as refused:
        rt.renew(renewed, ttl_ms=5_000, now_ms=T0 + 10_000)  # would expire at T0 + 15 s
    assert (refused.value.field, refused.value.rule) == ("now_ms", "before_lease")
    with pytest.raises(InvalidInput):
        rt.complete(renewed, "succeeded", now_ms=T0 + 19_999)
    assert rt.store.head_position() == before
    # the lease still runs to T0 + 50 s: a cycle at T0 + 40 s leaves the step running
    rt.cycle(now_ms=T0 + 40_000)
    step = rt.get_run(run_id).steps["a"]
    assert (step.status, step.attempts[0].expires_at_ms) == ("running", T0 + 50_000)
    assert rt.complete(renewed, "succeeded", now_ms=T0 + 40_001) == "succeeded"


def test_a_lease_that_would_expire_past_the_latest_instant_is_refused(rt):
    rt.start("demo", "flow", now_ms=T0)
    rt.cycle(now_ms=T0 + 1)
    before = rt.store.head_position()
    with pytest.raises(InvalidInput) as refused:
        rt.lease_attempts("w1", ttl_ms=30_000, now_ms=MAX_MS - 29_999)
    assert (refused.value.field, refused.value.rule) == ("ttl_ms", "expiry_past_ceiling")
    assert rt.store.head_position() == before
    # the last lease that can still expire is granted
    [lease] = rt.lease_attempts("w1", ttl_ms=30_000, now_ms=MAX_MS - 30_000)
    assert lease.expires_at_ms == MAX_MS
    granted = rt.store.head_position()
    with pytest.raises(InvalidInput) as renewal:
        rt.renew(lease, ttl_ms=30_000, now_ms=MAX_MS - 20_000)
    assert (renewal.value.field, renewal.value.rule) == ("ttl_ms", "expiry_past_ceiling")
    assert rt.store.head_position() == granted
